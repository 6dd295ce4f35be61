"""Benchmark: Triton Python-backend models (``TritonPythonModel``) on fastoip's worker processes, in one run.

1. ``cpu2ms``: about 2 ms of pure-Python work per request, ``instance_group { count: 1 }`` vs ``count: 2``
   (two worker processes), closed loop at c=8 over gRPC.  The server is NOT pinned to one core here (its
   workers inherit its CPU set and need both); the load generator is pinned to CPU 1.  While count:2 runs,
   a thread samples the server's gRPC ``ServerLive`` every 50 ms (max and p99 latency).
2. ``tiny``: a 16 x FP32 identity, hosted in worker processes (default) vs in the server process
   (``parameters { key: "hosting" value: { string_value: "in_process" } }``), c=16, server on CPU 0 and load
   generator on CPU 1 (SERVER_CPUS / CLIENT_CPUS).
3. ``large``: the same for a 602 KB tensor (1 x 3 x 224 x 224 FP32).
4. ``--triton``: an add_sub model (two FP32 [4] inputs, sum and difference; ``instance_group count: 1``) on
   fastoip and on real Triton (``tritonserver`` and its Python backend from the nvidia-pytriton wheel, through the
   peers' ``serve_repo.sh``; needs the lab: ``PEERS_WORK``, default ``benchmarks/.work``), the same repository
   files, c=16 over gRPC; both servers on CPU 0 (their Python processes inherit it), the load generator on CPU 1.

Run: ``PYTHONPATH=src python benchmarks/bench_triton_python.py [--window-ms 3000] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _harness import Fastoip, fastoip_bench, free_port, markdown_table  # noqa: E402

CPU2MS = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def spin(seconds):
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:
            n += 1
        return n

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                spin(0.002)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            return out
"""

IDENTITY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests
            ]
"""


ADD_SUB = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.dtype = pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

        def execute(self, requests):
            out = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                    pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype))]))
            return out
"""

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def against_triton(window_ms: int, rounds: int) -> dict:
    """add_sub on fastoip, then on real Triton, from the same repository files."""
    import signal
    import subprocess

    import tritonclient.grpc as grpcclient

    import _harness

    peers = Path(__file__).resolve().parent.parent.parent.parent / "shared" / "peers"
    script = Path(os.environ.get("FASTOIP_PEERS_DIR", str(peers))) / "peers" / "tritonserver" / "serve_repo.sh"
    work = os.environ.get("PEERS_WORK", str(Path(__file__).resolve().parent / ".work"))
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
        grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
        log = open(root / "triton.log", "w")
        triton = subprocess.Popen(
            ["taskset", "-c", _harness.SERVER_CPUS, "bash", str(script), str(root), "--grpc-port", str(grpc_port),
             "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
            env={**os.environ, "PEERS_WORK": work}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.is_model_ready("add_sub"):
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline or triton.poll() is not None:
                    raise RuntimeError("Triton did not start: " + (root / "triton.log").read_text()[-2000:])
                time.sleep(0.5)
            with Fastoip(root) as server:  # both servers up, measured in turn
                out.update(alternate({
                    "fastoip": lambda: point(f"grpc://{server.grpc}", "add_sub", 16, window_ms, server_pid(server)),
                    "triton": lambda: point(f"grpc://127.0.0.1:{grpc_port}", "add_sub", 16, window_ms, triton.pid),
                }, rounds))
        finally:
            if triton.poll() is None:
                os.killpg(triton.pid, signal.SIGTERM)
                try:
                    triton.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(triton.pid, signal.SIGKILL)
            log.close()
    out["ratio"] = round(out["fastoip"]["req_per_s"] / out["triton"]["req_per_s"], 2)
    out["p99_ratio"] = round(out["fastoip"]["p99_ms"] / out["triton"]["p99_ms"], 2)
    return out


def config(dims: str, count: int = 1, hosting: str = "process") -> str:
    return textwrap.dedent(f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        parameters {{ key: "hosting" value: {{ string_value: "{hosting}" }} }}
    """)


def write(root: Path, name: str, source: str, cfg: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(cfg)


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every process below it (a server and its Python workers)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu.get(current, 0.0)
        todo += children.get(current, [])
    return total


def _success_count(url: str, model: str) -> int:
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(url.removeprefix("grpc://")).get_inference_statistics(model)
    return sum(m.inference_stats.success.count for m in stats.model_stats)


def point(url: str, model: str, concurrency: int, window_ms: int, pid: int = 0) -> dict:
    """One closed-loop measurement; with ``pid`` (the server's), also the CPU its process tree spent per request
    it answered meanwhile (the server's own statistics count them): steadier than req/s on a shared machine."""
    if pid:
        cpu0, count0 = _tree_cpu_s(pid), _success_count(url, model)
    result = fastoip_bench(
        url, "-m", model, "--concurrency-range", f"{concurrency}:{concurrency}:1",
        "-p", str(window_ms), "--max-trials", "2", "--warmup-ms", "500",
    )
    row = result["results"][0]
    extra = {}
    if pid:
        answered = _success_count(url, model) - count0
        extra["server_cpu_us_per_req"] = round((_tree_cpu_s(pid) - cpu0) / max(1, answered) * 1e6, 1)
    return {
        **extra,
        "req_per_s": round(row["throughput_req_per_s"], 1),
        "p50_ms": round((row["latency_us"]["p50"] or 0) / 1000, 3),
        "p99_ms": round((row["latency_us"]["p99"] or 0) / 1000, 3),
        "errors": sum(row["errors"].values()),
        "other_cpu_percent": row.get("other_cpu_percent"),
    }


def server_pid(server: Fastoip) -> int:
    assert server.proc is not None
    return server.proc.pid


def alternate(points: dict, rounds: int) -> dict:
    """Measure each named point in turn, ``rounds`` times (A B A B ...: the shared machine's load drifts
    within a run); per name the median round by throughput, and every round's req/s."""
    seen: dict[str, list[dict]] = {name: [] for name in points}
    for _ in range(rounds):
        for name, measure in points.items():
            seen[name].append(measure())
    out = {}
    for name, rows in seen.items():
        ordered = sorted(rows, key=lambda r: r["req_per_s"])
        out[name] = {**ordered[len(ordered) // 2], "rounds_req_per_s": [r["req_per_s"] for r in rows]}
        cpu = sorted(r["server_cpu_us_per_req"] for r in rows if "server_cpu_us_per_req" in r)
        if cpu:
            out[name]["rounds_server_cpu_us_per_req"] = [r.get("server_cpu_us_per_req") for r in rows]
            out[name]["median_server_cpu_us_per_req"] = cpu[len(cpu) // 2]
    return out


def probe_liveness(url: str, stop: threading.Event, samples: list[float]) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    while not stop.is_set():
        started = time.perf_counter()
        client.is_server_live()
        samples.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds per comparison (median reported)")
    parser.add_argument("--triton", action="store_true", help="also add_sub on fastoip vs real Triton")
    parser.add_argument("--only-triton", action="store_true", help="only the add_sub comparison")
    parser.add_argument("--points", default="cpu2ms,tiny,large", help="which of cpu2ms, tiny, large to measure")
    args = parser.parse_args()
    points = set(args.points.split(","))
    results: dict = {}
    if args.triton or args.only_triton:
        results["add_sub"] = against_triton(args.window_ms, args.rounds)
        print(json.dumps({"add_sub": results["add_sub"]}), flush=True)
        if args.only_triton:
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
            return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, "cpu2ms_1", CPU2MS, config("16", count=1))
        write(root, "cpu2ms_2", CPU2MS, config("16", count=2))
        write(root, "tiny_process", IDENTITY, config("16"))
        write(root, "tiny_in_process", IDENTITY, config("16", hosting="in_process"))
        write(root, "large_process", IDENTITY, config("1, 3, 224, 224"))
        write(root, "large_in_process", IDENTITY, config("1, 3, 224, 224", hosting="in_process"))

        if "cpu2ms" in points:
            # 1. count:1 vs count:2, the server on both cores.
            saved = os.environ.get("SERVER_CPUS")
            os.environ["SERVER_CPUS"] = "0-1"
            import _harness

            _harness.SERVER_CPUS = "0-1"
            with Fastoip(root) as server:
                url = f"grpc://{server.grpc}"
                stop = threading.Event()
                samples: list[float] = []

                def with_probe() -> dict:
                    prober = threading.Thread(target=probe_liveness, args=(server.grpc, stop, samples), daemon=True)
                    stop.clear()
                    prober.start()
                    try:
                        return point(url, "cpu2ms_2", 8, args.window_ms)
                    finally:
                        stop.set()
                        prober.join()

                both = alternate({"count1": lambda: point(url, "cpu2ms_1", 8, args.window_ms), "count2": with_probe},
                                 args.rounds)
                one, two = both["count1"], both["count2"]
            samples.sort()
            results["cpu2ms"] = {
                "count1": one,
                "count2": two,
                "ratio": round(two["req_per_s"] / one["req_per_s"], 2),
                "live_ms_max": round(samples[-1], 2) if samples else None,
                "live_ms_p99": round(samples[int(len(samples) * 0.99) - 1], 2) if samples else None,
                "live_samples": len(samples),
            }
            print(json.dumps(results["cpu2ms"]), flush=True)
            _harness.SERVER_CPUS = saved or "0"
            if saved is None:
                os.environ.pop("SERVER_CPUS", None)
            else:
                os.environ["SERVER_CPUS"] = saved

        # 2./3. process vs in-process hosting, the server on CPU 0.
        with Fastoip(root) as server:
            url = f"grpc://{server.grpc}"
            for size in [p for p in ("tiny", "large") if p in points]:
                pair = alternate({
                    "process": lambda size=size: point(url, f"{size}_process", 16, args.window_ms, server_pid(server)),
                    "in_process": lambda size=size: point(
                        url, f"{size}_in_process", 16, args.window_ms, server_pid(server)
                    ),
                }, args.rounds)
                process, in_process = pair["process"], pair["in_process"]
                results[size] = {
                    "process": process,
                    "in_process": in_process,
                    "throughput_ratio": round(process["req_per_s"] / in_process["req_per_s"], 2),
                    "p99_ratio": round(process["p99_ms"] / in_process["p99_ms"], 2) if in_process["p99_ms"] else None,
                }
                print(json.dumps({size: results[size]}), flush=True)

    rows = []
    if "cpu2ms" in results:
        rows = [
            ["cpu2ms count:1 (c=8)", results["cpu2ms"]["count1"]["req_per_s"], results["cpu2ms"]["count1"]["p99_ms"],
             ""],
            ["cpu2ms count:2 (c=8)", results["cpu2ms"]["count2"]["req_per_s"], results["cpu2ms"]["count2"]["p99_ms"],
             f"{results['cpu2ms']['ratio']}x count:1"],
        ]
    for size in [p for p in ("tiny", "large") if p in results]:
        r = results[size]
        rows.append([f"{size} in-process (c=16)", r["in_process"]["req_per_s"], r["in_process"]["p99_ms"], ""])
        rows.append([f"{size} process (c=16)", r["process"]["req_per_s"], r["process"]["p99_ms"],
                     f"{r['throughput_ratio']}x in-process, p99 {r['p99_ratio']}x"])
    print(markdown_table(["point", "req/s", "p99 ms", "ratio"], rows))
    if "cpu2ms" in results:
        print(f"gRPC ServerLive during count:2: max {results['cpu2ms']['live_ms_max']} ms, "
              f"p99 {results['cpu2ms']['live_ms_p99']} ms over {results['cpu2ms']['live_samples']} probes")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

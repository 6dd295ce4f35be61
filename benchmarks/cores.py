#!/usr/bin/env python3
"""fastoip beside the C++ grpc++ server on many cores (issue 42): `make gpu-check`'s `cores` step.

  python benchmarks/cores.py --out DIR [--cpp-server PATH] [--conc 256] [--client-threads 8] [--duration 10]

Points, one server at a time, each pinned to --server-cpus while h2load (--client-threads threads, --conc
connections x 1 stream) runs pinned to --client-cpus:
  - native `simple` (INT32 [1,16] add/sub, batch 1) on fastoip (one process, the native gRPC frontend);
  - the same bytes on the C++ grpc++ server (benchmarks/peers' grpc_cpp: a pre-built response, so it measures
    the frontend alone) with each of --cpp-threads completion-queue threads (default 1 and 8);
  - `mlp` (FP32 [1,256] -> 1024 -> 1024 -> 10) on fastoip with its dynamic batcher, on the CPU EP.
For each point: requests/s, p50/p99 latency (h2load's log), the CPU seconds the server's process group and h2load
used during the window (and so the cores each kept busy), every answer counted as h2load saw it, and a probe first
(the exact bytes h2load sends, the answer compared with onnxruntime's).  Writes cores.json and cores.md to --out.

It needs: h2load (nghttp2-client), onnxruntime, grpcio, and fastoip's sources (this checkout) built with the
native frontend; the C++ server is optional (its points are skipped, with the reason, when it is missing).
`--dry-run` shrinks every number so that the whole step runs on a 2-core machine in about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _harness import free_port  # noqa: E402
from fastoip._proto import grpc_service_pb2 as pb  # noqa: E402
from fastoip.demo import write_repository  # noqa: E402
from fastoip.launcher import ChildProcess, parse_cpu_list  # noqa: E402

GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The request of each model (batch 1): name -> [(input name, datatype, shape, array)].
INPUTS: dict[str, list[tuple[str, str, list[int], np.ndarray]]] = {
    "simple": [("INPUT0", "INT32", [1, 16], np.arange(16, dtype=np.int32).reshape(1, 16)),
               ("INPUT1", "INT32", [1, 16], np.ones((1, 16), dtype=np.int32))],
    "mlp": [("INPUT0", "FP32", [1, 256], np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256))],
}


def log(message: str) -> None:
    print(f"cores: {message}", flush=True)


# -- payloads ------------------------------------------------------------------------------------------
def expected_outputs(repo: Path, model: str) -> dict[str, np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {name: array for name, _, _, array in INPUTS[model]}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def write_payloads(repo: Path, folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """For each model: <model>.b1.pb (the request), .grpc (gRPC-framed, h2load's body); for simple also
    .b1.resp.pb (the C++ server's canned answer).  Returns the expected outputs."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {}
    for model, inputs in INPUTS.items():
        request = pb.ModelInferRequest(model_name=model)
        for name, datatype, shape, array in inputs:
            request.inputs.add(name=name, datatype=datatype, shape=shape)
            request.raw_input_contents.append(array.tobytes())
        body = request.SerializeToString()
        (folder / f"{model}.b1.pb").write_bytes(body)
        (folder / f"{model}.b1.grpc").write_bytes(b"\0" + len(body).to_bytes(4, "big") + body)
        expected[model] = expected_outputs(repo, model)
        if model == "simple":
            response = pb.ModelInferResponse(model_name=model, model_version="1")
            for name, value in expected[model].items():
                response.outputs.add(name=name, datatype="INT32", shape=list(value.shape))
                response.raw_output_contents.append(value.tobytes())
            (folder / f"{model}.b1.resp.pb").write_bytes(response.SerializeToString())
    return expected


def probe(port: int, model: str, payloads: Path, expected: dict[str, np.ndarray]) -> str | None:
    """One call with h2load's exact bytes; None when the answer is right, else what is wrong."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: Any = channel.unary_unary(GRPC_PATH, request_serializer=None, response_deserializer=None)
        try:
            raw = call((payloads / f"{model}.b1.pb").read_bytes(), timeout=30)
        except grpc.RpcError as exc:
            return f"probe failed: {exc.code()} {exc.details()}"
    response = pb.ModelInferResponse.FromString(raw)
    dtypes = {"INT32": np.int32, "FP32": np.float32}
    for index, output in enumerate(response.outputs):
        got = np.frombuffer(response.raw_output_contents[index], dtypes[output.datatype]).reshape(tuple(output.shape))
        want = expected.get(output.name)
        if want is None or got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            return f"probe: output {output.name} differs from onnxruntime's"
    return None if response.outputs else "probe: no outputs"


# -- load ------------------------------------------------------------------------------------------------
def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_h2load(args: argparse.Namespace, port: int, body: Path, duration: float, conc: int, log_file: Path) -> dict:
    log_file.unlink(missing_ok=True)  # h2load appends
    pin = ["taskset", "-c", args.client_cpus] if shutil.which("taskset") else []  # (unpinned: said in the argv)
    argv = [*pin, args.h2load, "-t", str(min(args.client_threads, conc)),
            "-c", str(conc), "-m", "1", "-D", str(max(1, int(duration))), "-d", str(body),
            "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", str(log_file),
            f"http://127.0.0.1:{port}{GRPC_PATH}"]
    before = children_cpu()
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, env=args.client_env)
    except subprocess.TimeoutExpired:
        return {"error": "h2load did not finish in time", "argv": " ".join(argv)}
    result: dict[str, Any] = {"argv": " ".join(argv), "wall_s": round(time.monotonic() - started, 2),
                              "client_cpu_s": round(children_cpu() - before, 2)}
    out = done.stdout
    finished = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", out)
    counts = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                       r"(\d+) errored, (\d+) timeout", out)
    if not (finished and counts):
        result["error"] = "h2load output not understood: " + (out[-400:] + done.stderr[-400:]).strip()
        return result
    result.update(rps=float(finished.group(2)), done=int(counts.group(3)), succeeded=int(counts.group(4)),
                  failed=int(counts.group(5)), errored=int(counts.group(6)))
    latencies = []
    try:
        for line in log_file.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 3 and fields[1] == "200":
                latencies.append(int(fields[2]))
    except OSError:
        pass
    if latencies:
        result.update(p50_us=float(np.percentile(latencies, 50)), p99_us=float(np.percentile(latencies, 99)))
    return result


def wait_port(port: int, child: ChildProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError("the server exited: " + child.output(20))
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the server did not listen on {port} within {timeout:.0f} s")


def measure(args: argparse.Namespace, point: dict, argv: list[str], env: dict[str, str], payloads: Path,
            expected: dict, port: int, work: Path) -> dict:
    """Start the server, probe, warm up, measure, stop; the point's figures."""
    log(f"{point['name']}: starting ({' '.join(argv[:3])} ...)")
    child = ChildProcess(argv, want=(), env=env, cpus=parse_cpu_list(args.server_cpus),
                         log_path=work / f"{point['name']}.log", keep_lines=200)
    child.start()
    try:
        try:
            wait_port(port, child, args.start_timeout)
        except RuntimeError as exc:  # (the native frontend not built, a library missing): this point says why
            return {**point, "error": str(exc)[-600:]}
        problem = probe(port, point["model"], payloads, expected[point["model"]])
        if problem:
            return {**point, "error": problem}
        body = payloads / f"{point['model']}.b1.grpc"
        run_h2load(args, port, body, args.warmup, min(args.conc, 64), work / "h2load-warmup.log")
        server_before = child.cpu_seconds(group=True) or 0.0
        result = run_h2load(args, port, body, args.duration, args.conc, work / "h2load.log")
        server_cpu = (child.cpu_seconds(group=True) or 0.0) - server_before
        result["server_cpu_s"] = round(server_cpu, 2)
        if "wall_s" in result and result["wall_s"]:
            result["server_cores"] = round(server_cpu / result["wall_s"], 2)
            result["client_cores"] = round(result["client_cpu_s"] / result["wall_s"], 2)
        if result.get("done") and result.get("rps"):
            result["server_cpu_us_per_req"] = round(server_cpu / result["done"] * 1e6, 1)
        if not child.alive():
            result["error"] = "the server died under load: " + child.output(20)
        return {**point, **result}
    finally:
        child.stop(10, first_signal=signal.SIGINT, group=True)


# -- the step ------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cpp-server", default="", help="the built grpc_cpp_server (its points skipped if absent)")
    parser.add_argument("--cpp-threads", default="1,8", help="completion-queue threads of each C++ server point")
    parser.add_argument("--h2load", default="h2load")
    parser.add_argument("--lib-path", default="", help="LD_LIBRARY_PATH for h2load and the C++ server (carried)")
    parser.add_argument("--conc", type=int, default=256)
    parser.add_argument("--client-threads", type=int, default=8)
    parser.add_argument("--server-cpus", default="0-7")
    parser.add_argument("--client-cpus", default="8-15")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs fastoip serve")
    parser.add_argument("--points", default="fastoip-simple,cpp-simple,fastoip-mlp")
    parser.add_argument("--dry-run", action="store_true",
                        help="small numbers for a 2-core machine: c=16, 2 h2load threads, 2 s a point, CPUs 0 / 1")
    args = parser.parse_args()
    if args.dry_run:
        args.conc, args.client_threads, args.duration, args.warmup = 16, 2, 2.0, 1.0
        args.server_cpus, args.client_cpus = "0", "1" if (os.cpu_count() or 1) > 1 else "0"
    args.out.mkdir(parents=True, exist_ok=True)
    args.client_env = dict(os.environ)
    if args.lib_path:
        args.client_env["LD_LIBRARY_PATH"] = f"{args.lib_path}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    if shutil.which(args.h2load, path=args.client_env.get("PATH")) is None and not Path(args.h2load).exists():
        log(f"no h2load ({args.h2load}): nothing measured")
        return 2
    work = Path(tempfile.mkdtemp(prefix="fastoip-cores-"))
    repo = write_repository(work / "repo", ["simple", "mlp"])
    payloads = work / "payloads"
    expected = write_payloads(repo, payloads)
    wanted = [name.strip() for name in args.points.split(",") if name.strip()]
    server_env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    results: list[dict] = []
    started = time.monotonic()
    for name in wanted:
        logged = len(results)
        port = free_port()
        if name in ("fastoip-simple", "fastoip-mlp"):
            model = "simple" if name == "fastoip-simple" else "mlp"
            argv = [args.python, "-m", "fastoip.cli", "serve", "--model-repository", str(repo), "--host", "127.0.0.1",
                    "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1", "--grpc-frontend", "native",
                    "--log-level", "WARNING", "--exit-timeout", "5"]
            point = {"name": name, "server": "fastoip (one process, native frontend)", "model": model}
            results.append(measure(args, point, argv, server_env, payloads, expected, port, work))
        elif name == "cpp-simple":
            for threads in [int(t) for t in args.cpp_threads.split(",") if t.strip()]:
                point = {"name": f"cpp-{threads}cq", "server": f"C++ grpc++, {threads} completion-queue threads",
                         "model": "simple"}
                if not args.cpp_server or not Path(args.cpp_server).exists():
                    results.append({**point, "error": f"no C++ server built ({args.cpp_server or 'not given'})"})
                    continue
                argv = [args.cpp_server, "--mode", "async", "--threads", str(threads), "--port", str(port),
                        "--payloads", str(payloads)]
                results.append(measure(args, point, argv, args.client_env, payloads, expected, port, work))
                port = free_port()
        else:
            results.append({"name": name, "error": "unknown point"})
        for result in results[logged:]:
            log(json.dumps(result))
    summary = {"host": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "platform": sys.platform}, "args": {
        k: v for k, v in vars(args).items() if k not in ("client_env", "out")}, "results": results,
        "elapsed_s": round(time.monotonic() - started, 1)}
    (args.out / "cores.json").write_text(json.dumps(summary, indent=2, default=str))
    (args.out / "cores.md").write_text(render(summary))
    print(render(summary))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all("error" not in r for r in results) else 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def render(summary: dict) -> str:
    a = summary["args"]
    lines = [f"## cores: c={a['conc']}, h2load {a['client_threads']} threads on CPUs {a['client_cpus']}, server on "
             f"CPUs {a['server_cpus']}, {a['duration']} s a point ({summary['host']['cpus']} CPUs here: "
             f"{summary['host']['cpu_model']})", "",
             "| point | model | req/s | p50 ms | p99 ms | server CPU s (cores) | CPU us/req | h2load CPU s (cores) "
             "| done / failed |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in summary["results"]:
        if "error" in r and "rps" not in r:
            lines.append(f"| {r['name']} | {r.get('model', '')} | - | - | - | - | - | - | {r['error'][:80]} |")
            continue
        lines.append(
            f"| {r['name']} | {r['model']} | {r['rps']:,.0f} | {_ms(r, 'p50_us')} | {_ms(r, 'p99_us')} | "
            f"{r.get('server_cpu_s', '-')} ({r.get('server_cores', '-')}) | {r.get('server_cpu_us_per_req', '-')} | "
            f"{r.get('client_cpu_s', '-')} ({r.get('client_cores', '-')}) | {r['done']} / "
            f"{r['failed'] + r['errored']}{' ' + r['error'][:60] if 'error' in r else ''} |")
    return "\n".join(lines) + "\n"


def _ms(result: dict, key: str) -> str:
    return f"{result[key] / 1000:.2f}" if result.get(key) is not None else "-"


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (issue "fastoip bench"): is the bench client the bottleneck? `fastoip bench` vs h2load.

One fastoip on the demo repository pinned to SERVER_CPUS (CPU 0). On CLIENT_CPUS (CPU 1), in turn and
alternating (`--rounds`), the same gRPC workload per point (`--points`: `simple` at concurrency 64, and
`image_identity` (602 KB each way) at concurrency 16):

* h2load with pre-encoded gRPC frames, as C connections x 1 stream and as 1 connection x C streams
  (successes checked by grpc-status via exact DATA-byte accounting),
* `fastoip bench` (1 client process; its default client, the native one where built),
* `fastoip bench --grpc-client aio` (grpcio, the client before the native one), and with `--processes2`
  `fastoip bench --processes 2`.

Target: fastoip bench >= 0.95x the faster h2load on `simple` c=64, within 5 % on 602 KB c=16.

Each client's run (gRPC and HTTP) also gives the **server's CPU per request** under that client's arrival pattern (the
server process's CPU time over the run / the successes its statistics counted), the figure that tells
whether the server serves one client's pattern worse than another's; the machine's other load disturbs it
far less than req/s. Beside it, the server's minor page faults per request: on 602 KB requests the server's
CPU per request follows them (glibc returning freed buffers to the kernel and faulting them back in: 4 to 96
faults per request between rounds, under either client, until `fastoip serve` pinned glibc's trim threshold;
benchmarks/RESULTS.md, 2026-11-27, benchtool and large): the column shows whether they are back.

`--points stream`: `fastoip bench --streaming` (ModelStreamInfer; the native client) against
`--streaming --grpc-client aio` (grpc.aio, before); h2load has no gRPC streaming, so the ratio is to aio.

`--points http` (HTTP, second priority): wrk (1 thread, 64 keep-alive connections, benchmarks/wrk_infer.lua)
posting a V2 JSON body for `simple` vs `fastoip bench --no-http-binary` at concurrency 64.

    python benchmarks/bench_tool.py [--seconds 8] [--rounds 2] [--points simple,large] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import CLIENT_CPUS, Fastoip, fastoip_bench, markdown_table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

#: point -> (model, concurrency)
POINTS = {"simple": ("simple", 64), "large": ("image_identity", 16), "http": ("simple", 64),
          "stream": ("simple", 64)}
WRK_LUA = Path(__file__).parent / "wrk_infer.lua"


def wrk(target: str, seconds: int, concurrency: int) -> dict:
    body = {"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                       for name in ("INPUT0", "INPUT1")]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(body, out)
        path = out.name
    argv = ["taskset", "-c", CLIENT_CPUS, "wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds}s",
            "-s", str(WRK_LUA), f"http://{target}/v2/models/simple/infer", "--", path]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r"LAB_WRK (\{.*\})", text)
    if found is None:
        raise RuntimeError(f"wrk printed no summary:\n{text}")
    summary = json.loads(found.group(1))
    errors = {k: summary[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout")
              if summary[k]}
    done = summary["requests"]
    return {"req_per_s": done / (summary["duration_us"] / 1e6), "done": done, "verified": not errors,
            "errors": errors, "cpu_us_per_req": 1e6 * cpu_s / max(done, 1)}


def server_cpu_s(pid: int) -> float:
    """CPU seconds the server process (every thread) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_faults(pid: int) -> int:
    """Minor page faults of the server process so far (fresh pages its allocator maps in)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def server_successes(target: str, model: str) -> int:
    """The successful inferences the server's statistics have counted for ``model``."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(target)
    try:
        stats = client.get_inference_statistics(model).model_stats
        return sum(entry.inference_stats.success.count for entry in stats)
    finally:
        client.close()


def server_mark(server: Fastoip, model: str) -> tuple[float, int, int]:
    """(server CPU seconds, successes of ``model``, server page faults) now."""
    return server_cpu_s(server.pid), server_successes(server.grpc, model), server_faults(server.pid)


def server_per_request(server: Fastoip, model: str, mark: tuple[float, int, int], key: str, into: dict,
                       faults: dict) -> None:
    """Server CPU us and page faults per successful request since ``mark``, into ``into[key]``, ``faults[key]``."""
    cpu_s, done, faulted = server_mark(server, model)
    if done > mark[1]:
        into[key] = 1e6 * (cpu_s - mark[0]) / (done - mark[1])
        faults[key] = (faulted - mark[2]) / (done - mark[1])


def frames(model: str) -> tuple[bytes, int]:
    """A framed ModelInferRequest for a demo model and the framed size of its response."""
    from fastoip import _codec
    from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse

    if model == "simple":
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [InferInput("INPUT0", "INT32", (1, 16), a), InferInput("INPUT1", "INT32", (1, 16), a)]
        outputs = [InferOutput("OUTPUT0", "INT32", (1, 16), a + a), InferOutput("OUTPUT1", "INT32", (1, 16), a - a)]
    else:
        x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        inputs = [InferInput("INPUT0", "FP32", x.shape, x)]
        outputs = [InferOutput("OUTPUT0", "FP32", x.shape, x)]
    request = _codec.encode_infer_request(InferRequest(model, inputs=inputs))
    response = _codec.encode_infer_response(InferResponse(model, "1", "", None, outputs))
    frame = b"\x00" + len(request).to_bytes(4, "big") + request
    return frame, 5 + len(response)


def h2load(target: str, seconds: int, model: str, concurrency: int, connections: int) -> dict:
    frame, response_size = frames(model)
    with tempfile.NamedTemporaryFile(suffix=".grpc", delete=False) as out:
        out.write(frame)
        path = out.name
    argv = ["taskset", "-c", CLIENT_CPUS, "h2load", "-t", "1", "-c", str(connections),
            "-m", str(concurrency // connections), "-D", str(seconds), "-d", path,
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://{target}/inference.GRPCInferenceService/ModelInfer"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rate, finished = re.search(r"([\d.]+) req/s", text), re.search(r"(\d+) done", text)
    if rate is None or finished is None:
        raise RuntimeError(f"h2load printed no summary:\n{text}")
    rps, done = float(rate.group(1)), int(finished.group(1))
    # Every successful answer carries exactly one framed response in DATA; errors are trailers-only.
    data = re.search(r"traffic: .*?\(([\d]+)\) data", text)
    ok = data is not None and int(data.group(1)) == done * response_size
    return {"req_per_s": rps, "done": done, "verified": ok, "cpu_us_per_req": 1e6 * cpu_s / max(done, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--points", default="simple,large", help="comma list of: " + ", ".join(POINTS))
    parser.add_argument("--processes2", action="store_true", help="also fastoip bench --processes 2")
    parser.add_argument("--bench-variant", action="append", default=[], metavar="ARGS",
                        help="also `fastoip bench ARGS` (repeatable), e.g. '--grpc-channels 4'")
    parser.add_argument("--no-aio", action="store_true", help="leave out `fastoip bench --grpc-client aio`")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    clients: list[tuple[str, tuple[str, ...]]] = [("fastoip bench", ()), ("fastoip bench --grpc-client aio",
                                                                            ("--grpc-client", "aio"))]
    if args.processes2:
        clients.append(("fastoip bench --processes 2", ("--processes", "2")))
    if args.no_aio:
        clients = [client for client in clients if "aio" not in client[0]]
    clients += [(f"fastoip bench {variant}", tuple(variant.split())) for variant in args.bench_variant]
    points = [p for p in args.points.split(",") if p]
    runs: dict[str, dict[str, list[float]]] = {p: {} for p in points}
    ratios: dict[str, dict[str, list[float]]] = {p: {} for p in points}
    # client CPU per request (h2load: its rusage over the run; fastoip bench: its own process CPU in the windows)
    cpu: dict[str, dict[str, list[float]]] = {p: {} for p in points}
    # server CPU per request under each gRPC client (see the docstring)
    server_cpu: dict[str, dict[str, list[float]]] = {p: {} for p in points}
    # the server's page faults per request under each client (its allocator mapping fresh pages: on 602 KB
    # requests the server's CPU per request follows them)
    server_faults_per: dict[str, dict[str, list[float]]] = {p: {} for p in points}
    with Fastoip(None, http="http" in points) as server:
        for _ in range(args.rounds):
            for point in points:
                model, concurrency = POINTS[point]
                this_round: dict[str, float] = {}
                this_cpu: dict[str, float] = {}
                this_server: dict[str, float] = {}
                this_faults: dict[str, float] = {}
                if point == "http":
                    mark = server_mark(server, model)
                    r = wrk(server.http, args.seconds, concurrency)
                    if not r["verified"]:  # no reference in this round: the point is left out of it
                        print(f"wrk: errors {r['errors']}: the http point is left out of this round", flush=True)
                        continue
                    this_round["wrk (64 connections)"] = r["req_per_s"]
                    this_cpu["wrk (64 connections)"] = r["cpu_us_per_req"]
                    server_per_request(server, model, mark, "wrk (64 connections)", this_server, this_faults)
                for connections in (concurrency, 1) if point not in ("http", "stream") else ():
                    mark = server_mark(server, model)
                    r = h2load(server.grpc, args.seconds, model, concurrency, connections)
                    layout = f"{connections} connections x {concurrency // connections} stream(s)"
                    if not r["verified"]:  # a failed or unfinished call: this run is left out of the round
                        print(f"h2load ({layout}): DATA bytes do not add up to successful responses: left out",
                              flush=True)
                        continue
                    this_round[f"h2load ({layout})"] = r["req_per_s"]
                    this_cpu[f"h2load ({layout})"] = r["cpu_us_per_req"]
                    server_per_request(server, model, mark, f"h2load ({layout})", this_server, this_faults)
                for name, extra in clients if point != "http" else [("fastoip bench --no-http-binary", ())]:
                    url = f"http://{server.http}" if point == "http" else f"grpc://{server.grpc}"
                    extra = ("--no-http-binary",) if point == "http" else extra
                    extra = ("--streaming", *extra) if point == "stream" else extra
                    mark = server_mark(server, model)
                    result = fastoip_bench(
                        url, "-m", model, "--concurrency-range", f"{concurrency}",
                        "-p", str(args.seconds * 1000 // 3), "--max-trials", "4", *extra,
                    )
                    row = result["results"][0]
                    if sum(row["errors"].values()):
                        raise SystemExit(f"{name}: errors {row['errors']}")
                    key = f"{name} [{row['client']}]"
                    this_round[key] = row["throughput_req_per_s"]
                    server_per_request(server, model, mark, key, this_server, this_faults)
                    if row.get("client_cpu_percent") is not None and row["throughput_req_per_s"]:
                        this_cpu[key] = 1e4 * row["client_cpu_percent"] / row["throughput_req_per_s"]
                base = max((v for k, v in this_round.items() if k.startswith(("h2load", "wrk"))), default=0.0)
                # no h2load/wrk (stream): the aio client, or with --no-aio the first client
                base = base or next((v for k, v in this_round.items() if "aio" in k), None) or next(
                    iter(this_round.values()))
                for key, value in this_round.items():
                    runs[point].setdefault(key, []).append(value)
                    ratios[point].setdefault(key, []).append(value / base)
                    if key in this_cpu:
                        cpu[point].setdefault(key, []).append(this_cpu[key])
                    if key in this_server:
                        server_cpu[point].setdefault(key, []).append(this_server[key])
                        server_faults_per[point].setdefault(key, []).append(this_faults[key])
                print(point, {k: round(v) for k, v in this_round.items()},
                      "server CPU us/req", {k: round(v, 1) for k, v in this_server.items()},
                      "server page faults/req", {k: round(v, 1) for k, v in this_faults.items()}, flush=True)
    for point in points:
        model, concurrency = POINTS[point]
        rows = [[k, f"{statistics.median(v):.0f}", " ".join(f"{r:.2f}" for r in ratios[point][k]),
                 f"{statistics.median(ratios[point][k]):.2f}",
                 f"{statistics.median(cpu[point][k]):.1f}" if cpu[point].get(k) else "-",
                 " ".join(f"{c:.1f}" for c in server_cpu[point][k]) if server_cpu[point].get(k) else "-",
                 " ".join(f"{c:.1f}" for c in server_faults_per[point][k]) if server_faults_per[point].get(k) else "-"]
                for k, v in runs[point].items()]
        print()
        print(markdown_table([f"client ({model}, c={concurrency})", "req/s (median)",
                              "vs the faster h2load (wrk) of the same round, per round", "median of the ratios",
                              "client CPU us/request (median)", "server CPU us/request, per round",
                              "server page faults/request, per round"], rows))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ratios": ratios, "client_cpu_us": cpu,
                                               "server_cpu_us": server_cpu, "server_faults": server_faults_per},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (issue "fastoip bench"): is the bench client the bottleneck? `fastoip bench` vs h2load.

One fastoip on the demo repository pinned to SERVER_CPUS (CPU 0). On CLIENT_CPUS (CPU 1), in turn and
alternating (`--rounds`), the same gRPC workload on `simple` at concurrency 64:

* h2load with pre-encoded gRPC frames, as 64 connections x 1 stream and as 1 connection x 64
  streams (successes checked by grpc-status via exact DATA-byte accounting),
* `fastoip bench` (1 client process), and `fastoip bench --processes 2` when the machine has the cores.

Target: fastoip bench's throughput within 15% of h2load's.

    python benchmarks/bench_tool.py [--seconds 8] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import CLIENT_CPUS, Fastoip, fastoip_bench, markdown_table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def simple_frame() -> tuple[bytes, int]:
    """A framed ModelInferRequest for `simple` and the framed size of its response."""
    from fastoip import _codec
    from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = _codec.encode_infer_request(
        InferRequest("simple", inputs=[InferInput("INPUT0", "INT32", (1, 16), a),
                                       InferInput("INPUT1", "INT32", (1, 16), a)])
    )
    response = _codec.encode_infer_response(
        InferResponse("simple", "1", "", None, [InferOutput("OUTPUT0", "INT32", (1, 16), a + a),
                                                InferOutput("OUTPUT1", "INT32", (1, 16), a - a)])
    )
    frame = b"\x00" + len(request).to_bytes(4, "big") + request
    return frame, 5 + len(response)


def h2load(target: str, seconds: int, connections: int = 64) -> dict:
    frame, response_size = simple_frame()
    with tempfile.NamedTemporaryFile(suffix=".grpc", delete=False) as out:
        out.write(frame)
        path = out.name
    argv = ["taskset", "-c", CLIENT_CPUS, "h2load", "-t", "1", "-c", str(connections), "-m", str(64 // connections),
            "-D", str(seconds), "-d", path,
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://{target}/inference.GRPCInferenceService/ModelInfer"]
    text = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    rate, finished = re.search(r"([\d.]+) req/s", text), re.search(r"(\d+) done", text)
    if rate is None or finished is None:
        raise RuntimeError(f"h2load printed no summary:\n{text}")
    rps, done = float(rate.group(1)), int(finished.group(1))
    # Every successful answer carries exactly one framed response in DATA; errors are trailers-only.
    data = re.search(r"traffic: .*?\(([\d]+)\) data", text)
    ok = data is not None and int(data.group(1)) == done * response_size
    return {"req_per_s": rps, "done": done, "verified": ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {
        "h2load (64 connections x 1 stream)": [],
        "h2load (1 connection x 64 streams)": [],
        "fastoip bench": [],
        "fastoip bench --processes 2": [],
    }
    with Fastoip(None) as server:
        for _ in range(args.rounds):
            for connections in (64, 1):
                r = h2load(server.grpc, args.seconds, connections)
                if not r["verified"]:
                    raise SystemExit("h2load: DATA bytes do not add up to successful responses")
                layout = "64 connections x 1 stream" if connections == 64 else "1 connection x 64 streams"
                runs[f"h2load ({layout})"].append(r["req_per_s"])
            for name, extra in (("fastoip bench", ()), ("fastoip bench --processes 2", ("--processes", "2"))):
                result = fastoip_bench(
                    f"grpc://{server.grpc}", "-m", "simple", "--concurrency-range", "64:64:1",
                    "-p", str(args.seconds * 1000 // 3), "--max-trials", "4", *extra,
                )
                row = result["results"][0]
                if sum(row["errors"].values()):
                    raise SystemExit(f"{name}: errors {row['errors']}")
                runs[name].append(row["throughput_req_per_s"])
            print({k: [round(v) for v in vs] for k, vs in runs.items()}, flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    base = max(medians["h2load (64 connections x 1 stream)"], medians["h2load (1 connection x 64 streams)"])
    rows = [[k, f"{v:.0f}", f"{v / base:.2f}"] for k, v in medians.items()]
    print()
    print(markdown_table(["client (simple, c=64)", "req/s (median)", "vs the faster h2load"], rows))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: one CPU instance per ONNX model (fastoip's default) against two (Triton's onnxruntime default).

Triton gives an onnxruntime model that names no ``instance_group`` two CPU instances; fastoip starts one.
This script serves the demo ``mlp`` (dynamic batcher) and ``simple`` models with ``instance_group
[ { count: N, kind: KIND_CPU } ]`` for N in ``--counts``, ONNX Runtime's default threads (one intra-op
thread per physical core per session), a fresh ``fastoip serve --cpu-only`` per point, and measures each
with ``fastoip bench`` (native gRPC client, closed loop).  The counts alternate within every round, so
each sees the same machine load.  Run:

    PYTHONPATH=src python benchmarks/bench_instances.py [--rounds 3] [--conc 1,8] [--seconds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _harness import free_port
from fastoip.demo import write_repository

CLI = [sys.executable, "-c", "from fastoip.cli import main; main()"]


def repository(count: int) -> Path:
    """The demo mlp and simple models, each with ``count`` CPU instances."""
    root = write_repository(Path(tempfile.mkdtemp(prefix=f"instances-{count}-")), ["mlp", "simple"])
    mlp = root / "mlp" / "config.pbtxt"
    mlp.write_text(mlp.read_text().replace("count: 1", f"count: {count}"))
    simple = root / "simple" / "config.pbtxt"
    simple.write_text(simple.read_text() + f"instance_group [ {{ count: {count}, kind: KIND_CPU }} ]\n")
    return root


def measure(count: int, model: str, conc: int, seconds: float) -> dict[str, Any]:
    """One fresh server with ``count`` instances, one ``fastoip bench`` point; its result row."""
    root = repository(count)
    grpc_port, http_port = free_port(), free_port()
    server = subprocess.Popen(
        [*CLI, "serve", "--model-repository", str(root), "--cpu-only", "--grpc-port", str(grpc_port),
         "--http-port", str(http_port), "--metrics-port", "-1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        out = Path(tempfile.mktemp(suffix=".json"))
        subprocess.run(
            [*CLI, "bench", f"grpc://127.0.0.1:{grpc_port}", "-m", model, "--concurrency-range", str(conc),
             "-p", str(int(seconds * 1000)), "-r", "1", "--warmup-ms", "500", "-q", "--json", str(out)],
            check=True, stdout=subprocess.DEVNULL,
        )
        return dict(json.loads(out.read_text())["results"][0])
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2")
    parser.add_argument("--models", default="mlp,simple")
    parser.add_argument("--conc", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    rows: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        for model in args.models.split(","):
            for conc in (int(c) for c in args.conc.split(",")):
                for count in counts:  # alternating: both counts see the same machine load
                    result = measure(count, model, conc, args.seconds)
                    latency = result["latency_us"]
                    rows.append({"round": round_index, "model": model, "conc": conc, "count": count,
                                 "infer_per_s": result["throughput_infer_per_s"], "p50_us": latency["p50"],
                                 "p99_us": latency["p99"], "other_cpu_percent": result.get("other_cpu_percent")})
                    print(json.dumps(rows[-1]), flush=True)
    print(f"\nhost: {os.cpu_count()} CPUs; mean infer/s per point, and the ratio to count {counts[0]}")
    for model in args.models.split(","):
        for conc in (int(c) for c in args.conc.split(",")):
            means = {count: statistics.mean(r["infer_per_s"] for r in rows
                                            if (r["model"], r["conc"], r["count"]) == (model, conc, count))
                     for count in counts}
            ratios = ", ".join(f"count {c}: {means[c]:.0f}/s ({means[c] / means[counts[0]]:.2f}x)" for c in counts)
            print(f"{model} c={conc}: {ratios}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

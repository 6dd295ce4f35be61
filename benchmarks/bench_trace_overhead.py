#!/usr/bin/env python3
"""CPU time of the Core's request path in-process, for the cost of tracing (off, on but not sampled, on).

Usage:
  python benchmarks/bench_trace_overhead.py [--requests 20000] [--rounds 7] [--mode off|unsampled|traced]

Runs ``Core.start`` (every frontend's entry point) on a queue-less ``simple`` (real ONNX Runtime, run on
the calling thread) and reports the process CPU time per request, the minimum over rounds (the least
disturbed by other load on a shared machine).  ``off`` runs on any fastoip version, so an A/B against an
older build is: the same script with each build's Python, alternately, e.g.

  for i in 1 2 3; do /path/to/base/.venv/bin/python benchmarks/bench_trace_overhead.py; \\
                     .venv/bin/python benchmarks/bench_trace_overhead.py; done
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastoip
from fastoip.core import CallContext, Core
from fastoip.demo import write_repository
from fastoip.options import RepositoryOptions
from fastoip.types import InferInput, InferRequest

#: ``simple`` without a batcher: a request runs on the thread that submits it.
DIRECT_SIMPLE = 'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mode", choices=("off", "unsampled", "traced"), default="off",
                        help="off: no tracing; unsampled: TIMESTAMPS with a rate no request reaches; traced: rate 1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_repository(Path(tmp) / "repo")
        (root / "simple" / "config.pbtxt").write_text(DIRECT_SIMPLE)
        options: dict[str, Any] = {}  # nothing for "off": a build before tracing was wired takes no trace_config
        if args.mode != "off":
            from fastoip.tracing import parse_trace_config

            rate = "1" if args.mode == "traced" else str(2**31)
            options["trace_config"] = parse_trace_config(
                [f"triton,file={Path(tmp) / 'trace.json'}", "level=TIMESTAMPS", f"rate={rate}"])
        core = Core(root, RepositoryOptions(use_gpu=False), worker_threads=2, **options)
        try:
            core.load_models()
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [InferInput("INPUT0", "INT32", (1, 16), a), InferInput("INPUT1", "INT32", (1, 16), a)]
            headers = {b"content-type": b"application/grpc", b"te": b"trailers"}
            done: list[object] = []

            def run(count: int) -> float:
                start = time.process_time()
                for _ in range(count):
                    call = CallContext(trace_headers=headers, caller_runs=True)
                    core.start(InferRequest("simple", inputs=inputs), call, done.append)
                elapsed = time.process_time() - start
                done.clear()
                return elapsed

            run(2000)  # warm-up
            per_request = min(run(args.requests) for _ in range(args.rounds)) / args.requests
        finally:
            core.close()
    print(f"fastoip {fastoip.__file__}: mode {args.mode}: {per_request * 1e6:.2f} us CPU per request "
          f"(min of {args.rounds} x {args.requests})")


if __name__ == "__main__":
    main()

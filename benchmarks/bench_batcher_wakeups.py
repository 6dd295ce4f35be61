"""Benchmark: the dynamic batcher's wake-ups while a batch gathers (Triton's Enqueue rule vs a wake per arrival).

In one process, no sockets: the Core on the demo ``mlp`` (dynamic batcher, ``max_batch_size`` 64, one
instance) and a "frontend" thread that keeps C requests in flight, starting each new request as a finished
one comes back, after ``--frontend-us`` of Python work with the GIL held (one by one, as the event loop
decodes and delivers them).  Two variants alternate, several rounds:

* ``rule``: the batcher as it is: an arrival wakes a gathering instance only when the queued batch size
  reaches the next preferred size (or its shape differs, or it expires first);
* ``every``: every arrival wakes the instance (the batcher before Triton's rule), which then recomputes the
  batch and goes back to sleep.

Reported per variant and round: requests/s, process CPU per request (both threads; the figure that the
machine's other load disturbs least), executions and the average executed batch (from the statistics), and
the batcher's decisions that formed no batch, per executed batch (wake-ups that only went back to sleep).
Run (the process pins itself to one CPU, as the lab pins a server):

    PYTHONPATH=src python benchmarks/bench_batcher_wakeups.py [--seconds 3] [--rounds 3] [--conc 64]
        [--delay-us 500] [--frontend-us 40] [--cpu 0]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastoip.core import Core, FinishedCall
from fastoip.demo import write_repository
from fastoip.repository import RepositoryOptions
from fastoip.scheduling.batcher import BatchQueue
from fastoip.types import InferInput, InferRequest

RULE = BatchQueue.wakes
NEXT_BATCH = BatchQueue.next_batch
#: Decisions that formed no batch (the instance went back to sleep): the wasted wake-ups.
empty_decisions = [0]


def counting_next_batch(self: BatchQueue, now_ns: int, flush: bool = False) -> tuple[list[Any], int]:
    batch, wait_ns = NEXT_BATCH(self, now_ns, flush)
    if not batch:
        empty_decisions[0] += 1
    return batch, wait_ns


def every_arrival_wakes(self: BatchQueue, job: Any) -> bool:
    return True


def frontend_work(us: float) -> None:
    """Hold the GIL for ``us`` microseconds, as the event loop's per-request Python (decode, HTTP/2, encode)."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def run_variant(core: Core, variant: str, seconds: float, conc: int, frontend_us: float) -> dict[str, float]:
    BatchQueue.wakes = RULE if variant == "rule" else every_arrival_wakes  # type: ignore[method-assign]
    data = np.random.default_rng(0).random((1, 256), dtype=np.float32)
    finished: queue.SimpleQueue[FinishedCall] = queue.SimpleQueue()

    def request() -> InferRequest:
        return InferRequest("mlp", inputs=[InferInput("INPUT0", "FP32", data.shape, data)])

    for _ in range(conc):
        core.start(request(), None, finished.put)
    (before,) = core.statistics("mlp")
    empty_before = empty_decisions[0]
    count = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    end = wall0 + seconds
    while True:
        call = finished.get()
        if call.error is not None:
            raise call.error
        count += 1
        if time.perf_counter() >= end:
            break
        frontend_work(frontend_us)
        core.start(request(), None, finished.put)  # the "frontend": one request at a time, as it comes back
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    (after,) = core.statistics("mlp")
    empty = empty_decisions[0] - empty_before
    for _ in range(conc - 1):  # drain the calls still in flight
        finished.get()
    executions = after.execution_count - before.execution_count
    inferences = after.inference_count - before.inference_count
    return {
        "req_s": count / wall,
        "cpu_us": cpu / count * 1e6,
        "executions": executions,
        "avg_batch": inferences / executions if executions else 0.0,
        "empty_per_batch": empty / executions if executions else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--delay-us", type=int, default=500)
    ap.add_argument("--frontend-us", type=float, default=40.0,
                    help="Python work per request on the frontend thread, GIL held (default 40 us)")
    ap.add_argument("--cpu", type=int, default=0, help="pin the process to this CPU (-1: do not pin)")
    args = ap.parse_args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    with tempfile.TemporaryDirectory() as tmp:
        root = write_repository(Path(tmp), ["mlp"])
        (root / "mlp" / "config.pbtxt").write_text(
            'name: "mlp"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}\n"
            "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
            'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        )
        BatchQueue.next_batch = counting_next_batch  # type: ignore[method-assign]
        core = Core(root, RepositoryOptions(use_gpu=False), worker_threads=4)
        try:
            core.load_models()
            run_variant(core, "rule", 0.5, args.conc, args.frontend_us)  # warm-up
            results: dict[str, list[dict[str, float]]] = {"rule": [], "every": []}
            for round_ in range(args.rounds):
                order = ("rule", "every") if round_ % 2 == 0 else ("every", "rule")
                for variant in order:
                    figures = run_variant(core, variant, args.seconds, args.conc, args.frontend_us)
                    results[variant].append(figures)
                    print(
                        f"round {round_ + 1} {variant:5s}: {figures['req_s']:8.0f} req/s  "
                        f"{figures['cpu_us']:6.1f} us CPU/req  {figures['executions']:6.0f} executions  "
                        f"avg batch {figures['avg_batch']:5.1f}  "
                        f"{figures['empty_per_batch']:5.2f} wake-ups without a batch per batch",
                        flush=True,
                    )
        finally:
            BatchQueue.wakes = RULE  # type: ignore[method-assign]
            BatchQueue.next_batch = NEXT_BATCH  # type: ignore[method-assign]
            core.close()
    print(f"\nmedians over {args.rounds} rounds, c={args.conc}, max_queue_delay {args.delay_us} us, "
          f"frontend {args.frontend_us:g} us/request:")
    for variant, rows in results.items():
        print(
            f"  {variant:5s}: {statistics.median(r['req_s'] for r in rows):8.0f} req/s  "
            f"{statistics.median(r['cpu_us'] for r in rows):6.1f} us CPU/req  "
            f"avg batch {statistics.median(r['avg_batch'] for r in rows):5.1f}  "
            f"{statistics.median(r['empty_per_batch'] for r in rows):5.2f} wake-ups without a batch per batch"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

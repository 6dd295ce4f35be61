"""CPU per request of a tiny Triton Python model, process-hosted vs in-process, in one process (no sockets).

A Core serves a 16 x FP32 identity ``TritonPythonModel`` twice (worker process, and ``hosting: in_process``);
the script calls ``Core.infer`` in a loop from one or more threads and reports, per request, the wall time,
the server process's CPU time and the worker process's CPU time (``/proc/<pid>/stat``).  CPU per request is
steadier than throughput on a shared machine.  ``--cprofile FILE`` writes the server side's profile of the
process-hosted loop (``python -m pstats FILE``).

Run: ``PYTHONPATH=src python benchmarks/profile_triton_python.py [--requests 3000] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

IDENTITY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests
            ]
"""

CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


MODELS = {
    "process": "",  # worker_pipeline 8 (the default without a batcher)
    "process_p1": 'parameters { key: "worker_pipeline" value: { string_value: "1" } }\n',
    "in_process": 'parameters { key: "hosting" value: { string_value: "in_process" } }\n',
}


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _switches(pid: int) -> int:
    """Context switches (voluntary + involuntary) of every thread of ``pid``: its wake-ups."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def _worker_pids() -> list[int]:
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                out.append(int(entry.name))
    return out


def _worker_counters(workers: list[int]) -> tuple[float, int]:
    """The workers' CPU seconds, and the context switches of this process and the workers."""
    return sum(_cpu_of(p) for p in workers), _switches(os.getpid()) + sum(_switches(p) for p in workers)


def _figures(model: str, n: int, wall: float, cpu: float, worker_cpu: float, switches: int) -> dict:
    """Per-request figures of one run of ``n`` requests."""
    return {
        "model": model,
        "requests": n,
        "wall_us": wall / n * 1e6,
        "server_cpu_us": cpu / n * 1e6,
        "worker_cpu_us": worker_cpu / n * 1e6,
        "per_s": n / wall,
        "switches": switches / n,
    }


def run(core: object, model: str, requests: int, threads: int, profile: str = "") -> dict:
    from fastoip.types import InferInput, InferRequest, RequestedOutput

    data = np.arange(16, dtype=np.float32)

    def request() -> InferRequest:
        inputs = [InferInput("INPUT0", "FP32", (16,), data)]
        return InferRequest(model, "", "", {}, inputs, [RequestedOutput("OUTPUT0")])

    for _ in range(200):  # warm up
        core.infer(request())  # type: ignore[attr-defined]
    workers = _worker_pids()
    worker_cpu, switches = _worker_counters(workers)
    per_thread = requests // threads
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()

    def loop() -> None:
        if profiler is not None:
            profiler.enable()
        for _ in range(per_thread):
            core.infer(request())  # type: ignore[attr-defined]
        if profiler is not None:
            profiler.disable()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    worker_cpu_after, switches_after = _worker_counters(workers)
    worker_cpu, switches = worker_cpu_after - worker_cpu, switches_after - switches
    if profiler is not None:
        profiler.dump_stats(profile)
    return _figures(model, per_thread * threads, wall, cpu, worker_cpu, switches)


def run_on_loop(core: object, model: str, requests: int, concurrency: int) -> dict:
    """As :func:`run`, but as the event-loop frontends call the Core: ``Core.start`` on one asyncio loop with
    ``concurrency`` requests in flight, each completion brought back to the loop (``fastoip.core.on_loop``)."""
    import asyncio

    from fastoip.core import on_loop
    from fastoip.types import InferInput, InferRequest, RequestedOutput

    data = np.arange(16, dtype=np.float32)

    def request() -> InferRequest:
        inputs = [InferInput("INPUT0", "FP32", (16,), data)]
        return InferRequest(model, "", "", {}, inputs, [RequestedOutput("OUTPUT0")])

    async def drive(count: int) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        left = [count, count]  # to start, to finish

        def finished(call: object) -> None:
            if getattr(call, "error", None) is not None:
                raise RuntimeError(call.error)  # type: ignore[attr-defined]
            left[1] -= 1
            if left[0]:
                left[0] -= 1
                core.start(request(), None, hop)  # type: ignore[attr-defined]
            elif not left[1] and not done.done():
                done.set_result(None)

        hop = on_loop(loop, finished)
        for _ in range(min(concurrency, count)):
            left[0] -= 1
            core.start(request(), None, hop)  # type: ignore[attr-defined]
        await done

    loop: asyncio.AbstractEventLoop
    try:  # the loop the servers' frontends run on
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    loop.run_until_complete(drive(200))  # warm up
    workers = _worker_pids()
    worker_cpu, switches = _worker_counters(workers)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loop.run_until_complete(drive(requests))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    worker_cpu_after, switches_after = _worker_counters(workers)
    worker_cpu, switches = worker_cpu_after - worker_cpu, switches_after - switches
    loop.close()  # (a worker that read its results on it goes back to its reader thread)
    return _figures(model, requests, wall, cpu, worker_cpu, switches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cprofile", default="")
    parser.add_argument("--models", default=",".join(MODELS), help="which of " + ", ".join(MODELS))
    parser.add_argument(
        "--driver", choices=("threads", "loop"), default="threads",
        help="threads: Core.infer from --threads blocking threads; loop: Core.start on one asyncio loop with "
        "--threads requests in flight (as the event-loop frontends)",
    )
    args = parser.parse_args()
    from fastoip.core import Core

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, extra in MODELS.items():
            (root / name / "1").mkdir(parents=True)
            (root / name / "1" / "model.py").write_text(textwrap.dedent(IDENTITY))
            (root / name / "config.pbtxt").write_text(CONFIG + extra)
        core = Core(root)
        core.load_models()
        try:
            for round_ in range(args.rounds):
                for model in args.models.split(","):
                    profile = args.cprofile if (args.cprofile and model == "process" and round_ == 0) else ""
                    if args.driver == "loop":
                        r = run_on_loop(core, model, args.requests, args.threads)
                    else:
                        r = run(core, model, args.requests, args.threads, profile)
                    print(f"{r['model']:>10}: {r['wall_us']:7.1f} us wall, {r['server_cpu_us']:7.1f} us server CPU, "
                          f"{r['worker_cpu_us']:6.1f} us worker CPU, {r['switches']:4.1f} context switches per request "
                          f"({r['per_s']:.0f}/s)", flush=True)
        finally:
            core.close()


if __name__ == "__main__":
    main()

"""The same load from several client processes (``--processes N``), results merged.

One Python process tops out at a few thousand small requests per second (the
GIL); beyond that the client, not the server, is measured.  Workers are
started with the ``spawn`` method (no gRPC state crosses a fork), each builds
its own generator and channels, and answers the parent's commands over a
pipe.  Concurrency C is split as evenly as possible (a worker with a share of
0 stays idle), a request rate r as r/N per worker (with different seeds for
the Poisson schedule).  Windows line up across processes because every
completion carries a CLOCK_MONOTONIC end time and the parent cuts all workers
at the same ``[a, b)``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from typing import Any

from .generators import make_generator, resolve_client
from .load import Generator, LoadSpec, Sample
from .target import BenchError


def _worker(conn: Any, spec: LoadSpec, cpus: set[int] | None) -> None:
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    generator: Generator | None = None
    try:
        while True:
            command = conn.recv()
            op = command[0]
            try:
                if op == "start":
                    # command: ("start", mode, this worker's share, the client chosen for the whole level)
                    generator = make_generator(dataclasses.replace(spec, client=command[3]))
                    if command[1] == "concurrency":
                        generator.start_concurrency(int(command[2]))
                    else:
                        generator.start_rate(float(command[2]))
                    conn.send(("ok", None))
                elif op == "cut":
                    conn.send(("ok", generator.cut(command[1], command[2]) if generator else None))
                elif op == "stop":
                    if generator is not None:
                        generator.stop(command[1])
                        generator.close()
                        generator = None
                    conn.send(("ok", None))
                elif op == "exit":
                    conn.send(("ok", None))
                    return
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        if generator is not None:
            generator.stop(1.0)
            generator.close()


class ProcessLoad(Generator):
    """N worker processes behind the Generator interface."""

    def __init__(self, spec: LoadSpec, processes: int, cpus: set[int] | None = None) -> None:
        super().__init__(spec)
        context = multiprocessing.get_context("spawn")
        self._workers: list[tuple[Any, Any]] = []
        self._active: list[int] = []
        for index in range(processes):
            parent, child = context.Pipe()
            worker_spec = dataclasses.replace(spec, seed=spec.seed + index, extra=dict(spec.extra))
            process = context.Process(
                target=_worker, args=(child, worker_spec, cpus), name=f"fastoip-bench-{index}", daemon=True
            )
            process.start()
            child.close()
            self._workers.append((process, parent))

    @property
    def pids(self) -> list[int]:
        return [process.pid for process, _ in self._workers]

    def _ask(self, index: int, command: tuple, timeout: float = 60.0) -> Any:
        self._workers[index][1].send(command)
        return self._answer(index, command[0], timeout)

    def _answer(self, index: int, what: str, timeout: float = 60.0) -> Any:
        """The reply of worker ``index`` to a command already sent (all workers run it at once)."""
        process, pipe = self._workers[index]
        if not pipe.poll(timeout):
            raise BenchError(f"client process {process.pid} did not answer {what!r}", stage="load")
        status, value = pipe.recv()
        if status != "ok":
            raise BenchError(f"client process {process.pid}: {value}", stage="load")
        return value

    def _start(self, mode: str, shares: list[float]) -> None:
        client = resolve_client(self.spec, mode, sum(shares))
        if client in ("http", "aio-stream", "native-stream"):
            client = self.spec.client
        self._active = [i for i, share in enumerate(shares) if share > 0]
        for i in self._active:
            self._workers[i][1].send(("start", mode, shares[i], client))
        for i in self._active:
            self._answer(i, "start")

    def start_concurrency(self, concurrency: int) -> None:
        n = len(self._workers)
        self._start("concurrency", [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)])

    def start_rate(self, rate: float) -> None:
        n = len(self._workers)
        self._start("rate", [rate / n] * n)

    def cut(self, a: int, b: int) -> Sample:
        for i in self._active:
            self._workers[i][1].send(("cut", a, b))
        samples = []
        for i in self._active:
            value = self._answer(i, "cut")
            if value is not None:
                samples.append(value)
        return Sample.merge(samples)

    def stop(self, drain_s: float = 10.0) -> None:
        for i in self._active:
            self._ask(i, ("stop", drain_s), timeout=drain_s + 30)
        self._active = []

    def close(self) -> None:
        for index, (process, pipe) in enumerate(self._workers):
            if process.is_alive():
                try:
                    self._ask(index, ("exit",), timeout=5)
                except (BenchError, OSError, EOFError):
                    pass
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
            pipe.close()
        self._workers.clear()

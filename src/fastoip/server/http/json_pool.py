"""Large JSON bodies are parsed in worker processes, never on the HTTP event loop (issues 27, 37).

Rules:
- A JSON body (or JSON part) of at least ``OFF_LOOP_JSON_BYTES`` is parsed (orjson, then numpy for inference) in a
  small pool of processes (``--http-thread-count``, Triton's flag for the threads that handle HTTP requests;
  default 2).  orjson and numpy hold the GIL for the whole of one call (about 0.2 s per 192 MB on a quiet machine,
  seconds on a busy one), so a thread would stall the loop as much as the loop itself; a process does not, and
  the parsed Python lists (tens of bytes per number) live and die there, not in the server.  What comes back is
  the result, copied once by pickle.  Every JSON endpoint comes through here (``run``: infer, V1, generate,
  model control; see :mod:`.intake`).
- Smaller bodies are parsed on the loop: for them the hop costs more than the parse.
- Issue 37: the pool is a bounded queue, not a memory bank.  At most ``workers`` bodies are being parsed; the
  others wait, smallest first (a legitimate small body waits for at most the parses running, never behind every
  large one), and a body of at most ``SMALL_LANE_BYTES`` has one more process of its own when every worker is
  busy (a 3 MB request is parsed at once beside two 59 MB ones).  Bodies held (running or waiting) are bounded in
  count (``MAX_JOBS``) and bytes
  (``MAX_HELD_BYTES``); one more is answered 503 with Retry-After at once (``ResourceExhausted``), never queued.
  A body arriving while the pool holds nothing is always taken (the body limit bounds it).
- Workers are started with ``spawn`` (the server has threads: forking it is unsafe), on first use, the small
  lane's with them (so a small body arriving behind large ones does not wait for a Python to start).  A worker that
  dies (killed for memory) fails its request with 500 ``InternalError``, and the pool starts again for the next.
  ``spawn`` imports the program's main module in each worker, as any multiprocessing use does: ``fastoip serve``
  guards it; an embedded server (``fastoip.Server``) runs inside any script, guarded or not, so it starts with no
  workers (``workers=0``: every request decoded on the loop, as before) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import heapq
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, TypeVar

from ...errors import InternalError, ResourceExhausted
from ...types import InferRequest
from ...wire import http as wire
from ...wire.http import OutputFormat

#: JSON parts at least this large are decoded in a worker process (about 10 ms of orjson and numpy on the loop).
OFF_LOOP_JSON_BYTES = 2 * 1024 * 1024
#: Worker processes when --http-thread-count is not given.
DEFAULT_WORKERS = 2
#: Bodies the pool holds at once (parsing or waiting), and their bytes together.
MAX_JOBS = 16
MAX_HELD_BYTES = 128 * 1024 * 1024
#: Bodies up to this size may also use one more process of their own (the small lane) when every worker is busy.
SMALL_LANE_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


def _worker_start() -> None:
    """A worker leaves SIGINT and SIGTERM to the server (a Ctrl-C reaches the whole process group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class JsonPool:
    """The parsing processes of one HTTP server; its counts are touched on its loop thread only."""

    def __init__(self, workers: int = DEFAULT_WORKERS, max_jobs: int = MAX_JOBS,
                 max_held_bytes: int = MAX_HELD_BYTES) -> None:
        #: 0: no processes, every body is parsed on the loop.
        self.workers = max(0, workers)
        self.max_jobs = max_jobs
        self.max_held_bytes = max_held_bytes
        #: Bodies held (parsing or waiting) and their bytes.
        self.jobs = 0
        self.held = 0
        #: Bodies being parsed by the workers, and whether the small lane is parsing one.
        self.running = 0
        self.small_running = False
        self.refused = 0
        #: Bodies waiting for a process: (size, arrival, the future that gets their lane), smallest first.
        self._waiting: list[tuple[int, int, asyncio.Future[bool]]] = []
        self._arrivals = 0
        self._pool: ProcessPoolExecutor | None = None
        self._small: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self, small: bool) -> ProcessPoolExecutor:
        with self._lock:
            if self._small is None:
                self._small = _new_executor(1)
                self._small.submit(_ready)  # its process starts now, beside the first large body's
            if small:
                return self._small
            if self._pool is None:
                self._pool = _new_executor(self.workers)
            return self._pool

    async def run(self, size: int, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` (a module-level function: it is pickled), in a worker process when ``size`` (the
        JSON's bytes) is large; RESOURCE_EXHAUSTED / 503 at once when the pool holds its maximum."""
        if not self.off_loop(size):
            return function(*args)
        if self.jobs and (self.jobs >= self.max_jobs or self.held + size > self.max_held_bytes):
            self.refused += 1
            raise ResourceExhausted(f"the server is parsing {self.jobs} large JSON bodies ({self.held} bytes); "
                                    "try again shortly", retry_after=1)
        self.jobs += 1
        self.held += size
        try:
            small = self._take_lane(size)
            if small is None:
                turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                self._arrivals += 1
                heapq.heappush(self._waiting, (size, self._arrivals, turn))
                try:
                    small = await turn
                except BaseException:
                    if turn.done() and not turn.cancelled():  # given a lane just as it was cancelled: pass it on
                        self._give_back(turn.result())
                    else:
                        self._waiting = [entry for entry in self._waiting if entry[2] is not turn]
                        heapq.heapify(self._waiting)
                    raise
            try:
                return await self._in_worker(small, function, args)
            finally:
                self._give_back(small)
        finally:
            self.jobs -= 1
            self.held -= size

    def _take_lane(self, size: int) -> bool | None:
        """A free process for a body of ``size``: False a worker, True the small lane, None none."""
        if self.running < self.workers:
            self.running += 1
            return False
        if size <= SMALL_LANE_BYTES and not self.small_running:
            self.small_running = True
            return True
        return None

    def _give_back(self, small: bool) -> None:
        """A process is free: the smallest waiting body that may use it gets it."""
        if small:
            self.small_running = False
        else:
            self.running -= 1
        while self._waiting:
            size, _, turn = self._waiting[0]
            if turn.done():
                heapq.heappop(self._waiting)
                continue
            lane = self._take_lane(size)
            if lane is None:
                return
            heapq.heappop(self._waiting)
            turn.set_result(lane)

    async def _in_worker(self, small: bool, function: Callable[..., T], args: tuple[Any, ...]) -> T:
        pool = self._executor(small)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, partial(function, *args))
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
                if self._small is pool:
                    self._small = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise InternalError("the process that parses large JSON requests failed (out of memory?)") from None

    def off_loop(self, size: int) -> bool:
        """Whether a body of ``size`` JSON bytes is parsed in a worker process (copied there), not on the loop."""
        return size >= OFF_LOOP_JSON_BYTES and self.workers > 0

    async def decode(self, model: str, version: str, body: bytes | bytearray, header_length: int | None,
                     loose_bytes: bool = False) -> tuple[InferRequest, OutputFormat]:
        """``wire.decode_infer_request``, in a worker process when the JSON part is large."""
        json_length = len(body) if header_length is None else header_length
        return await self.run(json_length, partial(wire.decode_infer_request, loose_bytes=loose_bytes), model,
                              version, body, header_length)

    def shutdown(self) -> None:
        with self._lock:
            pools = [self._pool, self._small]
            self._pool = self._small = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)


def _new_executor(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start)


def _ready() -> None:
    """Nothing: submitted once so that the processes start."""

"""Large JSON inference requests are decoded in worker processes, never on the HTTP event loop (issue 27).

Rules:
- A request whose JSON part is at least ``OFF_LOOP_JSON_BYTES`` is decoded (orjson, then numpy) in a small pool
  of processes (``--http-thread-count``, Triton's flag for the threads that handle HTTP requests; default 2).
  orjson and numpy hold the GIL for the whole of one call (about 0.2 s per 192 MB on a quiet machine, seconds on
  a busy one), so a thread would stall the loop as much as the loop itself; a process does not, and the parsed
  Python lists (tens of bytes per number) live and die there, not in the server.  What comes back is the
  request with its numpy arrays, copied once by pickle; at most ``workers`` large bodies are decoded at a time.
- Smaller requests are decoded on the loop: for them the hop costs more than the parse.
- Workers are started with ``spawn`` (the server has threads: forking it is unsafe), on first use.  A worker that
  dies (killed for memory) fails its request with 500 ``InternalError``, and the pool starts again for the next.
  ``spawn`` imports the program's main module in each worker, as any multiprocessing use does: ``fastoip serve``
  guards it; an embedded server (``fastoip.Server``) runs inside any script, guarded or not, so it starts with no
  workers (``workers=0``: every request decoded on the loop, as before) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TypeVar

from ...errors import InternalError
from ...types import InferRequest
from ...wire import http as wire
from ...wire.http import OutputFormat

T = TypeVar("T")
#: JSON parts at least this large are decoded in a worker process (about 10 ms of orjson and numpy on the loop).
OFF_LOOP_JSON_BYTES = 2 * 1024 * 1024
#: Worker processes when --http-thread-count is not given.
DEFAULT_WORKERS = 2


def _worker_start() -> None:
    """A worker leaves SIGINT and SIGTERM to the server (a Ctrl-C reaches the whole process group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class JsonPool:
    """The decoding processes of one HTTP server (started on first use)."""

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        #: 0: no processes, every request is decoded on the loop.
        self.workers = max(0, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_worker_start)
            return self._pool

    async def decode(self, model: str, version: str, body: bytes, header_length: int | None,
                     loose_bytes: bool = False) -> tuple[InferRequest, OutputFormat]:
        """``wire.decode_infer_request``, in a worker process when the JSON part is large."""
        json_length = len(body) if header_length is None else header_length
        if json_length < OFF_LOOP_JSON_BYTES or not self.workers:
            return wire.decode_infer_request(model, version, body, header_length, loose_bytes=loose_bytes)
        pool = self._executor()
        try:
            future = asyncio.get_running_loop().run_in_executor(
                pool, partial(wire.decode_infer_request, model, version, bytes(body), header_length,
                              loose_bytes=loose_bytes))
            return await future
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise InternalError("the process that parses large JSON requests failed (out of memory?)") from None

    async def call(self, function: Callable[[bytes], T], body: bytes) -> T:
        """``function(body)`` in a worker process (a large body parsed off the loop, e.g. an OpenAI request)."""
        pool = self._executor()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, function, bytes(body))
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise InternalError("the process that parses large JSON requests failed (out of memory?)") from None

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

"""Inflating a client's compressed message (gzip / deflate) for both frontends, bounded and off the loop.

Rules:
- Never more than ``limit`` bytes come out (the message or body limit): zlib's
  ``max_length`` stops inflating at ``limit + 1`` bytes, so a bomb costs at most
  the limit in memory and time, never its claimed size.  The output grows in
  one buffer (never pieces joined at the end, which held a message twice).
- The event loop inflates at most ``ON_LOOP_BYTES`` of output of one message;
  the rest is inflated by the server's :class:`InflationPool` (``POOL_THREADS``
  threads shared by both frontends; zlib releases the GIL there).
- Issue 37: the pool takes turns.  Each message in it inflates ``STEP_BYTES``
  and goes to the back of the line, so a small message that arrives behind
  bombs waits for one step of each, not for the bombs to finish.  At most
  ``MAX_WAITING`` messages are in the pool; one more is refused at once
  (``busy``: RESOURCE_EXHAUSTED / 503 with Retry-After), never queued.
- Issue 37: every inflated byte counts, as it is produced, against one
  server-wide budget (``--max-inflated-request-bytes``, default 128 MiB).  When
  a step takes the total past it, the message holding the most is refused (the
  one most likely a bomb, and the one whose loss frees most): ``over_budget``
  when it is alone (it cannot be inflated within the budget at all), else
  ``busy``.  So a lone 1 MB bomb costs at most the budget, not the 2 GiB limit.
- Data after the end of the compressed stream (a second gzip member, garbage)
  is refused, never silently dropped: what the server reads is what was sent.
- Errors are ``InflateError`` with a kind (``corrupt``, ``truncated``,
  ``too_large``, ``trailing``, ``over_budget``, ``busy``) that each frontend turns into its own status.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections import deque
from collections.abc import Callable

#: Output bytes of one message inflated on the event loop before the rest moves to the pool
#: (about 0.2 ms of zlib; a message under it is answered without a thread hop).
ON_LOOP_BYTES = 64 * 1024
#: Output of one zlib call and of one turn in the pool: small, so that the GIL is released often and a
#: message waiting behind others gets its turn soon.
STEP_BYTES = 1024 * 1024
#: Threads that inflate large messages, for the whole server.
POOL_THREADS = 2
#: Messages in the pool (inflating or waiting for their turn) at once; one more is refused.
MAX_WAITING = 16
#: Inflated bytes all messages being inflated may hold together (--max-inflated-request-bytes).
BUDGET_BYTES = 128 * 1024 * 1024


class InflateError(Exception):
    """A compressed message that cannot be read: ``kind`` is corrupt, truncated, too_large, trailing or busy."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Inflation:
    """One compressed message, inflated in steps of bounded output."""

    __slots__ = ("_zlib", "_pending", "_out", "limit", "name", "refused")

    def __init__(self, data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> None:
        self._zlib = zlib.decompressobj(wbits)
        self._pending: bytes | bytearray | memoryview = data
        self._out = bytearray()
        self.limit = limit
        self.name = name
        #: Set by the pool (under its lock) when the budget needs this message's bytes back.
        self.refused: InflateError | None = None

    @property
    def size(self) -> int:
        return len(self._out)

    def step(self, budget: int | None) -> bool:
        """Inflate up to ``budget`` more output bytes (all when None); True once the message is complete."""
        produced = 0
        out = self._out
        while True:
            room = self.limit + 1 - len(out)
            want = min(room, STEP_BYTES) if budget is None else min(room, STEP_BYTES, budget - produced)
            try:
                chunk = self._zlib.decompress(self._pending, want)
            except zlib.error as exc:
                raise InflateError("corrupt", f"corrupt {self.name} data: {exc}") from None
            self._pending = self._zlib.unconsumed_tail
            out += chunk  # (copy: into the one buffer, which grows in place)
            produced += len(chunk)
            if len(out) > self.limit:
                raise InflateError("too_large", f"decompressed message larger than the limit of {self.limit} bytes")
            if self._zlib.eof:
                if self._zlib.unused_data:
                    raise InflateError(
                        "trailing",
                        f"{len(self._zlib.unused_data)} bytes follow the end of the {self.name} stream "
                        "(a second gzip member or other trailing data is not read)",
                    )
                return True
            if not chunk and not self._pending:
                raise InflateError("truncated", f"truncated {self.name} data")
            if budget is not None and produced >= budget:
                return False

    def result(self) -> bytearray:
        out, self._out = self._out, bytearray()
        return out

    def release(self) -> None:
        """Drop what was inflated (the message was refused)."""
        self._out = bytearray()


Done = Callable[[bytearray | InflateError], None]


class InflationPool:
    """The server's inflation threads: messages take turns of ``STEP_BYTES``; bounded in count and bytes."""

    def __init__(self, threads: int = POOL_THREADS, budget: int = BUDGET_BYTES, max_waiting: int = MAX_WAITING) -> None:
        self.threads = threads
        self.budget = budget
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._line: deque[tuple[Inflation, Done]] = deque()
        #: Messages in the pool (waiting or inflating) and the inflated bytes they hold.
        self._active: set[Inflation] = set()
        self.held = 0
        self.refused = 0
        self._started = 0

    def submit(self, inflation: Inflation, done: Done) -> InflateError | None:
        """Inflate the rest of ``inflation`` in turns; ``done`` (in a pool thread) gets the buffer or the error.

        An error now (nothing queued, ``done`` never called) when the pool already holds ``max_waiting``."""
        with self._cond:
            if len(self._active) >= self.max_waiting:
                self.refused += 1
                return InflateError("busy", f"{len(self._active)} compressed requests are being inflated; "
                                            "try again shortly")
            self._active.add(inflation)
            self.held += inflation.size
            self._line.append((inflation, done))
            if self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._work, name="fastoip-inflate", daemon=True).start()
            self._cond.notify()
        return None

    def run_here(self, inflation: Inflation) -> bytearray:
        """The whole message inflated in this thread (for callers already off the loop), counted in the budget."""
        with self._cond:
            self._active.add(inflation)
            self.held += inflation.size
        while True:
            error: InflateError | None = None
            before = inflation.size
            try:
                complete = inflation.step(STEP_BYTES)
            except InflateError as exc:
                error, complete = exc, False
            with self._cond:
                self.held += inflation.size - before
                if error is None:
                    self._over_budget()
                    error = inflation.refused
                if error is not None or complete:
                    self._leave(inflation)
            if error is not None:
                inflation.release()
                raise error
            if complete:
                return inflation.result()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._line:
                    self._cond.wait()
                inflation, done = self._line.popleft()
                error = inflation.refused
            before = inflation.size
            complete = False
            if error is None:
                try:
                    complete = inflation.step(STEP_BYTES)
                except InflateError as exc:
                    error = exc
                except Exception as exc:  # a bug: the message fails, the thread lives
                    error = InflateError("corrupt", f"inflating the message failed: {exc}")
            with self._cond:
                self.held += inflation.size - before
                if error is None:
                    self._over_budget()
                    error = inflation.refused
                if error is not None or complete:
                    self._leave(inflation)
                else:
                    self._line.append((inflation, done))  # to the back of the line: the others' turn
            if error is not None:
                inflation.release()
                done(error)
            elif complete:
                done(inflation.result())

    def _over_budget(self) -> None:
        """Past the budget: the message holding the most is refused (under the lock)."""
        if self.held <= self.budget:
            return
        largest = max(self._active, key=lambda each: each.size)
        if largest.refused is not None:
            return  # already refused; its bytes leave at its next turn
        self.refused += 1
        if len(self._active) == 1:
            largest.refused = InflateError(
                "over_budget", f"the decompressed message passes {self.budget} bytes, the server's budget for "
                             "inflating requests (--max-inflated-request-bytes)")
        else:
            largest.refused = InflateError(
                "busy", f"compressed requests being inflated hold more than {self.budget} bytes "
                        "(--max-inflated-request-bytes); this one holds the most: try again shortly")

    def _leave(self, inflation: Inflation) -> None:
        self._active.discard(inflation)
        self.held -= inflation.size


_pool: InflationPool | None = None
_pool_lock = threading.Lock()


def pool() -> InflationPool:
    """The server's inflation pool (its threads start on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = InflationPool()
        return _pool


def configure(budget: int) -> None:
    """Set the server-wide budget (--max-inflated-request-bytes) before the frontends start."""
    pool().budget = max(budget, STEP_BYTES)


async def inflate(data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> bytearray:
    """The whole message inflated: the first ``ON_LOOP_BYTES`` here, the rest in the inflation pool."""
    inflation = Inflation(data, wbits, limit, name)
    if inflation.step(ON_LOOP_BYTES):
        return inflation.result()
    loop = asyncio.get_running_loop()
    future: asyncio.Future[bytearray] = loop.create_future()

    def settle(outcome: bytearray | InflateError) -> None:
        if future.done():
            return
        if isinstance(outcome, InflateError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def done(outcome: bytearray | InflateError) -> None:
        loop.call_soon_threadsafe(settle, outcome)

    refusal = pool().submit(inflation, done)
    if refusal is not None:
        raise refusal
    return await future


def inflate_now(data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> bytearray:
    """The whole message inflated in this thread (for callers already off the loop), within the budget."""
    return pool().run_here(Inflation(data, wbits, limit, name))

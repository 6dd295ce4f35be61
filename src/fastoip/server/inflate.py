"""Inflating a client's compressed message (gzip / deflate) for both frontends, bounded and off the loop.

Rules:
- Never more than ``limit`` bytes come out (the message or body limit): zlib's
  ``max_length`` stops inflating at ``limit + 1`` bytes, so a bomb costs at most
  the limit in memory and time, never its claimed size.
- The event loop inflates at most ``ON_LOOP_BYTES`` of output of one message;
  the rest is inflated in a small pool of its own (``POOL_THREADS``, shared by
  both frontends; zlib releases the GIL there), so one client's bomb never
  stalls the others, and at most ``POOL_THREADS`` large messages are being
  inflated (held twice in memory while their pieces are joined) at any time.
- Data after the end of the compressed stream (a second gzip member, garbage)
  is refused, never silently dropped: what the server reads is what was sent.
- Errors are ``InflateError`` with a kind (``corrupt``, ``truncated``,
  ``too_large``, ``trailing``) that each frontend turns into its own status.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

#: Output bytes of one message inflated on the event loop before the rest moves to a worker thread
#: (about 0.2 ms of zlib; a message under it is answered without a thread hop).
ON_LOOP_BYTES = 64 * 1024
#: Output of one zlib call: small, so that the GIL (held while zlib's output blocks are put together) is
#: released often; the final join of a large message releases it too (bytes.join above 1 MiB).
STEP_BYTES = 1024 * 1024

#: Threads that inflate large messages, for the whole server.
POOL_THREADS = 2

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The server's inflation pool (started on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="fastoip-inflate")
        return _pool


class InflateError(Exception):
    """A compressed message that cannot be read: ``kind`` is corrupt, truncated, too_large or trailing."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Inflation:
    """One compressed message, inflated in steps of bounded output."""

    __slots__ = ("_zlib", "_pending", "_parts", "_size", "limit", "name")

    def __init__(self, data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> None:
        self._zlib = zlib.decompressobj(wbits)
        self._pending: bytes | bytearray | memoryview = data
        self._parts: list[bytes] = []
        self._size = 0
        self.limit = limit
        self.name = name

    def step(self, budget: int | None) -> bool:
        """Inflate up to ``budget`` more output bytes (all when None); True once the message is complete."""
        produced = 0
        while True:
            room = self.limit + 1 - self._size
            want = min(room, STEP_BYTES) if budget is None else min(room, STEP_BYTES, budget - produced)
            try:
                chunk = self._zlib.decompress(self._pending, want)
            except zlib.error as exc:
                raise InflateError("corrupt", f"corrupt {self.name} data: {exc}") from None
            self._pending = self._zlib.unconsumed_tail
            self._parts.append(chunk)
            self._size += len(chunk)
            produced += len(chunk)
            if self._size > self.limit:
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

    def result(self) -> bytes:
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def finish(self) -> bytes:
        """Inflate the rest and return the whole message (in a worker thread: the join is large too)."""
        self.step(None)
        return self.result()


async def inflate(data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> bytes:
    """The whole message inflated: the first ``ON_LOOP_BYTES`` here, the rest in the inflation pool."""
    inflation = Inflation(data, wbits, limit, name)
    if inflation.step(ON_LOOP_BYTES):
        return inflation.result()
    return await asyncio.get_running_loop().run_in_executor(pool(), inflation.finish)


def inflate_now(data: bytes | bytearray | memoryview, wbits: int, limit: int, name: str) -> bytes:
    """The whole message inflated in this thread (for callers already off the loop)."""
    inflation = Inflation(data, wbits, limit, name)
    inflation.step(None)
    return inflation.result()

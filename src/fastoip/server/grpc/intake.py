"""Request messages of the native frontend on their way to the calls: checked, inflated, kept in order.

Rules (issue 27):
- The compressed flag is 0 or 1; any other value is a protocol error (INTERNAL).
- A unary call takes one request message: a second one is refused at once
  (INTERNAL, as grpc-java answers "Too many requests"), never buffered.
- A compressed message is inflated within the message limit; the event loop
  inflates at most ``server.inflate.ON_LOOP_BYTES`` of it, the rest runs in
  the server's inflation pool, so one client's bomb never stalls the others.
- While one message of a stream is inflating, that stream's later messages
  and its end wait behind it: a call sees its messages in the order sent.
- Compressed bytes waiting for the pool are bounded across the server
  (``WAITING_LIMIT``): above it a message is refused with RESOURCE_EXHAUSTED;
  so is one the pool refuses (issue 37: its queue is full, or the server-wide
  inflation budget needs its bytes back), at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from ..inflate import ON_LOOP_BYTES, InflateError, Inflation, pool
from . import protocol as wire  # gRPC over HTTP/2 rules (fastoip.wire is the codecs)

#: Compressed bytes of messages queued for (or inflating in) the pool, all connections together.
WAITING_LIMIT = 64 * 1024 * 1024

_waiting = 0  # touched only on the frontend's loop thread


class Receiver(Protocol):
    """What the intake hands messages to: the connection."""

    loop: asyncio.AbstractEventLoop

    def deliver_message(self, stream_id: int, data: wire.Payload) -> None: ...
    def deliver_end(self, stream_id: int, leftover: int) -> None: ...
    def refuse_message(self, stream_id: int, code: int, message: str) -> None: ...
    def flush(self) -> None: ...


class MessageIntake:
    """One connection's request messages between nghttp2 and the calls."""

    def __init__(self, receiver: Receiver, limit: int) -> None:
        self.receiver = receiver
        self.limit = limit
        #: Streams with a message inflating in the pool -> what arrived after it (None: the request's end).
        self.behind: dict[int, deque[tuple[wire.Payload | None, int, bytes]]] = {}
        #: Unary streams that already have their one message.
        self.have_one: set[int] = set()

    def message(self, stream_id: int, streaming: bool, data: wire.Payload, flag: int, encoding: bytes) -> None:
        if flag not in (0, 1):
            self.receiver.refuse_message(stream_id, wire.INTERNAL, f"invalid gRPC compressed flag {flag}")
            return
        if not streaming:
            if stream_id in self.have_one:
                self.forget(stream_id)
                self.receiver.refuse_message(
                    stream_id, wire.INTERNAL, "a unary call takes one request message; a second one arrived")
                return
            self.have_one.add(stream_id)
        queue = self.behind.get(stream_id) if self.behind else None  # (nothing inflating: no lookup)
        if queue is not None:
            queue.append((data, flag, encoding))
            return
        if flag:
            self._inflate(stream_id, data, encoding)
        else:
            self.receiver.deliver_message(stream_id, data)

    def end(self, stream_id: int, leftover: int) -> None:
        self.have_one.discard(stream_id)
        queue = self.behind.get(stream_id) if self.behind else None
        if queue is not None:
            queue.append((None, leftover, b""))
        else:
            self.receiver.deliver_end(stream_id, leftover)

    def forget(self, stream_id: int) -> None:
        """The stream is gone: what waits behind its inflation is dropped (the inflation's result too)."""
        if self.have_one:
            self.have_one.discard(stream_id)
        if self.behind:
            self.behind.pop(stream_id, None)

    def _inflate(self, stream_id: int, data: wire.Payload, encoding: bytes) -> None:
        """Inflate here up to ON_LOOP_BYTES; the rest in the pool, holding the stream's later messages."""
        global _waiting
        try:
            inflation = Inflation(data, wire.wbits_for(encoding), self.limit, encoding.decode("latin-1"))
            if inflation.step(ON_LOOP_BYTES):
                self.receiver.deliver_message(stream_id, inflation.result())
                return
        except wire.DecompressError as exc:
            self.receiver.refuse_message(stream_id, exc.code, exc.message)
            return
        except InflateError as exc:
            error = wire.inflate_error(exc)
            self.receiver.refuse_message(stream_id, error.code, error.message)
            return
        size = len(data)
        if _waiting + size > WAITING_LIMIT:
            self.receiver.refuse_message(
                stream_id, wire.RESOURCE_EXHAUSTED,
                f"more than {WAITING_LIMIT} bytes of compressed messages wait to be inflated; try again later")
            return
        loop = self.receiver.loop

        def done(outcome: bytearray | InflateError) -> None:
            loop.call_soon_threadsafe(self._inflated, stream_id, outcome, size)

        refusal = pool().submit(inflation, done)
        if refusal is not None:
            failed = wire.inflate_error(refusal)
            self.receiver.refuse_message(stream_id, failed.code, failed.message)
            return
        _waiting += size
        self.behind[stream_id] = deque()

    def _inflated(self, stream_id: int, outcome: bytearray | InflateError, size: int) -> None:
        global _waiting
        _waiting -= size
        queue = self.behind.pop(stream_id, None)
        if queue is None:
            return  # the stream went away meanwhile
        if isinstance(outcome, InflateError):
            failed = wire.inflate_error(outcome)
            self.receiver.refuse_message(stream_id, failed.code, failed.message)
        else:
            self.receiver.deliver_message(stream_id, outcome)
            self._release(stream_id, queue)
        self.receiver.flush()

    def _release(self, stream_id: int, queue: deque[tuple[wire.Payload | None, int, bytes]]) -> None:
        """Hand over what waited behind an inflation, until the next one that needs the pool."""
        while queue:
            data, number, encoding = queue.popleft()
            if data is None:
                self.receiver.deliver_end(stream_id, number)
            elif number:
                self._inflate(stream_id, data, encoding)
            else:
                self.receiver.deliver_message(stream_id, data)
            if stream_id in self.behind:  # a new inflation holds the rest
                self.behind[stream_id].extend(queue)
                return

"""Length-prefixed messages on a stream socket between the server and a worker, in as few system calls as may be.

Rules:
- A message is a 4-byte big-endian length and that many bytes (the framing
  ``multiprocessing.connection`` uses), sent with one ``sendall`` when small.
- A receive asks the socket for up to :data:`CHUNK` bytes at a time and keeps
  what arrived beyond the message for the next one: a small message costs one
  ``recv`` (``multiprocessing.connection`` makes two: length, then body).
- One reader at a time (the callers hold their read locks); ``poll`` is also
  true while a whole message is already buffered.
- ``send_many`` joins several small messages into one ``sendall``;
  ``try_send_many`` sends without waiting and gives back what did not fit.
- ``recv_ready`` never waits: every whole message already here, for a reader
  on an event loop (which is told when the socket is readable).
- Every length is checked against the socket's ``limit`` (:data:`FRAME_LIMIT`)
  before a byte of the message is read or a buffer made for it, both ways:
  :class:`FrameTooLarge` (a worker that writes a 4 GiB length is ended, not
  waited for).
"""

from __future__ import annotations

import select
import socket
import struct

_LENGTH = struct.Struct("!I")
#: Bytes asked of the socket per receive, into a buffer kept for it (no allocation per receive).
CHUNK = 64 * 1024
#: Messages up to this size go out with their length in one ``sendall`` (one copy of a small message).
JOIN_LIMIT = 64 * 1024
#: The longest message either side sends or reads (a larger tensor crosses through shared memory).
FRAME_LIMIT = 1 << 30


class FrameTooLarge(ValueError):
    """A message's length is over the limit (sent: the message is refused; read: the other side lies)."""



class FramedSocket:
    """Messages on one end of a socket pair."""

    def __init__(self, sock: socket.socket, limit: int = FRAME_LIMIT) -> None:
        self._sock = sock
        self.limit = limit
        self._buffer = bytearray()
        self._scratch = bytearray(CHUNK)
        self._view = memoryview(self._scratch)

    def check(self, length: int) -> int:
        """``length`` when a message that long may cross; FrameTooLarge when it may not."""
        return self._check(length)

    def _check(self, length: int) -> int:
        if length > self.limit:
            raise FrameTooLarge(f"a message of {length} bytes is over the channel's limit of {self.limit}")
        return length

    def send_bytes(self, data: bytes) -> None:
        header = _LENGTH.pack(self._check(len(data)))
        if len(data) <= JOIN_LIMIT:
            self._sendall(header + data)
        else:
            self._sendall(header)
            self._sendall(data)

    def send_many(self, messages: list[bytes]) -> None:
        """Several messages, in one ``sendall`` when they are small together (one wake-up of the reader)."""
        if len(messages) == 1:
            self.send_bytes(messages[0])
            return
        total = 0
        for data in messages:
            total += self._check(len(data))
        if total > JOIN_LIMIT:
            for data in messages:
                self.send_bytes(data)
            return
        self._sendall(_framed(messages))

    def try_send_many(self, messages: list[bytes]) -> memoryview | None:
        """Send what the socket takes now, without waiting; the bytes it did not take (None: all went)."""
        for data in messages:
            self._check(len(data))
        joined = _framed(messages)
        try:
            sent = self._sock.send(joined, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        return None if sent == len(joined) else memoryview(joined)[sent:]

    def framed(self, messages: list[bytes]) -> bytes:
        """``messages`` as they go on the socket (each behind its length), for a later ``send_raw``."""
        for data in messages:
            self._check(len(data))
        return _framed(messages)

    def send_raw(self, data: bytes | memoryview) -> None:
        """Framed bytes (the rest of :meth:`try_send_many`), waiting until all are sent."""
        self._sendall(data)

    def _sendall(self, data: bytes | memoryview) -> None:
        """``sendall`` that also waits when the descriptor is non-blocking (an event loop that watched it for
        reading set it so: the flag belongs to the socket, whichever thread writes)."""
        view = memoryview(data)  # (socket.sendall would not say how much went before EAGAIN)
        while view:
            try:
                sent = self._sock.send(view)
                view = view[sent:]  # (not in one expression: mypyc evaluates a call inside a slice twice)
            except BlockingIOError:
                self._wait(select.POLLOUT)

    def _wait(self, event: int) -> None:
        poller = select.poll()
        poller.register(self._sock, event)
        poller.poll()

    def _recv_into(self) -> int:
        """``recv_into`` the kept buffer, waiting also when the descriptor is non-blocking."""
        while True:
            try:
                return self._sock.recv_into(self._view)
            except BlockingIOError:
                self._wait(select.POLLIN)

    def blocking(self) -> None:
        """Make the descriptor blocking again (after an event loop watched it)."""
        self._sock.setblocking(True)

    def _complete(self) -> int:
        """The end of the first buffered message when it is all here, else 0."""
        buffer = self._buffer
        if len(buffer) < 4:
            return 0
        end = 4 + self._check(_LENGTH.unpack_from(buffer)[0])
        return end if len(buffer) >= end else 0

    def has_message(self) -> bool:
        """Whether a whole message is already buffered (the next ``recv_bytes`` makes no system call)."""
        return self._complete() != 0

    def recv_bytes(self) -> bytearray:
        """The next message; EOFError when the other side closed, FrameTooLarge when it announced a message over
        the limit."""
        buffer = self._buffer
        while True:
            end = self._complete()
            if end:
                data = buffer[4:end]  # (a bytearray: one copy; msgpack and numpy take it as they take bytes)
                del buffer[:end]
                return data
            missing = (4 + _LENGTH.unpack_from(buffer)[0] - len(buffer)) if len(buffer) >= 4 else 4
            if missing > CHUNK:  # a large message: the rest of it at once
                while True:
                    try:
                        chunk = self._sock.recv(missing)
                        break
                    except BlockingIOError:
                        self._wait(select.POLLIN)
                if not chunk:
                    raise EOFError("the other side closed the channel")
                buffer.extend(chunk)
                continue
            count = self._recv_into()
            if not count:
                raise EOFError("the other side closed the channel")
            buffer.extend(self._view[:count])

    def recv_ready(self) -> tuple[list[bytearray], bool]:
        """Without waiting: every whole message buffered or in the socket now, and whether the other side closed
        (a partial message stays buffered for the next call); FrameTooLarge as ``recv_bytes``."""
        buffer = self._buffer
        closed = False
        while True:
            try:
                count = self._sock.recv_into(self._view, CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                closed = True
                break
            if not count:
                closed = True
                break
            buffer.extend(self._view[:count])
            if count < CHUNK:  # the socket is (almost surely) empty: spare the call that would say so
                break
        messages = []
        while True:
            end = self._complete()
            if not end:
                break
            messages.append(buffer[4:end])
            del buffer[:end]
        return messages, closed

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message (or the end) can be read now, waiting up to ``timeout`` seconds."""
        if self._complete():
            return True
        readable, _, _ = select.select([self._sock], [], [], timeout)
        return bool(readable)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


def _framed(messages: list[bytes]) -> bytes:
    """The messages joined, each behind its length."""
    parts = []
    for data in messages:
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)

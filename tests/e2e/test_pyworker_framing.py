"""fastoip.pyworker.framing on a real socket pair: the server's end of a worker's channel, as an event loop leaves
it (non-blocking: uvloop's ``add_reader`` sets the flag on the descriptor, which every thread then shares).

A write that the socket cannot take at once must neither raise nor lose or reorder bytes, a reader thread must
wait for data instead of failing with EAGAIN, and ``try_send_many`` / ``recv_ready`` never wait."""

from __future__ import annotations

import socket
import threading

import pytest

from fastoip.pyworker.framing import FramedSocket

pytestmark = pytest.mark.timeout(60)


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return a, b


def test_writes_on_a_non_blocking_descriptor_wait_for_room_and_keep_order() -> None:
    a, b = _pair()
    sender, receiver = FramedSocket(a), FramedSocket(b)
    a.setblocking(False)  # as the event loop leaves the server's end
    messages = [bytes([i % 251]) * (1000 + 37 * i) for i in range(200)]  # far more than the buffers hold
    got: list[bytes] = []

    def read() -> None:
        for _ in messages:
            got.append(receiver.recv_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(0, len(messages), 3):
        sender.send_many(messages[i:i + 3])
    reader.join(30)
    assert got == messages


def test_a_reader_waits_on_a_non_blocking_descriptor_instead_of_failing() -> None:
    a, b = _pair()
    sender, receiver = FramedSocket(a), FramedSocket(b)
    b.setblocking(False)
    timer = threading.Timer(0.2, lambda: sender.send_bytes(b"late"))
    timer.start()
    assert receiver.recv_bytes() == b"late"  # EAGAIN first: it waited
    big = b"x" * 300_000  # more than one receive's chunk, sent while the reader waits for it
    threading.Thread(target=sender.send_bytes, args=(big,)).start()
    assert receiver.recv_bytes() == big
    timer.join()


def test_try_send_many_gives_back_what_did_not_fit_and_recv_ready_never_waits() -> None:
    a, b = _pair()
    sender, receiver = FramedSocket(a), FramedSocket(b)
    assert receiver.recv_ready() == ([], False)  # nothing there: no wait
    assert sender.try_send_many([b"one", b"two"]) is None
    messages, closed = receiver.recv_ready()
    assert messages == [b"one", b"two"] and not closed
    rest = sender.try_send_many([b"y" * 200_000])  # more than the socket takes
    assert rest is not None and 0 < len(rest) < 200_004
    got: list[bytes] = []

    def drain() -> None:
        while not got:
            ready, _ = receiver.recv_ready()
            got.extend(ready)

    reader = threading.Thread(target=drain)
    reader.start()
    sender.send_raw(rest)
    reader.join(30)
    assert got == [b"y" * 200_000]
    a.close()
    assert receiver.recv_ready() == ([], True)


def test_each_message_arrives_once_and_nothing_stays_behind() -> None:
    """Every send writes its bytes once, and every receive takes what it returns out of the buffer (both went
    wrong once the module was compiled: mypyc evaluated a call inside a slice twice, and ``+=`` on a bytearray
    held in a local made a new one)."""
    a, b = socket.socketpair()
    sender, receiver = FramedSocket(a), FramedSocket(b)
    sender.send_bytes(b"one")
    sender.send_many([b"two", b"three"])
    sender.send_many([b"four"])
    got = [receiver.recv_bytes(), receiver.recv_bytes()]
    messages, closed = receiver.recv_ready()
    assert got + messages == [b"one", b"two", b"three", b"four"] and not closed
    assert receiver.recv_ready() == ([], False)
    b.setblocking(False)
    with pytest.raises(BlockingIOError):
        b.recv(1)  # nothing more was written

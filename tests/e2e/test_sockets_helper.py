"""tests/helpers/sockets.py: the close check that the connection-bound end-to-end tests lean on."""

from __future__ import annotations

import socket
import struct
import time

from sockets import closed_within


def test_a_close_after_data_counts_and_the_data_is_read_past() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        ours.settimeout(7.0)
        peer.sendall(b"x" * 100_000)  # more than one read
        peer.shutdown(socket.SHUT_WR)
        assert closed_within(ours, 10.0)
        assert ours.gettimeout() == 7.0  # the socket's own timeout is given back


def test_a_silent_peer_is_not_closed_and_the_wait_is_bounded() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        began = time.monotonic()
        assert not closed_within(ours, 0.3)
        assert 0.25 < time.monotonic() - began < 10.0
        assert ours.gettimeout() is None


def test_data_without_a_close_is_not_a_close() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.sendall(b"y" * 1000)
        assert not closed_within(ours, 0.3)


def test_a_reset_counts_as_closed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        ours = socket.create_connection(listener.getsockname(), timeout=5)
        accepted, _ = listener.accept()
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        accepted.close()  # linger 0: an RST, not a FIN
        with ours:
            assert closed_within(ours, 5.0)

"""The bench's HTTP/1.1 connection (``fastoip.bench.httpload._Conn``) frames responses with httptools' parser.

Real sockets: a raw TCP server writes exactly the bytes of each case (split across writes), the connection
parses them; the owner records what it was handed.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from fastoip.bench.httpload import _Conn


class Recorder:
    def __init__(self) -> None:
        self.sent = 0
        self.errors: list[str] = []

    def error(self, t: int, status: str) -> None:
        self.errors.append(status)


class Owner:
    """What HttpLoad gives a connection: a recorder, and the two callbacks."""

    def __init__(self, expected: int, done: asyncio.Event) -> None:
        self.recorder = Recorder()
        self.responses: list[tuple[int, int | None, bool, bytes]] = []
        self.expected = expected
        self.done = done

    def on_response(self, conn: _Conn, status: int, header_length: int | None, keep_alive: bool, body: bytes) -> None:
        self.responses.append((status, header_length, keep_alive, body))
        if len(self.responses) == self.expected:
            self.done.set()

    def on_lost(self, conn: _Conn) -> None:
        self.done.set()


def _serve_once(pieces: list[bytes]) -> int:
    """A TCP server that reads one request line, then writes ``pieces`` one by one, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)
                threading.Event().wait(0.01)  # separate reads on the client side
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return int(listener.getsockname()[1])


def _exchange(pieces: list[bytes], expected: int) -> Owner:
    async def main() -> Owner:
        done = asyncio.Event()
        owner = Owner(expected, done)
        port = _serve_once(pieces)
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(owner), "127.0.0.1", port)  # type: ignore[arg-type]
        conn.send(b"POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.wait_for(done.wait(), 10)
        conn.transport.close()
        return owner

    return asyncio.run(main())


def test_content_length_response_split_across_reads() -> None:
    response = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\": [1]}\n"
    owner = _exchange([response[:7], response[7:40], response[40:75], response[75:]], 1)
    assert owner.responses == [(200, None, True, b"{\"a\": [1]}\n")]


def test_a_header_value_saying_chunked_is_not_chunked_encoding() -> None:
    # the hand-written parser this replaced took any "chunked" in the head for chunked encoding
    response = b"HTTP/1.1 200 OK\r\nx-note: not chunked\r\ncontent-length: 2\r\n\r\nok"
    owner = _exchange([response], 1)
    assert owner.responses == [(200, None, True, b"ok")]


def test_chunked_body_with_trailers_then_a_second_response_on_the_same_connection() -> None:
    first = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ninference-header-content-length: 3\r\n\r\n"
             b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nx-trailer: y\r\n\r\n")
    second = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    owner = _exchange([first[:50], first[50:], second], 2)
    assert owner.responses == [(200, 3, True, b"abcdefg"), (503, None, False, b"")]


@pytest.mark.parametrize("garbage", [b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"])
def test_an_unparsable_response_is_a_bad_response(garbage: bytes) -> None:
    owner: Any = _exchange([garbage], 1)
    assert owner.responses == [] and owner.recorder.errors == ["BAD_RESPONSE"]

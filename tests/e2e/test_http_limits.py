"""The HTTP frontend against abusive connections: big and many headers, slow headers and bodies, idle
connections, framing errors, encoded separators, out-of-range FP32 JSON. Real sockets on a real server;
every refusal is ``{"error": ...}`` JSON, and a good request is served after each.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverproc import ServerProcess
from serving import assert_serving

pytestmark = pytest.mark.timeout(120)

HEADER_TIMEOUT = 1.5
BODY_TIMEOUT = 1.5
KEEP_ALIVE = 2.0
MAX_HEADER_BYTES = 64 * 1024  # the default
MAX_HEADER_COUNT = 100  # the default


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    args = ["--http-header-timeout", str(HEADER_TIMEOUT), "--http-body-timeout", str(BODY_TIMEOUT),
            "--http-keep-alive-timeout", str(KEEP_ALIVE)]
    with ServerProcess(demo_repo, *args, http=True) as proc:
        yield proc


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=15)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def error_of(body: bytes) -> str:
    doc = json.loads(body)
    assert list(doc) == ["error"]
    return str(doc["error"])


def exchange(server: ServerProcess, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(server) as sock:
        sock.sendall(raw)
        return read_response(sock)


def send_until_answered(sock: socket.socket, head: bytes, filler: bytes, limit: int) -> int:
    """Send ``head``, then ``filler`` in 16 KiB steps until the server answers (or ``limit`` bytes went out);
    the bytes sent. Steps wait for the server to read them, so it closes with nothing unread (no RST)."""
    sock.sendall(head)
    sent = len(head)
    while sent < limit:
        readable, _, _ = select.select([sock], [], [], 0.02)
        if readable:
            break
        sock.sendall(filler[:16384])
        sent += 16384
    return sent


# -- header size and count ---------------------------------------------------------------------------
def test_a_huge_header_is_refused_431_without_being_buffered(server: ServerProcess) -> None:
    with connect(server) as sock:
        sent = send_until_answered(sock, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * 16384,
                                   200 * 1024 * 1024)
        status, headers, body = read_response(sock)
        assert status == 431
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert "exceed 65536 bytes" in error_of(body) and "--http-max-header-size" in error_of(body)
        # refused after at most one read (uvloop reads up to 256 KiB) past the limit, not after 200 MB
        assert sent < MAX_HEADER_BYTES + 512 * 1024
        assert closed_by_server(sock, 5)
    assert_serving(server)


def test_a_long_url_counts_against_the_head_limit(server: ServerProcess) -> None:
    status, _, body = exchange(server, b"GET /v2/models/" + b"m" * (MAX_HEADER_BYTES + 10) + b" HTTP/1.1\r\n\r\n")
    assert status == 431 and "--http-max-header-size" in error_of(body)
    assert_serving(server)


def test_headers_just_under_the_limits_are_served(server: ServerProcess) -> None:
    status, _, _ = exchange(server, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000
                            + b"\r\n\r\n")
    assert status == 200
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADER_COUNT - 1))  # plus Host: exactly the limit
    status, _, _ = exchange(server, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert status == 200


def test_too_many_headers_are_refused_431(server: ServerProcess) -> None:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(10_000))
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + fields[:MAX_HEADER_COUNT * 12])
        time.sleep(0.2)
        status, headers, body = read_response(sock)
        assert status == 431 and headers["connection"] == "close"
        assert "too many header fields: more than 100" in error_of(body)
    assert_serving(server)


# -- timeouts --------------------------------------------------------------------------------------
async def _slowloris(port: int) -> tuple[float, bytes]:
    """Trickle header lines (never finishing the head) until the server answers; (seconds, answer)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = loop.time()
    writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
    answer = asyncio.ensure_future(reader.read())
    line = 0
    while not answer.done() and loop.time() - start < 15:
        try:
            writer.write(b"X-%d: y\r\n" % line)
            await writer.drain()
        except ConnectionError:
            break
        line += 1
        await asyncio.wait([answer], timeout=0.25)
    data = await asyncio.wait_for(answer, 10)
    writer.close()
    return loop.time() - start, data


def test_slowloris_connections_get_408_and_are_closed(server: ServerProcess) -> None:
    async def attack() -> list[tuple[float, bytes]]:
        return await asyncio.gather(*(_slowloris(server.http_port) for _ in range(50)))

    results = asyncio.run(attack())
    for elapsed, data in results:
        assert data.startswith(b"HTTP/1.1 408 "), data[:200]
        assert b"connection: close" in data and b"--http-header-timeout" in data
        assert HEADER_TIMEOUT - 0.1 <= elapsed < HEADER_TIMEOUT + 3.0
    assert_serving(server)


def test_a_stalled_body_gets_408_and_is_closed(server: ServerProcess) -> None:
    with connect(server) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ready\"")
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - start
        assert status == 408 and headers["connection"] == "close"
        assert "--http-body-timeout" in error_of(body)
        assert BODY_TIMEOUT - 0.1 <= elapsed < BODY_TIMEOUT + 3.0
        assert closed_by_server(sock, 5)
    assert_serving(server)


def test_a_slow_body_that_keeps_coming_is_served(server: ServerProcess) -> None:
    """The body timeout bounds the gap between reads, not the whole upload."""
    body = b'{"ready":    true}'
    with connect(server) as sock:
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        start = time.monotonic()
        for i in range(0, len(body), 6):
            time.sleep(BODY_TIMEOUT * 0.5)
            sock.sendall(body[i:i + 6])
        status, _, answer = read_response(sock)
        assert time.monotonic() - start > BODY_TIMEOUT  # longer than the timeout in all
        assert status == 200, answer
        assert any(entry["name"] == "simple" for entry in json.loads(answer))


def test_idle_connections_are_closed_after_the_keep_alive_timeout(server: ServerProcess) -> None:
    with connect(server) as used, connect(server) as fresh:
        used.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(used)[0] == 200
        start = time.monotonic()
        assert closed_by_server(used, KEEP_ALIVE + 3)
        assert closed_by_server(fresh, 3)  # a connection that never sent a byte is idle too
        assert KEEP_ALIVE - 0.5 <= time.monotonic() - start < KEEP_ALIVE + 3
    assert_serving(server)


def test_a_keep_alive_connection_serves_requests_back_to_back(server: ServerProcess) -> None:
    with connect(server) as sock:
        for _ in range(3):
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200
            time.sleep(KEEP_ALIVE / 2)  # under the idle timeout each time


# -- framing, paths, values ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
])
def test_framing_errors_are_json(server: ServerProcess, raw: bytes) -> None:
    status, headers, body = exchange(server, raw)
    assert status == 400 and headers["content-type"] == "application/json"
    assert error_of(body).startswith("malformed HTTP request: ")
    assert_serving(server)


def test_an_encoded_slash_is_not_a_path_separator(server: ServerProcess) -> None:
    status, _, body = exchange(server, b"GET /v2/models/simple%2Fconfig HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404 and "encoded '/'" in error_of(body)
    status, _, body = exchange(server, b"GET /v2/models/simple%2fready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404
    status, _, body = exchange(server, b"GET /v2/models/simple/config HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and json.loads(body)["name"] == "simple"
    status, _, body = exchange(server, b"GET /v2/models/sim%70le/config HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and json.loads(body)["name"] == "simple"  # other escapes still decode


def _fp32_request(values: list[float]) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32", "data": values}]}
    body = json.dumps(doc).encode()
    return (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def test_fp32_json_values_out_of_range_are_refused(server: ServerProcess) -> None:
    for bad in (1e39, -1e39, 3.5e38):
        status, _, body = exchange(server, _fp32_request([1.0] * 15 + [bad]))
        assert status == 400
        message = error_of(body)
        assert "input 'INPUT0'" in message and "FP32 values must lie in" in message
    status, _, body = exchange(server, _fp32_request([1.5] * 15 + [3.4e38]))
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"][-1] == pytest.approx(3.4e38, rel=1e-6)


def test_a_request_on_an_idle_connection_at_shutdown_is_answered(demo_repo: Path) -> None:
    """At the listener close an idle keep-alive connection lingers: a request the client had already written on it
    is answered (``connection: close``), not lost to a closed connection; new connections are refused."""
    with ServerProcess(demo_repo, "--shutdown-grace", "0.3", http=True) as proc:
        sock = connect(proc)
        ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(ready)
        assert read_response(sock)[0] == 200  # the connection is now idle, kept alive
        proc.signal()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait for the listener to close (readiness went false before)
            try:
                socket.create_connection(("127.0.0.1", proc.http_port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the listener did not close after SIGTERM")
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(sock)
        assert (status, headers.get("connection")) == (200, "close")
        assert closed_by_server(sock, within=5)
        sock.close()
        assert proc.proc is not None and proc.proc.wait(timeout=30) == 0

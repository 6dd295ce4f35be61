"""HTTP bodies must keep a minimum rate (issue 27): a byte every few seconds no longer holds a connection for ever.

Before, only pauses were bounded (--http-body-timeout), so a body sent one byte every 3 s kept its connection
open indefinitely.  Now, after --http-body-min-rate-grace, a body must average --http-body-min-rate bytes/s.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverproc import ServerProcess
from serving import assert_serving

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    args = ["--http-body-timeout", "10", "--http-body-min-rate", "100", "--http-body-min-rate-grace", "1"]
    with ServerProcess(demo_repo, *args, http=True) as proc:
        yield proc


def test_a_trickling_body_gets_408(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=15) as sock:
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        start = time.monotonic()
        refused = False
        while time.monotonic() - start < 8:
            try:
                sock.sendall(b" ")
            except OSError:
                refused = True
                break
            sock.settimeout(0.5)
            try:
                if sock.recv(4096, socket.MSG_PEEK):
                    refused = True
                    break
            except TimeoutError:
                pass
        elapsed = time.monotonic() - start
        assert refused, "a body of 2 bytes/s was kept for 8 s"
        sock.settimeout(5)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 408
        assert "--http-body-min-rate" in json.loads(response.read())["error"]
        assert elapsed < 5.0, elapsed
    assert_serving(server)


def test_a_body_at_the_rate_is_served(server: ServerProcess) -> None:
    body = b'{"ready": true}' + b" " * 985
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=15) as sock:
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 200):  # 400 bytes/s for 2.5 s
            time.sleep(0.5)
            sock.sendall(body[i:i + 200])
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200, response.read()
        assert any(entry["name"] == "simple" for entry in json.loads(response.read()))
    assert_serving(server)

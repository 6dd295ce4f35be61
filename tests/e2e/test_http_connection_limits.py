"""Idle connections cannot take the server's file descriptors (issue 27, finding 7).

Before: with the file limit at 1,024, 1,200 idle connections made every gRPC and HTTP probe fail (the HTTP
frontend had no connection cap; the accept loop ran out of descriptors).  Now the HTTP frontend holds at most
--http-max-connections (a quarter of the file limit by default) and closes the connection idle longest to admit a
new one; the native gRPC frontend holds at most half the file limit.  The attack is run with the server's file
limit lowered to 256 (prlimit): more idle connections than both caps, then probes on new connections.
"""

from __future__ import annotations

import http.client
import os
import socket
import time
from pathlib import Path

import pytest

from h2raw import MODEL_INFER, RawGrpcConnection, assert_good_request_on_new_connection
from serverproc import ServerProcess
from serving import assert_serving
from sockets import closed_within

pytestmark = pytest.mark.timeout(180)
FILE_LIMIT = 256


def limited(proc: ServerProcess, files: int) -> ServerProcess:
    """The server started under ``prlimit`` (it execs the server: same pid) with ``files`` descriptors."""
    proc.args = ["prlimit", f"--nofile={files}:{files}", "--", *proc.args]
    return proc


def health(port: int, timeout: float = 10.0) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", "/v2/health/ready")
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def open_idle(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    return socks


def still_open(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) != b""
    except TimeoutError:
        return True
    except OSError:
        return False


def test_idle_connections_past_both_caps_leave_probes_answered(demo_repo: Path, native_frontend: str) -> None:
    with limited(ServerProcess(demo_repo, "--grpc-handshake-timeout", "3000", http=True,
                               grpc_frontend=native_frontend), FILE_LIMIT) as proc:
        idle = open_idle(proc.http_port, 300) + open_idle(proc.grpc_port, 300)
        try:
            time.sleep(1.0)
            started = time.monotonic()
            assert health(proc.http_port) == 200, "an HTTP probe on a new connection was not answered"
            print(f"HTTP probe answered in {time.monotonic() - started:.3f} s past 600 idle connections")
            assert_serving(proc)
            # gRPC closes the connection longest without a call to admit this one
            assert_good_request_on_new_connection(proc.grpc_port)
            files = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))  # type: ignore[union-attr]
            print(f"server descriptors in use: {files} of {FILE_LIMIT}")
            assert files < FILE_LIMIT - 16, f"the server uses {files} of its {FILE_LIMIT} descriptors"
        finally:
            for sock in idle:
                sock.close()
        assert health(proc.http_port) == 200


def test_the_cap_closes_the_connection_idle_longest(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, "--http-max-connections", "8", http=True) as proc:
        first = open_idle(proc.http_port, 8)
        time.sleep(0.3)
        later = open_idle(proc.http_port, 4)  # each one closes one of the oldest idle connections
        time.sleep(0.5)
        assert sum(not still_open(sock) for sock in first) >= 4, "no idle connection was closed at the cap"
        assert all(still_open(sock) for sock in later), "a new connection was closed while idle ones were kept"
        # a connection with a request in progress is not closed for a newcomer
        busy = socket.create_connection(("127.0.0.1", proc.http_port), timeout=5)
        busy.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.2)
        crowd = open_idle(proc.http_port, 20)
        time.sleep(0.3)
        assert still_open(busy), "a connection with a request in progress was closed for a new one"
        for sock in first + later + crowd + [busy]:
            sock.close()
        status = health(proc.http_port)
        assert status == 200, status
        assert_serving(proc)  # the good request: a real inference over a new connection


def test_grpc_cap_closes_the_connection_longest_without_a_call(demo_repo: Path, native_frontend: str) -> None:
    with ServerProcess(demo_repo, "--grpc-max-connections", "6", "--grpc-handshake-timeout", "60000",
                       grpc_frontend=native_frontend) as proc:
        first = open_idle(proc.grpc_port, 6)
        time.sleep(0.3)
        later = open_idle(proc.grpc_port, 3)
        assert sum(closed_within(sock, 0.5) for sock in first[:3]) == 3, "the oldest idle connections were kept"
        assert not any(closed_within(sock, 0.2) for sock in later), "a new connection was closed, idle ones kept"
        for sock in first + later:
            sock.close()
        # connections with a call open are not closed for a newcomer: the newcomer is
        time.sleep(0.3)
        busy = [RawGrpcConnection(proc.grpc_port, timeout=5.0).handshake() for _ in range(6)]
        for conn in busy:
            conn.start_call(MODEL_INFER)  # the request never ends: a call stays open
        time.sleep(0.3)
        newcomer = socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=5)
        assert closed_within(newcomer, 2.0), "a connection past the cap was kept while every other had a call"
        newcomer.close()
        for conn in busy:
            conn.close()
        time.sleep(0.3)
        assert_good_request_on_new_connection(proc.grpc_port)

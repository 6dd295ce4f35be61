"""The metrics port is bounded (issue 27): idle connections no longer hold a thread each for ever."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from fastoip.server import metrics_http
from serverproc import ServerProcess
from sockets import closed_within

pytestmark = pytest.mark.timeout(120)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_idle_metrics_connections_are_capped_and_closed(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, metrics=True) as proc:
        idle = [socket.create_connection(("127.0.0.1", proc.metrics_port), timeout=5)
                for _ in range(metrics_http.MAX_CONNECTIONS)]
        time.sleep(0.5)
        extra = [socket.create_connection(("127.0.0.1", proc.metrics_port), timeout=5) for _ in range(20)]
        assert all(closed_within(sock, 3.0) for sock in extra), "connections over the cap were kept"
        began = time.monotonic()
        assert all(closed_within(sock, metrics_http.IDLE_TIMEOUT_S + 5) for sock in idle), "idle ones were kept"
        assert time.monotonic() - began < metrics_http.IDLE_TIMEOUT_S + 5
        for sock in idle + extra:
            sock.close()
        assert "nv_inference_request_success" in scrape(proc.metrics_port)

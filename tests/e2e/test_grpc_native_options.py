"""Connection management flags of the native gRPC frontend: --grpc-max-connection-age, --grpc-keepalive-time.

grpcio's frontend has neither flag, so these need the native frontend and skip without it.  The flags'
unit is read from ``fastoip serve --help`` (milliseconds, as Triton's keepalive flags, or seconds).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as tg

from h2raw import RawGrpcConnection, assert_good_request_on_new_connection, simple_request_bytes
from serverproc import ServerProcess, serve_help
from simple_model import ONES_16, simple_inputs

pytestmark = pytest.mark.timeout(120)

#: Generous: the server's timers plus a slow shared machine.
SLACK_S = 20.0


def one_second(flag: str) -> str:
    """The flag's value for one second, in the unit its --help names (ms/milliseconds, else seconds)."""
    text = serve_help()
    if flag not in text:
        pytest.skip(f"this build has no {flag}")
    start = text.index(f"\n  {flag} ")  # the option's own help entry, not its mention in the usage lines
    following = re.search(r"\n\s+--", text[start + len(flag):])
    paragraph = text[start : start + len(flag) + (following.start() if following else 400)]
    return "1000" if re.search(r"\bms\b|milli", paragraph) else "1"


@pytest.fixture(scope="module")
def aged_server(demo_repo: Path, native_frontend: str) -> Iterator[ServerProcess]:
    flag = "--grpc-max-connection-age"
    with ServerProcess(demo_repo, flag, one_second(flag), grpc_frontend=native_frontend) as proc:
        yield proc


@pytest.fixture(scope="module")
def keepalive_server(demo_repo: Path, native_frontend: str) -> Iterator[ServerProcess]:
    flag = "--grpc-keepalive-time"
    with ServerProcess(demo_repo, flag, one_second(flag), grpc_frontend=native_frontend) as proc:
        yield proc


def test_max_connection_age_sends_goaway(aged_server: ServerProcess) -> None:
    with RawGrpcConnection(aged_server.grpc_port, timeout=1.0) as conn:
        conn.handshake()
        started = time.monotonic()
        while conn.goaway is None and not conn.closed and time.monotonic() - started < 1 + SLACK_S:
            conn.receive_once(started + 1 + SLACK_S)
        assert conn.goaway is not None, "no GOAWAY on a connection older than --grpc-max-connection-age"
    assert_good_request_on_new_connection(aged_server.grpc_port)


def test_clients_ride_through_connection_ageing(aged_server: ServerProcess) -> None:
    """tritonclient reconnects after each GOAWAY: requests over several connection lifetimes all succeed."""
    client = tg.InferenceServerClient(aged_server.grpc_url)
    failures: list[str] = []
    done = 0
    started = time.monotonic()
    while time.monotonic() - started < 3.5:
        try:
            client.infer("simple", simple_inputs(tg, ONES_16, ONES_16))
            done += 1
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            failures.append(repr(exc))
        time.sleep(0.02)
    assert failures == []
    assert done > 10


def test_keepalive_pings_idle_connections(keepalive_server: ServerProcess) -> None:
    with RawGrpcConnection(keepalive_server.grpc_port, timeout=1.0) as conn:
        conn.handshake()
        started = time.monotonic()
        while conn.pings_received == 0 and not conn.closed and time.monotonic() - started < 1 + SLACK_S:
            conn.receive_once(started + 1 + SLACK_S)
        assert conn.pings_received >= 1, "no keepalive PING on an idle connection"
        # The PING was acknowledged (h2 does it): the connection stays up and still serves.
        result = conn.unary("/inference.GRPCInferenceService/ModelInfer", simple_request_bytes(), wait_s=30)
        assert result.status == 0

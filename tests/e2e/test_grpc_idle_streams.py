"""Streams that stop sending without END_STREAM or grpc-timeout end at --grpc-stream-idle-timeout (native frontend).

A raw HTTP/2 client (tests/h2raw.py) opens the streams a hostile or broken client would leave hanging; the
server answers each DEADLINE_EXCEEDED (or resets it) after the idle timeout, keeps a ModelStreamInfer
stream that idles between whole messages open, does not cut a slow upload that keeps making progress,
and serves a good request afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from h2raw import (
    MODEL_INFER,
    SERVICE,
    RawGrpcConnection,
    assert_good_request_on_new_connection,
    grpc_frame,
    simple_request_bytes,
)
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

IDLE_MS = 600
DEADLINE_EXCEEDED = 4


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, "--grpc-stream-idle-timeout", str(IDLE_MS), grpc_frontend="native") as proc:
        yield proc


def assert_idle_answer(conn: RawGrpcConnection, stream_id: int, started: float) -> None:
    result = conn.wait(stream_id, 10.0)
    waited = time.monotonic() - started
    assert result.finished, f"stream {stream_id} still open {waited:.1f} s later"
    assert result.status == DEADLINE_EXCEEDED, result
    assert "--grpc-stream-idle-timeout" in result.message, result.message
    assert IDLE_MS / 1000 * 0.9 <= waited <= IDLE_MS / 1000 * 1.25 + 3.0, waited


def test_unary_call_without_end_stream_is_answered(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        whole = conn.start_call(MODEL_INFER)  # no grpc-timeout
        conn.send_data(whole, grpc_frame(simple_request_bytes()), end_stream=False)
        half = conn.start_call(MODEL_INFER)
        conn.send_data(half, grpc_frame(simple_request_bytes())[:20], end_stream=False)
        started = time.monotonic()
        assert_idle_answer(conn, whole, started)
        assert_idle_answer(conn, half, started)
        # the connection itself still serves
        assert conn.unary(MODEL_INFER, simple_request_bytes(), wait_s=30).status == 0
    assert_good_request_on_new_connection(server.grpc_port)


def test_stream_may_idle_between_messages_but_not_inside_one(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(SERVICE + "ModelStreamInfer")
        conn.send_data(stream, grpc_frame(simple_request_bytes()), end_stream=False)
        conn.drain(3 * IDLE_MS / 1000)  # idle between messages, well past the timeout: left open
        result = conn.results[stream]
        assert not result.finished and len(result.messages) == 1, result
        conn.send_data(stream, grpc_frame(simple_request_bytes())[:30], end_stream=False)  # then stalls mid-message
        assert_idle_answer(conn, stream, time.monotonic())
        assert len(conn.results[stream].messages) == 1
    assert_good_request_on_new_connection(server.grpc_port)


def test_slow_upload_that_keeps_progressing_is_not_cut(server: ServerProcess) -> None:
    body = grpc_frame(simple_request_bytes())
    pieces = [body[i : i + 8] for i in range(0, len(body), 8)]
    step = (3 * IDLE_MS / 1000) / len(pieces)  # the whole upload takes three idle timeouts
    assert step < IDLE_MS / 1000 / 2
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(MODEL_INFER)
        for i, piece in enumerate(pieces):
            conn.send_data(stream, piece, end_stream=i == len(pieces) - 1)
            conn.drain(step)
        result = conn.wait(stream, 30.0)
        assert result.status == 0 and len(result.messages) == 1, result

"""Protocol abuse on raw sockets against each gRPC frontend: the server survives and keeps serving.

Every case ends with the same check: the server process is alive and a valid ModelInfer on a NEW
connection answers correctly.  Where the frontends may legitimately react differently (GOAWAY or a plain
close, RST_STREAM or an error status), the test asserts only the property both must have.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import hpack
import pytest
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from h2raw import (
    MODEL_INFER,
    SERVICE,
    RawGrpcConnection,
    assert_good_request_on_new_connection,
    grpc_frame,
    simple_request_bytes,
)
from serverproc import ServerProcess
from sockets import closed_within

pytestmark = pytest.mark.timeout(180)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Small enough that "over the limit" needs only a few MB on the wire.
MAX_MESSAGE = 4 * 1024 * 1024
#: Generous: a 2-core machine shared with other jobs.
SETTLE_S = 20.0
RESOURCE_EXHAUSTED = 8
DEADLINE_EXCEEDED = 4


@pytest.fixture(scope="module")
def server(demo_repo, grpc_frontend: str) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--grpc-max-message-size", str(MAX_MESSAGE), grpc_frontend=grpc_frontend) as proc:
        yield proc


def assert_still_serving(server: ServerProcess) -> None:
    assert server.proc is not None and server.proc.poll() is None, "server died:\n" + server.output()[-4000:]
    assert_good_request_on_new_connection(server.grpc_port)


def request_headers_block(server: ServerProcess, method: str = MODEL_INFER) -> bytes:
    return hpack.Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", server.grpc_url),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


def open_raw(server: ServerProcess) -> socket.socket:
    """A connection with a valid preface and empty SETTINGS, nothing else: the caller breaks the rest."""
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5.0)
    sock.sendall(PREFACE + SettingsFrame(0).serialize())
    return sock


def send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Send what the server still takes; False once it has closed on us (a valid reaction to abuse)."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


# -- before and around the preface -------------------------------------------------------------
@pytest.mark.parametrize(
    "garbage",
    [
        os.urandom(4096),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        PREFACE[:-3] + b"XX\n",
        b"\x00" * 9 + PREFACE,
    ],
    ids=["random", "http1", "broken-preface", "zeros-then-preface"],
)
def test_garbage_before_the_preface(server: ServerProcess, garbage: bytes) -> None:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5.0)
    try:
        send_quietly(sock, garbage)
        # A server must not wait forever for a preface that cannot come: it closes (grpcio and native alike).
        assert closed_within(sock, SETTLE_S), "connection with a broken preface was kept open"
    finally:
        sock.close()
    assert_still_serving(server)


def test_truncated_frames_held_open_do_not_block_others(server: ServerProcess) -> None:
    half_header = open_raw(server)
    send_quietly(half_header, b"\x00\x40\x00\x01")  # 4 of a frame header's 9 bytes
    short_body = open_raw(server)
    frame = HeadersFrame(1, data=request_headers_block(server), flags=["END_HEADERS"]).serialize()
    body_length = 16000
    send_quietly(short_body, body_length.to_bytes(3, "big") + frame[3:9] + frame[9:])  # length says 16000
    try:
        assert_still_serving(server)  # the truncated frames sit unread on their own connections
    finally:
        half_header.close()
        short_body.close()
    assert_still_serving(server)


# -- header blocks ----------------------------------------------------------------------------
def test_headers_without_end_headers_then_nothing(server: ServerProcess) -> None:
    sock = open_raw(server)
    try:
        send_quietly(sock, HeadersFrame(1, data=request_headers_block(server)).serialize())  # no END_HEADERS
        assert_still_serving(server)
    finally:
        sock.close()
    assert_still_serving(server)


def test_continuation_flood(server: ServerProcess) -> None:
    """An endless header block (CVE-2024-27316 style): the server must bound it, not buffer it all."""
    sock = open_raw(server)
    encoder = hpack.Encoder()
    padding = encoder.encode([(f"x-flood-{i}", "a" * 200) for i in range(40)])
    try:
        send_quietly(sock, HeadersFrame(1, data=request_headers_block(server)).serialize())
        sent = 0
        for index in range(10_000):
            frame = ContinuationFrame(1, data=padding[:8000], flags=["END_HEADERS"] if index == 9_999 else [])
            if not send_quietly(sock, frame.serialize()):
                break
            sent += 1
        closed_within(sock, 5.0)
    finally:
        sock.close()
    assert_still_serving(server)


# -- control frames ---------------------------------------------------------------------------
def test_ten_thousand_pings(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        burst = b"".join(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize() for i in range(10_000))
        send_quietly(conn.sock, burst)
        # Either every PING is acknowledged, or the server calls it abuse (GOAWAY ENHANCE_YOUR_CALM, as grpcio
        # does after 10,000; or a close): both are fine; a server that neither answers nor closes is not.
        deadline = time.monotonic() + SETTLE_S
        while conn.ping_acks < 10_000 and conn.goaway is None and not conn.closed and time.monotonic() < deadline:
            conn.receive_once()
        assert conn.ping_acks == 10_000 or conn.goaway is not None or conn.closed, conn.ping_acks
    assert_still_serving(server)


@pytest.mark.parametrize("target", ["connection", "stream"])
def test_window_update_overflow(server: ServerProcess, target: str) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = 0
        if target == "stream":
            stream_id = conn.start_call(SERVICE + "ModelStreamInfer")
        overflow = WindowUpdateFrame(stream_id, window_increment=2**31 - 1).serialize()
        send_quietly(conn.sock, overflow + overflow)  # the window passes 2^31-1: a FLOW_CONTROL_ERROR
        conn.drain(2.0)
    assert_still_serving(server)


@pytest.mark.parametrize(
    "settings",
    [
        {SettingCodes.INITIAL_WINDOW_SIZE: 2**31},
        {SettingCodes.MAX_FRAME_SIZE: 2**24},
        {SettingCodes.MAX_FRAME_SIZE: 1},
        {SettingCodes.ENABLE_PUSH: 7},
        {SettingCodes.HEADER_TABLE_SIZE: 2**32 - 1, SettingCodes.MAX_CONCURRENT_STREAMS: 2**32 - 1},
        {0xFFFF: 2**32 - 1, 0x0A: 2**32 - 1},
    ],
    ids=["window-2^31", "frame-2^24", "frame-1", "enable-push-7", "huge-tables", "unknown-ids"],
)
def test_settings_with_absurd_values(server: ServerProcess, settings: dict) -> None:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5.0)
    try:
        send_quietly(sock, PREFACE + SettingsFrame(0, settings={int(k): v for k, v in settings.items()}).serialize())
        time.sleep(0.5)
    finally:
        sock.close()
    assert_still_serving(server)


def test_extreme_but_valid_settings_still_serve_on_that_connection(server: ServerProcess) -> None:
    """Legal corner values (largest frame, largest window, huge HPACK table) on the client's side."""
    extreme = {
        SettingCodes.MAX_FRAME_SIZE: 2**24 - 1,
        SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1,
        SettingCodes.HEADER_TABLE_SIZE: 2**32 - 1,
        SettingCodes.MAX_CONCURRENT_STREAMS: 0,  # the server may not push: it never does anyway
    }
    with RawGrpcConnection(server.grpc_port, settings=extreme) as conn:
        conn.handshake()
        result = conn.unary(MODEL_INFER, simple_request_bytes(), wait_s=30)
        assert result.status == 0, (result.status, result.message)
    assert_still_serving(server)


# -- streams ----------------------------------------------------------------------------------
def test_stream_without_end_stream_is_bounded_by_its_deadline(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(SERVICE + "ModelStreamInfer", timeout="2S")
        conn.send_data(stream, grpc_frame(simple_request_bytes()), end_stream=False)
        partial = conn.start_call(MODEL_INFER, timeout="2S")
        conn.send_data(partial, grpc_frame(simple_request_bytes())[:20], end_stream=False)  # half a message
        started = time.monotonic()
        for stream_id in (stream, partial):
            result = conn.wait(stream_id, 2 + SETTLE_S)
            # Ended by the deadline: DEADLINE_EXCEEDED trailers, or a reset of the stream (both are how a gRPC
            # server ends a call whose deadline passed); never left hanging.
            assert result.finished, f"stream {stream_id} still open {time.monotonic() - started:.1f}s after start"
            assert result.status == DEADLINE_EXCEEDED or result.reset_code is not None, result
        # the one complete request on the stream was answered as it finished, long before the deadline
        assert len(conn.results[stream].messages) == 1
    assert_still_serving(server)


def test_rst_stream_storm(server: ServerProcess) -> None:
    """Rapid reset (CVE-2023-44487): open and cancel thousands of streams, half of them with a full request."""
    payload = grpc_frame(simple_request_bytes("storm"))
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        try:
            for index in range(3000):
                stream_id = conn.conn.get_next_available_stream_id()
                conn.conn.send_headers(
                    stream_id,
                    [(":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER),
                     (":authority", server.grpc_url), ("content-type", "application/grpc"), ("te", "trailers")],
                )
                if index % 2:
                    conn.conn.send_data(stream_id, payload, end_stream=True)
                conn.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
                if index % 100 == 99:
                    conn.flush()
                    conn.sock.settimeout(0.01)
                    conn.receive_once()  # take in WINDOW_UPDATEs and a possible GOAWAY
                    conn.sock.settimeout(5.0)
                    if conn.closed or conn.goaway is not None:
                        break
            conn.flush()
        except (OSError, ProtocolError):
            pass  # the server closed on us: a valid defence
        conn.drain(1.0)
    # A raw storm without h2's bookkeeping too: RST_STREAM frames for streams that never existed.
    sock = open_raw(server)
    try:
        send_quietly(sock, b"".join(RstStreamFrame(2 * i + 1, error_code=8).serialize() for i in range(5000)))
        closed_within(sock, 2.0)
    finally:
        sock.close()
    assert_still_serving(server)


def test_declared_message_length_larger_than_what_arrives(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call()
        conn.send_data(stream_id, grpc_frame(simple_request_bytes()[:40], declared_length=1000))  # then END_STREAM
        result = conn.wait(stream_id, SETTLE_S)
        assert result.finished
        # An error (grpcio: UNIMPLEMENTED "requires exactly one request message"), or a reset: never OK.
        assert result.status not in (None, 0) or result.reset_code is not None, result
    assert_still_serving(server)


@pytest.mark.parametrize("sent", ["prefix-only", "whole-message"])
def test_message_over_the_limit_is_resource_exhausted(server: ServerProcess, sent: str) -> None:
    too_big = MAX_MESSAGE + 1
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call()
        if sent == "prefix-only":  # the 5-byte prefix alone says too much: no need to wait for the body
            conn.send_data(stream_id, grpc_frame(b"\x0a", declared_length=too_big), end_stream=False)
        else:
            try:
                conn.send_data(stream_id, grpc_frame(b"\x00" * too_big), deadline_s=SETTLE_S)
            except (OSError, TimeoutError, ProtocolError):
                pass  # the server may answer and stop reading before all of it is sent
        result = conn.wait(stream_id, SETTLE_S)
        assert result.status == RESOURCE_EXHAUSTED, (result.status, result.message, result.reset_code)
        assert str(MAX_MESSAGE) in result.message or "larger than" in result.message.lower() or result.message
    assert_still_serving(server)


def test_slowloris_clients_do_not_stop_others(server: ServerProcess) -> None:
    stop = threading.Event()
    sockets: list[socket.socket] = []
    dribble = PREFACE + SettingsFrame(0).serialize() + HeadersFrame(
        1, data=request_headers_block(server), flags=["END_HEADERS"]
    ).serialize() + DataFrame(1, data=grpc_frame(simple_request_bytes())).serialize()

    def slow_client(index: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5.0)
        except OSError:
            return
        sockets.append(sock)
        if index % 2:
            return  # half of them connect and never send a byte
        for byte in dribble:
            if stop.wait(0.1) or not send_quietly(sock, bytes([byte])):
                return

    threads = [threading.Thread(target=slow_client, args=(i,), daemon=True) for i in range(50)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        for _ in range(20):  # others keep being served, each on a new connection
            assert_good_request_on_new_connection(server.grpc_port)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for sock in sockets:
            sock.close()
    assert_still_serving(server)

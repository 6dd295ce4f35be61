"""Request messages on both gRPC frontends (issue 27): one per unary call, bounded inflation, off the loop.

Each attack uses a raw HTTP/2 client (h2raw) and ends with a good request on a new connection; where the
finding was memory, the server's RSS is bounded.
"""

from __future__ import annotations

import gzip
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from fastoip._proto import grpc_service_pb2 as pb
from h2raw import MODEL_INFER, SERVICE, RawGrpcConnection, assert_good_request_on_new_connection, simple_request_bytes
from memory import RssSampler, rss_bytes
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(240)

MAX_MESSAGE = 4 * 1024 * 1024
INTERNAL = 13
UNIMPLEMENTED = 12
RESOURCE_EXHAUSTED = 8
GZIP = (("grpc-encoding", "gzip"),)


@pytest.fixture(scope="module")
def server(demo_repo, grpc_frontend: str) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--grpc-max-message-size", str(MAX_MESSAGE), grpc_frontend=grpc_frontend) as proc:
        yield proc


def framed(payload: bytes, flag: int) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def test_a_second_message_on_a_unary_call_is_refused_at_once(server: ServerProcess) -> None:
    """Before: every gzip message of a unary call that never ended was inflated and kept (2 MB on the wire
    took the server to 2.2 GB).  Now the second one ends the call; memory stays flat."""
    bomb = gzip.compress(b"\0" * (MAX_MESSAGE - 1024))  # about 4 KB on the wire, 4 MB inflated
    before = rss_bytes(server.proc.pid)  # type: ignore[union-attr]
    with RssSampler(server.proc.pid) as peak, RawGrpcConnection(server.grpc_port) as conn:  # type: ignore[union-attr]
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
        for _ in range(200):  # 800 MB if every message were kept
            if conn.results[stream_id].finished:
                break
            conn.send_data(stream_id, framed(bomb, 1), end_stream=False)
            conn.receive_once(time.monotonic() + 0.01)
        result = conn.wait(stream_id, 20)
    # grpcio (grpc-core) runs a unary handler on the first message and answers it (here: not a valid request)
    assert result.status not in (None, 0), (result.status, result.message, result.reset_code)
    if server.grpc_frontend == "native":
        assert result.status == INTERNAL and "one request message" in result.message, result.message
    assert peak.peak - before < 150 * 1024 * 1024, f"RSS grew by {(peak.peak - before) >> 20} MiB"
    assert_good_request_on_new_connection(server.grpc_port)


@pytest.mark.parametrize("flag", [2, 7, 255])
def test_compressed_flag_other_than_0_or_1_is_refused(server: ServerProcess, flag: int) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER)
        conn.send_data(stream_id, framed(simple_request_bytes(), flag))
        result = conn.wait(stream_id, 20)
    assert result.status is not None and result.status != 0 or result.reset_code is not None, result
    if server.grpc_frontend == "native":
        assert result.status == INTERNAL and f"compressed flag {flag}" in result.message, result.message
    assert_good_request_on_new_connection(server.grpc_port)


def test_a_trailing_gzip_member_is_not_ignored(server: ServerProcess) -> None:
    """Before: the native frontend read the first gzip member and dropped the rest silently."""
    payload = gzip.compress(simple_request_bytes()) + gzip.compress(b"more")
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
        conn.send_data(stream_id, framed(payload, 1))
        result = conn.wait(stream_id, 20)
    if server.grpc_frontend == "native":
        assert result.status == INTERNAL and "second gzip member" in result.message, result.message
    assert_good_request_on_new_connection(server.grpc_port)


def test_compressed_requests_still_work_small_and_large(server: ServerProcess) -> None:
    """Under and over the size that moves inflation off the loop: both answer, in order on a stream."""
    small = gzip.compress(simple_request_bytes())
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
        conn.send_data(stream_id, framed(small, 1))
        result = conn.wait(stream_id, 20)
        assert result.status == 0, (result.status, result.message)
        # A stream of compressed requests, each inflating past 64 KiB (a long id), answered in order.
        stream_id = conn.start_call(SERVICE + "ModelStreamInfer", extra=GZIP)
        ids = [f"{i:03d}" + "x" * 200_000 for i in range(3)]
        for request_id in ids:
            conn.send_data(stream_id, framed(gzip.compress(simple_request_bytes(request_id)), 1), end_stream=False)
        conn.send_data(stream_id, b"", end_stream=True)
        result = conn.wait(stream_id, 30)
    assert result.status == 0, (result.status, result.message)
    got = [pb.ModelStreamInferResponse.FromString(m).infer_response.id for m in result.messages]
    assert got == ids


def test_decompression_does_not_stall_other_clients(demo_repo, native_frontend: str) -> None:  # type: ignore[no-untyped-def]
    """Before: every gzip bomb was inflated on the event loop (about 3.5 s per GiB) and stalled every other
    client.  Now the loop inflates at most 64 KiB of a message; health checks keep answering meanwhile."""
    limit = 192 * 1024 * 1024
    bomb = gzip.compress(b"\0" * (limit - 1024), 1)
    with ServerProcess(demo_repo, "--grpc-max-message-size", str(limit), grpc_frontend=native_frontend) as proc:
        stalls: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            with RawGrpcConnection(proc.grpc_port) as other:
                other.handshake()
                while not stop.is_set():
                    began = time.monotonic()
                    result = other.unary("/grpc.health.v1.Health/Check", b"", wait_s=30)
                    stalls.append(time.monotonic() - began)
                    assert result.status == 0, (result.status, result.message)
                    time.sleep(0.005)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        time.sleep(0.3)
        began = time.monotonic()
        conns = [RawGrpcConnection(proc.grpc_port).handshake() for _ in range(4)]
        streams = []
        for conn in conns:
            stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
            conn.send_data(stream_id, framed(bomb, 1))
            streams.append(stream_id)
        results = [conn.wait(stream_id, 60) for conn, stream_id in zip(conns, streams, strict=True)]
        took = time.monotonic() - began
        stop.set()
        prober.join(30)
        for conn in conns:
            conn.close()
        for result in results:  # zeros are not a valid ModelInferRequest: the Core says so, after inflating
            assert result.status not in (None, 0), (result.status, result.message)
        longest = max(stalls)
        print(f"4 bombs of {limit >> 20} MiB inflated in {took:.2f} s; longest health-check stall {longest:.3f} s")
        assert longest < max(0.5, took / 3), (longest, took)
        assert_good_request_on_new_connection(proc.grpc_port)

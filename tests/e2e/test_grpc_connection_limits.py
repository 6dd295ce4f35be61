"""Server-wide bounds of the native gRPC frontend (issue 27, server/grpc/limits.py).

Before: idle connections were kept about 2 hours with no handshake timeout and no cap (1,200 idle connections
at a 1,024 file limit made every probe fail), and unsent responses were bounded per connection only (four
connections held 2 GB).  Each case ends with a good request on a new connection.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from h2.settings import SettingCodes

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from h2raw import MODEL_INFER, RawGrpcConnection, assert_good_request_on_new_connection, grpc_frame
from memory import RssSampler, rss_bytes
from serverproc import ServerProcess
from sockets import closed_within

pytestmark = pytest.mark.timeout(180)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ENHANCE_YOUR_CALM = 0xB
RESOURCE_EXHAUSTED = 8


def test_connection_cap_and_handshake_timeout(demo_repo, native_frontend: str) -> None:  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--grpc-max-connections", "20", "--grpc-handshake-timeout", "1500",
                       grpc_frontend=native_frontend, http=True) as proc:
        idle = [socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=5) for _ in range(20)]
        time.sleep(0.3)
        extra = [socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=5) for _ in range(10)]
        # over the cap, each new one closes the oldest without a call (tests/test_http_connection_limits.py)
        assert all(closed_within(sock, 1.0) for sock in idle[:10]), "the oldest idle connections were kept"
        # none ever sent a preface: the rest are closed by the handshake timeout
        assert all(closed_within(sock, 5.0) for sock in idle[10:] + extra), "connections without a preface were kept"
        for sock in idle + extra:
            sock.close()
        assert_good_request_on_new_connection(proc.grpc_port)


def test_a_connection_without_calls_gets_goaway(demo_repo, native_frontend: str) -> None:  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--grpc-max-connection-idle", "1000", grpc_frontend=native_frontend) as proc:
        with RawGrpcConnection(proc.grpc_port) as conn:
            conn.handshake()
            conn.drain(2.5)
            assert conn.goaway is not None, "an idle connection got no GOAWAY"
        assert_good_request_on_new_connection(proc.grpc_port)


def big_request() -> bytes:
    data = np.ones((4, 3, 224, 224), dtype=np.float32)  # 2.3 MiB in, 2.3 MiB out
    request = InferRequest("image_identity", inputs=[InferInput("INPUT0", "FP32", data.shape, data)])
    return grpc_frame(_codec.encode_infer_request(request))


def test_unsent_responses_are_bounded_across_the_server(demo_repo, native_frontend: str) -> None:  # type: ignore[no-untyped-def]
    """Four connections that never open their windows ask for 2.3 MiB answers: past 24 MiB held in all, the
    stream that queues more is reset (ENHANCE_YOUR_CALM); memory stays bounded."""
    limit = 24 * 1024 * 1024
    with ServerProcess(demo_repo, "--grpc-max-queued-response-bytes", str(limit),
                       grpc_frontend=native_frontend) as proc:
        payload = big_request()
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        conns, streams = [], []
        with RssSampler(proc.proc.pid) as peak:  # type: ignore[union-attr]
            for _ in range(4):
                conn = RawGrpcConnection(proc.grpc_port, settings={SettingCodes.INITIAL_WINDOW_SIZE: 0})
                conn.conn.initiate_connection()  # no connection window either: nothing of a response can leave
                conn.flush()
                for _ in range(4):
                    stream_id = conn.start_call(MODEL_INFER)
                    conn.send_data(stream_id, payload)
                    streams.append((conn, stream_id))
                conns.append(conn)
            for conn in conns:
                conn.drain(2.0)
        resets = [conn.results[s].reset_code for conn, s in streams]
        refused = [conn.results[s].status for conn, s in streams]
        for conn in conns:
            conn.close()
        grew = peak.peak - before
        print(f"16 x 2.3 MiB responses held by zero windows, limit 24 MiB: resets {resets}; RSS +{grew >> 20} MiB")
        assert resets.count(ENHANCE_YOUR_CALM) + refused.count(RESOURCE_EXHAUSTED) >= 4, (resets, refused)
        assert_good_request_on_new_connection(proc.grpc_port)

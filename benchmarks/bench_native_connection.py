#!/usr/bin/env python3
"""CPU per ModelInfer through the native frontend's connection and the Core, in one process, no socket.

A ``GrpcConnection`` on a fake transport is fed pre-built client frames (HEADERS + DATA of the demo
``simple`` request, 64 streams per read) and answers them through a real Core whose ``simple`` has no
batcher (``max_batch_size: 1``), so every request costs the same and the figure does not move with batch
sizes; ``--batcher`` keeps the demo's config (auto-complete's dynamic batcher) and holds the batcher's
wake-ups per pass of the loop as the server does.  ``--profile FILE`` writes a cProfile of the loop thread
(thread CPU time, so waits for the GIL do not count; the profiler's own clock reads inflate every figure).
CPU time of the whole process (all threads) per request, best of ``--reps`` (and of the loop's thread alone):
on a busy shared machine much steadier than throughput, and it isolates the frontend + Core from the load
generator.  ``--connections N`` feeds N connections one request each per pass, each its own read (h2load's
``-c N -m 1``) instead of one connection with ``--streams`` requests per read (``-c 1 -m 64``).

    PYTHONPATH=src python benchmarks/bench_native_connection.py --requests 3000 --reps 8 [--batcher]
    PYTHONPATH=src python benchmarks/bench_native_connection.py --connections 64   # h2load -c 64 -m 1
    PYTHONPATH=src python benchmarks/bench_native_connection.py --model image_identity --connections 64 --batcher

``--model image_identity``: the peer lab's 602 KB FP32 request to the demo's ``image_identity`` instead, in 16 KiB
DATA frames as h2load sends it (answers: 602 KB each, as the server writes them).  The process's malloc settings
are the server's (``fastoip.allocator``), as ``fastoip serve`` sets them.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np
from hpack import Encoder
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame, WindowUpdateFrame

from fastoip import _codec, allocator
from fastoip.core import Core
from fastoip.demo import write_repository
from fastoip.repository import RepositoryOptions
from fastoip.server.grpc import native_server
from fastoip.server.grpc.native_options import NativeGrpcOptions
from fastoip.types import InferInput, InferRequest

#: The client's preface with the largest flow-control windows (stream and connection), as a load generator opens:
#: with HTTP/2's default 64 KiB connection window a client that never acknowledges data would leave most answers
#: queued inside nghttp2, and the figure would leave out writing them.  It acknowledges the server's SETTINGS:
#: until then the server's own stream window is HTTP/2's 64 KiB, which a 602 KB request would overrun.
PREFACE = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
           + SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1}).serialize()
           + WindowUpdateFrame(0, window_increment=2**31 - 1 - 65_535).serialize()
           + SettingsFrame(0, flags=["ACK"]).serialize())
HEAD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


class NullTransport:
    """Enough of an asyncio transport for the connection; what it writes is counted and dropped."""

    written = 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def writelines(self, chunks: list[bytes]) -> None:
        self.written += sum(len(chunk) for chunk in chunks)

    def write(self, chunk: bytes) -> None:
        self.written += len(chunk)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def simple_message() -> bytes:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = InferRequest("simple", inputs=[InferInput("INPUT0", "INT32", a.shape, a),
                                             InferInput("INPUT1", "INT32", a.shape, a)])
    return grpc_message(request)


def image_identity_message() -> bytes:
    """The peer lab's 602 KB request: FP32 [1, 3, 224, 224] to the demo's ``image_identity``."""
    a = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    return grpc_message(InferRequest("image_identity", inputs=[InferInput("INPUT0", "FP32", a.shape, a)]))


MESSAGES = {"simple": simple_message, "image_identity": image_identity_message}


def grpc_message(request: InferRequest) -> bytes:
    body = _codec.encode_infer_request(request)
    return struct.pack(">BI", 0, len(body)) + body


#: CPU time of the loop's thread (this one) per rep, scaled to ``--requests`` as the process figure is.
LOOP_CPU: list[float] = []


def new_connection(server: native_server.NativeGrpcServer) -> tuple[native_server.GrpcConnection, NullTransport]:
    connection = native_server.GrpcConnection(server)
    transport = NullTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.receive(memoryview(PREFACE))
    return connection, transport


def busy(connection: native_server.GrpcConnection) -> bool:
    # ``calls``: the name before issue 22's restructuring, so the same script measures an older checkout
    return bool(getattr(connection, "streams", None) or getattr(connection, "calls", None))


def data_frames(stream_id: int, message: bytes) -> bytes:
    """The message as DATA frames of at most 16 KiB (HTTP/2's default frame size, as h2load sends), the last
    one with END_STREAM."""
    size = 16384
    pieces = [message[i:i + size] for i in range(0, len(message), size)] or [b""]
    return b"".join(DataFrame(stream_id, data=piece, flags=["END_STREAM"] if i == len(pieces) - 1 else [])
                    .serialize() for i, piece in enumerate(pieces))


def run_streams(server: native_server.NativeGrpcServer, message: bytes, requests: int, streams: int,
                profiler: Any) -> tuple[float, int]:
    """One connection, ``streams`` requests per read (h2load -c 1 -m streams)."""
    encoder = Encoder()
    frames = [HeadersFrame(1 + 2 * i, data=encoder.encode(HEAD), flags=["END_HEADERS"]).serialize()
              + data_frames(1 + 2 * i, message) for i in range(requests)]
    connection, transport = new_connection(server)

    async def drive() -> None:
        for start in range(0, len(frames), streams):
            connection.receive(memoryview(b"".join(frames[start:start + streams])))
            while busy(connection):  # the answers come back through the loop
                await asyncio.sleep(0.0005)

    elapsed = timed(server, drive(), profiler)
    connection.connection_lost(None)
    return elapsed, transport.written


def run_connections(server: native_server.NativeGrpcServer, message: bytes, requests: int, connections: int,
                    profiler: Any) -> tuple[float, int]:
    """``connections`` connections, one request each per pass, each its own read (h2load -c N -m 1)."""
    passes = max(requests // connections, 1)
    opened = [new_connection(server) for _ in range(connections)]
    encoders = [Encoder() for _ in range(connections)]
    reads = [[HeadersFrame(1 + 2 * i, data=encoder.encode(HEAD), flags=["END_HEADERS"]).serialize()
              + data_frames(1 + 2 * i, message) for i in range(passes)] for encoder in encoders]

    async def drive() -> None:
        for i in range(passes):
            for (connection, _), frames in zip(opened, reads, strict=True):
                connection.receive(memoryview(frames[i]))
            waiting = 0
            while waiting < len(opened):  # the answers come back through the loop
                if busy(opened[waiting][0]):
                    await asyncio.sleep(0.0005)
                else:
                    waiting += 1

    elapsed = timed(server, drive(), profiler)
    LOOP_CPU[-1] *= requests / (passes * connections)
    written = 0
    for connection, transport in opened:
        connection.connection_lost(None)
        written += transport.written
    return elapsed * requests / (passes * connections), written * requests // (passes * connections)


def timed(server: native_server.NativeGrpcServer, work: Coroutine[Any, Any, None], profiler: Any) -> float:
    started, started_loop = time.process_time(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    server.loop.run_until_complete(work)
    if profiler is not None:
        profiler.disable()
    LOOP_CPU.append(time.thread_time() - started_loop)
    return time.process_time() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--streams", type=int, default=64, help="requests per read (concurrent streams)")
    ap.add_argument("--connections", type=int, default=1,
                    help="N connections with one stream each per pass (h2load's -c N -m 1; --streams is ignored), "
                         "each read a separate receive, as the loop delivers them")
    ap.add_argument("--batcher", action="store_true", help="simple as the demo has it (auto-complete's dynamic "
                    "batcher), with the loop's wake-ups held per pass as the server holds them")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the loop thread into FILE (pstats)")
    ap.add_argument("--model", choices=sorted(MESSAGES), default="simple",
                    help="the demo model and request: simple (default) or image_identity (the lab's 602 KB FP32 "
                         "request, in 16 KiB DATA frames)")
    args = ap.parse_args()
    # malloc as `fastoip serve` sets it (an older checkout: what it had), so 602 KB messages cost what they do there
    for pin in ("pin_mmap_threshold", "pin_trim_threshold"):
        if hasattr(allocator, pin):
            getattr(allocator, pin)()

    root = write_repository(Path(tempfile.mkdtemp()) / "repo", [args.model])
    if not args.batcher:
        config = f'name: "{args.model}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\n'
        (root / args.model / "config.pbtxt").write_text(config)
    core = Core(root, RepositoryOptions(use_gpu=False), worker_threads=1)
    core.load_models()
    server = native_server.NativeGrpcServer(core, "127.0.0.1", 0,
                                            NativeGrpcOptions(max_concurrent_streams=args.requests + 1))
    message = MESSAGES[args.model]()
    best = float("inf")
    if args.batcher:
        from fastoip import core as core_module
        if hasattr(core_module, "start_in_bursts"):
            core_module.start_in_bursts(server.loop)  # the server does this on its loop's thread
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile(time.thread_time)  # CPU of the loop thread: waits for the GIL do not count
    try:
        for _ in range(args.reps):
            if args.connections > 1:
                elapsed, written = run_connections(server, message, args.requests, args.connections, profiler)
            else:
                elapsed, written = run_streams(server, message, args.requests, args.streams, profiler)
            best = min(best, elapsed)
    finally:
        core.close()
        server.loop.close()
        server.sock.close()
    if profiler is not None:
        profiler.dump_stats(args.profile)
    batching = "dynamic batcher" if args.batcher else "no batcher"
    layout = (f"{args.connections} connections x 1 stream" if args.connections > 1
              else f"1 connection x {args.streams} streams")
    loop_cpu = min(LOOP_CPU) / args.requests * 1e6
    print(f"{best / args.requests * 1e6:.2f} us CPU per ModelInfer ({args.model}, {batching}, {layout}) through "
          f"GrpcConnection + Core (loop thread alone {loop_cpu:.2f} us), best of {args.reps} x {args.requests}, "
          f"{written / args.requests:.0f} bytes written "
          f"per request ({native_server.__file__})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

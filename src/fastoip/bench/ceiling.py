"""The ceiling: a server that answers every infer call with a pre-built response.

``fastoip bench --ceiling`` measures the same load (same request bytes, same
levels, same client) against this server too.  It parses nothing and computes
nothing, so its throughput is the most this client and transport can reach on
this machine: a server measured close to it is limited by the client, not by
itself.

- gRPC: a sync grpcio server (thread pool, like fastoip's frontend) with raw
  bytes handlers: ModelInfer returns the response bytes captured from the real
  server; ModelStreamInfer wraps them as ``ModelStreamInferResponse`` for each
  request; ServerLive/ServerReady/ModelReady say true; ServerMetadata names it.
- HTTP: an asyncio (uvloop when installed) HTTP/1.1 server that reads each
  request's headers and body length and writes the captured response bytes.

Run as ``python -m fastoip.bench.ceiling --protocol grpc|http --response FILE``;
it binds 127.0.0.1 on an ephemeral port and prints
``fastoip-ceiling: <protocol> listening on 127.0.0.1:<port>``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

SERVICE = "inference.GRPCInferenceService"
TRUE = b"\x08\x01"  # {live|ready: true}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string_field(number: int, text: str) -> bytes:
    data = text.encode()
    return bytes([(number << 3) | 2]) + _varint(len(data)) + data


def serve_grpc(response: bytes, workers: int) -> None:
    import grpc

    from .. import __version__

    stream_frame = b"\x12" + _varint(len(response)) + response  # ModelStreamInferResponse.infer_response
    metadata = _string_field(1, "fastoip-ceiling") + _string_field(2, __version__)

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        return response

    def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in requests:
            yield stream_frame

    def constant(value: bytes) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        return lambda request, context: value

    raw = dict(request_deserializer=None, response_serializer=None)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(infer, **raw),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream, **raw),
            "ServerLive": grpc.unary_unary_rpc_method_handler(constant(TRUE), **raw),
            "ServerReady": grpc.unary_unary_rpc_method_handler(constant(TRUE), **raw),
            "ModelReady": grpc.unary_unary_rpc_method_handler(constant(TRUE), **raw),
            "ServerMetadata": grpc.unary_unary_rpc_method_handler(constant(metadata), **raw),
        },
    )
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers),
        options=[
            ("grpc.max_receive_message_length", 2**31 - 1),
            ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"fastoip-ceiling: grpc listening on 127.0.0.1:{port}", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()


class _HttpFixed(asyncio.Protocol):
    """Answers every request with the same bytes; keeps the connection open."""

    OK_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP server's connections are stream transports

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end > 0 else len(head)])
            if len(buf) < end + 4 + length:
                return
            del buf[: end + 4 + length]
            assert self.transport is not None
            self.transport.write(self.response if head.startswith(b"post") else self.OK_EMPTY)


def serve_http(response: bytes) -> None:
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(loop.create_server(lambda: _HttpFixed(response), "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    print(f"fastoip-ceiling: http listening on 127.0.0.1:{port}", flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, loop.stop)
    loop.run_forever()
    server.close()
    loop.close()


def write_response_file(data: bytes) -> Path:
    """The captured response in a temp file for the child (deleted by the caller)."""
    handle = tempfile.NamedTemporaryFile(prefix="fastoip-ceiling-", suffix=".bin", delete=False)
    with handle:
        handle.write(data)
    return Path(handle.name)


def ceiling_argv(protocol: str, response_file: Path, workers: int = 16) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fastoip.bench.ceiling",
        "--protocol",
        protocol,
        "--response",
        str(response_file),
        "--workers",
        str(workers),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastoip-ceiling", description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--response", type=Path, required=True, help="file with the response bytes to send")
    parser.add_argument("--workers", type=int, default=16, help="gRPC handler threads")
    args = parser.parse_args(argv)
    response = args.response.read_bytes()
    if args.protocol == "grpc":
        serve_grpc(response, args.workers)
    else:
        serve_http(response)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A grpc.aio (uvloop) frontend over fastoip's own Core: the other side of `frontend-choice`.

It serves ``inference.GRPCInferenceService`` with exactly the hot path the real
``fastoip serve`` uses, only on an event loop instead of a thread pool:

  request bytes --fastoip._codec.decode_infer_request--> InferRequest
      --await Core.infer_async--> InferResponse
      --fastoip._codec.encode_infer_response--> response bytes

The codec is the method's (de)serializer, as in ``fastoip.server.grpc.grpcio_server``; the
non-infer RPCs reuse ``fastoip.server.grpc.service.GrpcService``'s methods and its protobuf
(de)serializers.  Core construction is the same as ``fastoip serve``:
``Core(repository_root, RepositoryOptions(...))`` + ``core.load_models()``.

This is a benchmark instrument, not part of fastoip: ``benchmarks/lab.py
frontend-choice`` runs it pinned to the same CPU as the sync server and loads
both with the same h2load payloads.

  python benchmarks/aio_frontend.py --model-repository DIR --port 18021 [--loop uvloop|asyncio]

Prints ``fastoip-aio: grpc listening on HOST:PORT`` once it accepts calls.
SIGINT/SIGTERM stop it (calls in flight get --exit-timeout seconds).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from fastoip import _codec
from fastoip.core import CallContext, Core
from fastoip.errors import InferenceError
from fastoip.repository import RepositoryOptions
from fastoip.server.grpc.service import SERVICE, UNARY, DecodeFailure, GrpcService, decode_request

INT32_MAX = 2**31 - 1
log = logging.getLogger("fastoip-aio")


def _status(error: InferenceError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.grpc_code, grpc.StatusCode.UNKNOWN)


def build_handler(core: Core) -> grpc.GenericRpcHandler:
    frontend = GrpcService(core)

    async def model_infer(request: Any, context: grpc.aio.ServicerContext) -> Any:  # InferRequest | DecodeFailure
        if type(request) is DecodeFailure:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {request.message}")
        remaining = context.time_remaining()
        deadline_ns = time.monotonic_ns() + int(remaining * 1e9) if remaining is not None and remaining < 1e9 else 0
        try:
            return await core.infer_async(request, CallContext(deadline_ns))
        except InferenceError as exc:
            await context.abort(_status(exc), exc.message)

    def unary(method: Callable[[Any], Any]) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        # GrpcService's methods are cheap dictionary lookups on the Core: run them inline.
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return method(request)
            except InferenceError as exc:
                await context.abort(_status(exc), exc.message)

        return handler

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer,
            request_deserializer=decode_request,
            response_serializer=_codec.encode_infer_response,
        )
    }
    for name, (request_type, response_type) in UNARY.items():
        method = getattr(frontend, name, None)
        if method is None:
            continue
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            unary(method),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def serve(args: argparse.Namespace) -> None:
    core = Core(
        args.model_repository,
        RepositoryOptions(intra_op_threads=args.ort_threads, use_gpu=not args.cpu_only),
        worker_threads=args.worker_threads,
    )
    core.load_models()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", INT32_MAX),
            ("grpc.max_send_message_length", INT32_MAX),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((build_handler(core),))
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        raise SystemExit(f"could not bind {args.host}:{args.port}")
    await server.start()
    print(f"fastoip-aio: grpc listening on {args.host}:{port} (loop {args.loop})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    core.begin_shutdown()
    await server.stop(grace=args.exit_timeout)
    core.close()
    print("fastoip-aio: stopped", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-repository", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18021)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--worker-threads", type=int, default=16, help="Core worker threads (fastoip serve's default)")
    ap.add_argument("--ort-threads", type=int, default=1)
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--exit-timeout", type=float, default=5.0)
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args()
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The grpcio frontend: ``inference.GRPCInferenceService`` on a sync grpcio server (the fallback).

Rules:
- Transport only: the RPCs' translation lives in :mod:`.service`; this module
  maps core errors to gRPC statuses and drives ModelInfer / ModelStreamInfer.
- ModelInfer never builds protobuf objects: the codec is the method's request
  deserializer and response serializer.  A deserializer must not raise (grpcio
  would answer INTERNAL), so decode failures travel to the handler as
  :class:`DecodeFailure` and become INVALID_ARGUMENT there.
- While tracing is on, Triton's GRPC_WAITREAD_START / GRPC_WAITREAD_END
  bracket the decode of the request message (grpcio hands a message over
  whole, after it was read) and GRPC_SEND_START / GRPC_SEND_END the encode of
  the response (then grpcio sends it): :class:`TracedRequest` carries the
  frontend's stamps from the deserializer to the handler, :class:`TracedResponse`
  from the handler to the serializer (ModelStreamInfer encodes in its handler).
- Why it stays: it is the reference the native frontend is compared against in
  differential tests, and the frontend used where the native one was not built.
  It holds a thread per call, which caps it at its thread count (16 idle
  streams deny every other call; README "Frontends" and benchmarks/RESULTS.md
  give the measurements).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import grpc
from google.protobuf.message import Message

from ... import _codec
from ...core import CallContext, Core, FinishedCall, Ticket
from ...errors import InferenceError
from ...tracing import FrontendTrace
from ...types import InferRequest, InferResponse
from ..restricted import RestrictedFeatures, Restriction, grpc_method_restrictions
from .mlserver_shapes import answers_as_mlserver
from .service import (
    CANCELLABLE_RPCS,
    CLIENT_AWARE_RPCS,
    HEALTH_SERVICE,
    HEALTH_UNARY,
    INT32_MAX,
    SERVICE,
    UNARY,
    DecodeFailure,
    GrpcService,
    accept_mlserver_shapes,
    client_of_peer,
    decode_request,
    encode_final,
    encode_partial,
    error_echo,
    last_response,
    take_empty_final_flag,
)

log = logging.getLogger("fastoip.grpc")

__all__ = ["INT32_MAX", "GrpcioFrontend", "create_server", "method_handlers"]


class TracedRequest:
    """A decoded request (or its DecodeFailure) of a traced call, with the frontend's timestamps so far."""

    __slots__ = ("request", "frontend")

    def __init__(self, request: InferRequest | DecodeFailure, frontend: FrontendTrace) -> None:
        self.request = request
        self.frontend = frontend


class TracedResponse:
    """A traced call's response on its way to the serializer, which stamps GRPC_SEND_* around the encode."""

    __slots__ = ("response", "frontend")

    def __init__(self, response: InferResponse, frontend: FrontendTrace) -> None:
        self.response = response
        self.frontend = frontend


def request_decoder(core: Core) -> Callable[[bytes], InferRequest | DecodeFailure | TracedRequest]:
    """The request deserializer: the codec, plus GRPC_WAITREAD_* around it while tracing is on."""

    def decode(data: bytes) -> InferRequest | DecodeFailure | TracedRequest:
        if not core.tracing:
            return decode_request(data)
        frontend = FrontendTrace()
        frontend.stamp("GRPC_WAITREAD_START")
        request = decode_request(data)
        frontend.stamp("GRPC_WAITREAD_END")
        return TracedRequest(request, frontend)

    return decode


def encode_response(response: InferResponse | TracedResponse) -> bytes:
    """The ModelInfer response serializer: the codec, plus GRPC_SEND_* around it for a traced call."""
    if not isinstance(response, TracedResponse):
        return _codec.encode_infer_response(response)
    frontend = response.frontend
    frontend.stamp("GRPC_SEND_START")
    try:
        return _codec.encode_infer_response(response.response)
    finally:
        frontend.stamp("GRPC_SEND_END")  # handed to grpcio, which sends it
        frontend.done()


def abort(context: grpc.ServicerContext, error: InferenceError) -> None:
    context.abort(getattr(grpc.StatusCode, error.grpc_code, grpc.StatusCode.UNKNOWN), error.message)


class _MLServerMessage:
    """A decoupled model's response that is not its last, for a stream answered with MLServer's messages."""

    __slots__ = ("response",)

    def __init__(self, response: InferResponse) -> None:
        self.response = response


class GrpcioFrontend:
    """ModelInfer and ModelStreamInfer on grpcio's thread pool."""

    def __init__(self, core: Core, mlserver_streams: bool = False) -> None:
        self.core = core
        #: ``--mlserver-grpc-stream`` (see :mod:`.mlserver_shapes`).
        self.mlserver_streams = mlserver_streams

    def ModelInfer(
        self, request: InferRequest | DecodeFailure | TracedRequest, context: grpc.ServicerContext
    ) -> Any:
        frontend: FrontendTrace | None = None
        if type(request) is TracedRequest:
            frontend, request = request.frontend, request.request
        if type(request) is DecodeFailure:
            loose = accept_mlserver_shapes(self.core, request)
            if loose is None:
                if frontend is not None:
                    frontend.done()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.status_message)
            request = loose
        try:
            response = self.core.infer(request, call_context(context, frontend))  # type: ignore[arg-type]  # abort() raised for a DecodeFailure
        except InferenceError as exc:
            if frontend is not None:
                frontend.done()
            abort(context, exc)
        return response if frontend is None else TracedResponse(response, frontend)

    def ModelStreamInfer(
        self, requests: Iterable[InferRequest | DecodeFailure | TracedRequest], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Bidirectional stream: many requests in flight, responses as they finish.

        A reader thread takes requests off the stream and starts them; this
        handler's thread encodes and yields each finished job.  An error on one
        request becomes that response's ``error_message``; the stream goes on, unless the client sent
        ``triton_grpc_error: true`` (Triton's mode): then the first error ends the stream with its status.
        When the call ends (client cancelled, stream stopped) queued requests
        are cancelled.
        """
        finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        in_flight: set[Ticket] = set()
        #: Requests that asked for an empty final response (noted before they start: they may finish at once).
        empty_final: set[InferRequest] = set()
        started = [0]
        core = self.core
        #: The frontend's timestamps of each traced request in flight (set before it starts: it may finish at once).
        traces: dict[InferRequest, FrontendTrace] = {}
        #: Requests answered with MLServer's stream messages (set before they start: they may finish at once).
        mlserver: set[InferRequest] = set()

        def cancel_all() -> None:
            for job in list(in_flight):
                job.cancel()

        context.add_callback(cancel_all)
        errors_end_stream = any(key == "triton_grpc_error" and value == "true"
                                for key, value in context.invocation_metadata() or ())

        def partial(job: FinishedCall, response: InferResponse) -> None:  # a decoupled model's thread
            finished.put(_MLServerMessage(response) if job.request in mlserver else response)

        def read() -> None:
            try:
                for request in requests:
                    started[0] += 1
                    frontend: FrontendTrace | None = None
                    if isinstance(request, TracedRequest):
                        frontend, request = request.frontend, request.request
                    if isinstance(request, DecodeFailure):
                        loose = accept_mlserver_shapes(core, request)
                        if loose is None:
                            if frontend is not None:
                                frontend.done()
                            finished.put(_codec.encode_stream_response(None, request.status_message))
                            continue
                        request = loose
                    if self.mlserver_streams and answers_as_mlserver(core, request):
                        mlserver.add(request)
                    try:
                        if request.parameters and take_empty_final_flag(request):
                            empty_final.add(request)
                        call = CallContext(
                            trace_headers=context.invocation_metadata, caller_runs=True, frontend_trace=frontend
                        )
                        if frontend is not None:
                            traces[request] = frontend
                        job = core.start(request, call, finished.put, partial)
                    except InferenceError as exc:
                        empty_final.discard(request)
                        if frontend is not None:
                            traces.pop(request, None)
                            frontend.done()
                        # MLServer's servicer, and Triton's triton_grpc_error mode: an error ends the stream
                        if request in mlserver or errors_end_stream:
                            finished.put(exc)
                            break
                        finished.put(_codec.encode_stream_response(error_echo(request), exc.message))
                        continue
                    in_flight.add(job)
            except Exception:  # the call ended (cancelled or broken): stop reading
                pass
            finished.put(_END)

        reader = threading.Thread(target=read, name="fastoip-stream-reader", daemon=True)
        reader.start()
        answered = 0
        total = None
        while total is None or answered < total:
            item = finished.get()
            if item is _END:
                total = started[0]
                continue
            if type(item) is InferResponse:  # a decoupled request's response that is not its last
                yield encode_partial(item)
                continue
            if type(item) is _MLServerMessage:
                yield _codec.encode_infer_response(item.response)
                continue
            answered += 1
            if isinstance(item, bytes):
                yield item
                continue
            if isinstance(item, InferenceError):  # an MLServer model's request that could not start
                cancel_all()
                abort(context, item)
            if item.request in mlserver:
                in_flight.discard(item)
                mlserver.discard(item.request)
                traced = traces.pop(item.request, None) if traces else None
                if traced is not None:
                    traced.done()
                if item.error is not None:
                    cancel_all()
                    abort(context, item.error)
                if item.response is not None:
                    yield _codec.encode_infer_response(item.response)
                continue
            in_flight.discard(item)
            frontend = traces.pop(item.request, None) if traces else None
            if errors_end_stream and item.error is not None:
                if frontend is not None:
                    frontend.done()
                cancel_all()
                abort(context, item.error)
            if frontend is not None:
                frontend.stamp("GRPC_SEND_START")
            last: bytes | None
            if item.response is not None:
                if empty_final:  # asked for by a request that had one response anyway
                    empty_final.discard(item.request)
                last = _codec.encode_stream_response(last_response(item))
            else:
                last = encode_final(item, item.request in empty_final)  # an error, or a decoupled request's final
                empty_final.discard(item.request)
            if frontend is not None:
                frontend.stamp("GRPC_SEND_END")  # handed to grpcio, which sends it
                frontend.done()
            if last is not None:
                yield last


_END = object()


def call_context(context: grpc.ServicerContext, frontend: FrontendTrace | None = None) -> CallContext:
    """The client's deadline, and cancel the request when the call ends (the Core registers that only
    for a request that will wait in a queue: a direct request runs at once on this thread); the metadata is
    read only for a traced request; ``frontend``: the call's GRPC_* timestamps while tracing is on."""
    return CallContext(
        on_cancel=context.add_callback,
        time_remaining=context.time_remaining,
        trace_headers=context.invocation_metadata,
        frontend_trace=frontend,
    )


def _wrap(method: Callable[[Message], Message]) -> Callable[[Message, grpc.ServicerContext], Message]:
    """Map core errors raised by non-infer RPCs to gRPC statuses."""

    def handler(request: Message, context: grpc.ServicerContext) -> Message:
        try:
            return method(request)
        except InferenceError as exc:
            abort(context, exc)
            raise  # unreachable: abort raises

    return handler


def _wrap_with_client(method: Callable[..., Message]) -> Callable[[Message, grpc.ServicerContext], Message]:
    """As :func:`_wrap`, for an RPC bounded per client: the method is told the peer's address."""

    def handler(request: Message, context: grpc.ServicerContext) -> Message:
        try:
            return method(request, client=client_of_peer(context.peer()))
        except InferenceError as exc:
            abort(context, exc)
            raise  # unreachable: abort raises

    return handler


def _wrap_cancellable(method: Callable[..., Message]) -> Callable[[Message, grpc.ServicerContext], Message]:
    """As :func:`_wrap`, for an RPC that stops when its client goes away (cancelled, deadline passed): the method
    is given an event grpc's termination callback sets (it also runs once the call ended normally: no matter)."""

    def handler(request: Message, context: grpc.ServicerContext) -> Message:
        gone = threading.Event()
        context.add_callback(gone.set)
        try:
            return method(request, client_gone=gone)
        except InferenceError as exc:
            abort(context, exc)
            raise  # unreachable: abort raises

    return handler


def method_handlers(core: Core, mlserver_streams: bool = False) -> list[grpc.GenericRpcHandler]:
    """The generic handlers for both services, with the codec on ModelInfer."""
    frontend = GrpcioFrontend(core, mlserver_streams)
    service = GrpcService(core)
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            frontend.ModelInfer,
            request_deserializer=request_decoder(core),
            response_serializer=encode_response,
        ),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            frontend.ModelStreamInfer,
            request_deserializer=request_decoder(core),
            response_serializer=None,
        ),
    }
    for name, (request_type, response_type) in UNARY.items():
        method = getattr(service, name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _wrap_with_client(method) if name in CLIENT_AWARE_RPCS
            else _wrap_cancellable(method) if name in CANCELLABLE_RPCS else _wrap(method),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    health = {
        name: grpc.unary_unary_rpc_method_handler(
            _wrap(cast("Callable[[Message], Message]", service.HealthCheck)),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
        for name, (request_type, response_type) in HEALTH_UNARY.items()
    }
    return [
        grpc.method_handlers_generic_handler(SERVICE, handlers),
        grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
    ]


class RestrictedMethods(grpc.ServerInterceptor):
    """Triton's --grpc-restricted-protocol: a restricted RPC without its header key=value is UNAVAILABLE.

    Installed only when a restriction is configured; other methods pass straight through.
    """

    def __init__(self, restricted: dict[str, Restriction]) -> None:
        self.restricted = restricted

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        restriction = self.restricted.get(handler_call_details.method)
        handler = continuation(handler_call_details)
        if restriction is None or handler is None:
            return handler
        metadata = handler_call_details.invocation_metadata
        given = next((value for key, value in metadata if key == restriction.lookup_name), None)
        if restriction.allows(given):
            return handler
        message = restriction.grpc_refusal()

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, message)

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


def create_server(
    core: Core,
    host: str,
    port: int,
    *,
    workers: int = 16,
    max_message_size: int = INT32_MAX,
    restricted: RestrictedFeatures | None = None,
    mlserver_streams: bool = False,
) -> tuple[grpc.Server, int]:
    """A ready (not yet started) grpc server and the port it bound."""
    restricted_methods = grpc_method_restrictions(restricted or RestrictedFeatures({}), SERVICE, HEALTH_SERVICE)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastoip-grpc"),
        interceptors=[RestrictedMethods(restricted_methods)] if restricted_methods else None,
        options=[
            ("grpc.max_receive_message_length", max_message_size),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers(method_handlers(core, mlserver_streams))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    return server, bound

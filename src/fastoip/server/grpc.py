"""The gRPC frontend: ``inference.GRPCInferenceService`` on a sync grpcio server.

Rules:
- Translate only: wire <-> core types, core errors -> gRPC status.  No model logic.
- ModelInfer never builds protobuf objects: the codec is the method's request
  deserializer and response serializer.  A deserializer must not raise (grpcio
  would answer INTERNAL), so decode failures travel to the handler as
  :class:`DecodeFailure` and become INVALID_ARGUMENT there.
- Why a sync server: on this project's 2-core machine a sync grpcio server
  with a thread pool reaches about twice the requests per second of grpc.aio
  for the same raw handler (see benchmarks/RESULTS.md), and it lets a request
  run on the thread that received it with no hand-off.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import grpc

from .. import _codec
from .._proto import grpc_service_pb2 as pb
from .._proto import health_pb2
from ..core import Core
from ..errors import CodecError, InferenceError
from ..scheduling.job import Job
from ..shared_memory import CUDA
from ..types import InferRequest, InferResponse

log = logging.getLogger("fastoip.grpc")

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
INT32_MAX = 2**31 - 1


class DecodeFailure:
    """What the ModelInfer deserializer returns for bytes that do not parse."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def decode_request(data: bytes) -> "InferRequest | DecodeFailure":
    try:
        return _codec.decode_infer_request(data)
    except CodecError as exc:
        return DecodeFailure(str(exc))


def abort(context: grpc.ServicerContext, error: InferenceError) -> None:
    context.abort(getattr(grpc.StatusCode, error.grpc_code, grpc.StatusCode.UNKNOWN), error.message)


class GrpcFrontend:
    """Every RPC of the service, as methods that translate and call the Core."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # -- inference ------------------------------------------------------------
    def ModelInfer(self, request: "InferRequest | DecodeFailure", context: grpc.ServicerContext) -> Any:
        if type(request) is DecodeFailure:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {request.message}")
        try:
            return self.core.infer(request, watch=partial(watch_call, context))  # type: ignore[arg-type]
        except InferenceError as exc:
            abort(context, exc)

    def ModelStreamInfer(self, requests, context):  # type: ignore[no-untyped-def]
        """Bidirectional stream: many requests in flight, responses as they finish.

        A reader thread takes requests off the stream and starts them; this
        handler's thread encodes and yields each finished job.  An error on one
        request becomes that response's ``error_message``; the stream goes on.
        When the call ends (client cancelled, stream stopped) queued requests
        are cancelled.
        """
        finished: "queue.SimpleQueue" = queue.SimpleQueue()
        in_flight: set = set()
        started = [0]
        core = self.core

        def on_done(job: Job) -> None:
            finished.put(job)

        def cancel_all() -> None:
            for job in list(in_flight):
                job.cancel()

        context.add_callback(cancel_all)

        def read() -> None:
            try:
                for request in requests:
                    started[0] += 1
                    if type(request) is DecodeFailure:
                        finished.put(_codec.encode_stream_response(None, f"malformed ModelInferRequest: {request.message}"))
                        continue
                    try:
                        job = core.submit(request, on_done, run_here=True)
                        in_flight.add(job)
                    except InferenceError as exc:
                        finished.put(_codec.encode_stream_response(_error_echo(request), exc.message))
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
            answered += 1
            if isinstance(item, bytes):
                yield item
                continue
            in_flight.discard(item)
            if item.error is not None:
                yield _codec.encode_stream_response(_error_echo(item.request), item.error.message)
            else:
                yield _codec.encode_stream_response(item.response)

    # -- health and metadata -----------------------------------------------------
    def ServerLive(self, request: pb.ServerLiveRequest, context) -> pb.ServerLiveResponse:  # type: ignore[no-untyped-def]
        return pb.ServerLiveResponse(live=self.core.server_live())

    def ServerReady(self, request: pb.ServerReadyRequest, context) -> pb.ServerReadyResponse:  # type: ignore[no-untyped-def]
        return pb.ServerReadyResponse(ready=self.core.server_ready())

    def ModelReady(self, request: pb.ModelReadyRequest, context) -> pb.ModelReadyResponse:  # type: ignore[no-untyped-def]
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:  # type: ignore[no-untyped-def]
        return pb.ServerMetadataResponse(**self.core.server_metadata())

    def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:  # type: ignore[no-untyped-def]
        meta = self.core.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    def ModelConfig(self, request: pb.ModelConfigRequest, context) -> pb.ModelConfigResponse:  # type: ignore[no-untyped-def]
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.core.model_config(request.name, request.version))
        return response

    def ModelStatistics(self, request: pb.ModelStatisticsRequest, context) -> pb.ModelStatisticsResponse:  # type: ignore[no-untyped-def]
        response = pb.ModelStatisticsResponse()
        for snap in self.core.statistics(request.name, request.version):
            stats = response.model_stats.add()
            stats.name = snap["name"]
            stats.version = snap["version"]
            stats.last_inference = snap["last_inference"]
            stats.inference_count = snap["inference_count"]
            stats.execution_count = snap["execution_count"]
            for key, value in snap["inference_stats"].items():
                duration = getattr(stats.inference_stats, key)
                duration.count, duration.ns = value["count"], value["ns"]
            for batch in snap["batch_stats"]:
                entry = stats.batch_stats.add()
                entry.batch_size = batch["batch_size"]
                for key in ("compute_input", "compute_infer", "compute_output"):
                    duration = getattr(entry, key)
                    duration.count, duration.ns = batch[key]["count"], batch[key]["ns"]
        return response

    # -- repository ----------------------------------------------------------------
    def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context) -> pb.RepositoryIndexResponse:  # type: ignore[no-untyped-def]
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in self.core.repository_index(request.ready)]
        )

    def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context):  # type: ignore[no-untyped-def]
        parameters = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in request.parameters.items()
        }
        self.core.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context):  # type: ignore[no-untyped-def]
        self.core.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ----------------------------------------------------------------------
    def SystemSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.core.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    def SystemSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]
        self.core.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]
        self.core.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self.core.shared_memory.status(request.name, CUDA):
            response.regions[region["name"]].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    def CudaSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]
        self.core.shared_memory.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]
        self.core.shared_memory.unregister(request.name, CUDA)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and log settings ------------------------------------------------------------------
    def TraceSetting(self, request, context):  # type: ignore[no-untyped-def]
        changes = {key: list(value.value) for key, value in request.settings.items()}
        if changes:
            values = self.core.trace_settings.update(changes, request.model_name)
        else:
            if request.model_name:
                self.core.repository.get(request.model_name)  # NOT_FOUND for unknown models
            values = self.core.trace_settings.get(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in values.items():
            response.settings[key].value.extend(value)
        return response

    def LogSettings(self, request, context):  # type: ignore[no-untyped-def]
        changes = {}
        for key, value in request.settings.items():
            choice = value.WhichOneof("parameter_choice")
            if choice is not None:
                changes[key] = getattr(value, choice)
        values = self.core.log_settings.update(changes)
        response = pb.LogSettingsResponse()
        for key, value in values.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = value
        return response

    # -- not implemented yet: answered honestly ------------------------------------------
    def _unimplemented(self, name: str) -> Callable:
        def handler(request, context):  # type: ignore[no-untyped-def]
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by fastoip yet")

        return handler

    # -- grpc.health.v1 ----------------------------------------------------------------
    def HealthCheck(self, request: health_pb2.HealthCheckRequest, context) -> health_pb2.HealthCheckResponse:  # type: ignore[no-untyped-def]
        status = health_pb2.HealthCheckResponse
        if not request.service:
            ok = self.core.server_ready()
        else:
            if self.core.repository.record(request.service) is None and request.service != SERVICE:
                return status(status=status.SERVICE_UNKNOWN)
            ok = self.core.server_ready() if request.service == SERVICE else self.core.model_ready(request.service)
        return status(status=status.SERVING if ok else status.NOT_SERVING)


_END = object()


def watch_call(context: grpc.ServicerContext, job: Job) -> None:
    """For a request that will wait in a queue: its client deadline, and cancel it when the call ends.

    Only queued requests are watched: a direct request runs at once on this thread.
    """
    remaining = context.time_remaining()
    if remaining is not None and remaining < 1e9:
        job.deadline_ns = time.monotonic_ns() + int(remaining * 1e9)
    context.add_callback(job.cancel)


def _error_echo(request: "InferRequest | None") -> "InferResponse | None":
    """The response shell Triton sends with a stream error: model name and request id."""
    if request is None or type(request) is DecodeFailure:
        return None
    return InferResponse(request.model_name, request.model_version, request.id)


def _wrap(method: Callable) -> Callable:
    """Map core errors raised by non-infer RPCs to gRPC statuses."""

    def handler(request, context):  # type: ignore[no-untyped-def]
        try:
            return method(request, context)
        except InferenceError as exc:
            abort(context, exc)

    return handler


UNARY = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest, pb.SystemSharedMemoryStatusResponse),
    "SystemSharedMemoryRegister": (pb.SystemSharedMemoryRegisterRequest, pb.SystemSharedMemoryRegisterResponse),
    "SystemSharedMemoryUnregister": (pb.SystemSharedMemoryUnregisterRequest, pb.SystemSharedMemoryUnregisterResponse),
    "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, pb.CudaSharedMemoryStatusResponse),
    "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, pb.CudaSharedMemoryRegisterResponse),
    "CudaSharedMemoryUnregister": (pb.CudaSharedMemoryUnregisterRequest, pb.CudaSharedMemoryUnregisterResponse),
    "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse),
    "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse),
}


def method_handlers(frontend: GrpcFrontend) -> list[grpc.GenericRpcHandler]:
    """The generic handlers for both services, with the codec on ModelInfer."""
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            frontend.ModelInfer,
            request_deserializer=decode_request,
            response_serializer=_codec.encode_infer_response,
        ),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            frontend.ModelStreamInfer,
            request_deserializer=decode_request,
            response_serializer=None,
        ),
    }
    for name, (request_type, response_type) in UNARY.items():
        method = getattr(frontend, name, None) or frontend._unimplemented(name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _wrap(method),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    health = {
        "Check": grpc.unary_unary_rpc_method_handler(
            _wrap(frontend.HealthCheck),
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
    }
    return [
        grpc.method_handlers_generic_handler(SERVICE, handlers),
        grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
    ]


def create_server(
    core: Core,
    host: str,
    port: int,
    *,
    workers: int = 16,
    max_message_size: int = INT32_MAX,
) -> tuple[grpc.Server, int]:
    """A started-ready (not yet started) grpc server and the port it bound."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastoip-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_message_size),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers(method_handlers(GrpcFrontend(core)))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    return server, bound

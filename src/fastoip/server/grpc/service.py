"""The gRPC service as transport-free translation: protobuf request -> Core -> protobuf response.

Rules:
- Every RPC except ModelInfer / ModelStreamInfer is a method here taking the
  request message and returning the response message; core errors propagate as
  :mod:`fastoip.errors` values and each transport maps them to a gRPC status.
- The infer RPCs never build protobuf objects: the codec decodes and encodes
  them, and each transport drives the Core's completion path itself.
- Nothing here knows about grpcio or HTTP/2, so the grpcio frontend and the
  native frontend answer every RPC with the same code.
- ModelStreamInfer to a decoupled model (Triton's ``stream_infer_handler.cc``):
  every response goes out as it is produced with the parameter
  ``triton_final_response: false``; the final flag alone becomes an empty
  response (``triton_final_response: true``, no outputs) only when the request
  asked with ``triton_enable_empty_final_response: true``; an error is the
  final response (its ``error_message``); a decoupled request that finishes
  with a response (an ensemble's last) sends it with ``triton_final_response:
  true``.  Both frontends use the helpers below.
"""

from __future__ import annotations

import threading
from typing import Any

from google.protobuf.message import Message

from ... import _codec
from ..._codec import decode_infer_request
from ..._proto import grpc_service_pb2 as pb
from ..._proto import health_pb2
from ...core import (
    CUDA,
    SYSTEM,
    Core,
    CudaRegionStatus,
    Duration,
    FinishedCall,
    SystemRegionStatus,
    TensorMetadata,
)
from ...errors import CodecError, InvalidArgument, NotFound
from ...types import InferRequest, InferResponse
from .mlserver_shapes import BYTES_COUNT_MISMATCH, mlserver_request

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
INT32_MAX = 2**31 - 1


class DecodeFailure:
    """What decoding a ModelInferRequest gives for bytes that do not parse (``data``: the bytes, kept only when
    the refusal may be MLServer's BYTES shape, see :mod:`.mlserver_shapes`)."""

    __slots__ = ("message", "data")

    def __init__(self, message: str, data: bytes | None = None) -> None:
        self.message = message
        self.data = data

    @property
    def status_message(self) -> str:
        # the codec's message first: it begins with Triton's words for the same mistake
        return f"{self.message} (malformed ModelInferRequest)"


def decode_request(data: bytes | bytearray | memoryview) -> InferRequest | DecodeFailure:
    """The codec, never raising (grpcio answers INTERNAL for a deserializer that raises)."""
    try:
        return decode_infer_request(data)
    except CodecError as exc:
        message = str(exc)
        return DecodeFailure(message, bytes(data) if BYTES_COUNT_MISMATCH in message else None)


def accept_mlserver_shapes(core: Core, failure: DecodeFailure) -> InferRequest | None:
    """The request of ``failure`` read with MLServer's BYTES shapes, for an MLServer-settings model; else None."""
    return mlserver_request(core, failure.message, failure.data)


def error_echo(request: InferRequest | DecodeFailure | None) -> InferResponse | None:
    """The response shell Triton sends with a stream error: model name and request id."""
    if request is None or type(request) is DecodeFailure:
        return None
    assert isinstance(request, InferRequest)
    return InferResponse(request.model_name, request.model_version, request.id)


#: Triton's response parameter on ModelStreamInfer: whether this is the request's last response.
FINAL_RESPONSE = "triton_final_response"
#: Triton's request parameter: send the final flag of a decoupled request as an empty response.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"


def take_empty_final_flag(request: InferRequest) -> bool:
    """Whether the request asks for an empty final response; the parameter is Triton's, the model never sees it."""
    value = request.parameters.pop(EMPTY_FINAL_RESPONSE, None)
    if value is None:
        return False
    if type(value) is not bool:
        raise InvalidArgument(f"invalid value type for '{EMPTY_FINAL_RESPONSE}' parameter, expected bool_param.")
    return value


def encode_partial(response: InferResponse) -> bytes:
    """One response of a decoupled request that is not its last."""
    response.parameters[FINAL_RESPONSE] = False
    try:
        return _codec.encode_stream_response(response)
    except Exception as exc:  # an output the codec cannot encode: the client hears why
        return _codec.encode_stream_response(_shell(response, False), f"cannot encode the response: {exc}")


def encode_final(call: FinishedCall, empty_final: bool) -> bytes | None:
    """What a finished stream request sends last: its error, its one response, or for a decoupled request
    the final flag (an empty response when asked for, else nothing)."""
    if call.error is not None:
        echo = error_echo(call.request)
        if echo is not None and call.decoupled:
            echo.parameters[FINAL_RESPONSE] = True
        return _codec.encode_stream_response(echo, call.error.message)
    response = call.response
    if response is None:  # a decoupled request's final flag alone
        return _codec.encode_stream_response(_shell(call.request, True)) if empty_final else None
    try:
        return _codec.encode_stream_response(last_response(call))
    except Exception as exc:
        return _codec.encode_stream_response(error_echo(call.request), f"cannot encode the response: {exc}")


def last_response(call: FinishedCall) -> InferResponse:
    """A finished stream request's one response; a decoupled request's last response, which carries the final
    flag (an ensemble with a decoupled step ends so, as Triton's ensemble marks its last response final)."""
    response = call.response
    assert response is not None
    if call.decoupled:
        response.parameters = {**(response.parameters or {}), FINAL_RESPONSE: True}
    return response


def _shell(source: InferRequest | InferResponse, final: bool) -> InferResponse:
    """A response with no outputs: model name, version and id of ``source``, and the final flag."""
    return InferResponse(source.model_name, source.model_version, source.id, {FINAL_RESPONSE: final})


class GrpcService:
    """Every unary RPC of both services, as methods that translate and call the Core."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # -- health and metadata -----------------------------------------------------
    def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.server_live())

    def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.server_ready())

    def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self.core.server_metadata()
        return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=meta.extensions)

    def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self.core.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[_tensor_metadata(t) for t in meta.inputs],
            outputs=[_tensor_metadata(t) for t in meta.outputs],
        )

    def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.core.model_config(request.name, request.version))
        return response

    def ModelStatistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        response = pb.ModelStatisticsResponse()
        for model in self.core.statistics(request.name, request.version):
            stats = response.model_stats.add()
            stats.name = model.name
            stats.version = model.version
            stats.last_inference = model.last_inference
            stats.inference_count = model.inference_count
            stats.execution_count = model.execution_count
            durations = model.inference_stats
            for key in type(durations).__dataclass_fields__:
                _copy_duration(getattr(durations, key), getattr(stats.inference_stats, key))
            for batch in model.batch_stats:
                entry = stats.batch_stats.add()
                entry.batch_size = batch.batch_size
                _copy_duration(batch.compute_input, entry.compute_input)
                _copy_duration(batch.compute_infer, entry.compute_infer)
                _copy_duration(batch.compute_output, entry.compute_output)
        return response

    # -- repository ----------------------------------------------------------------
    def RepositoryIndex(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state, reason=e.reason)
                for e in self.core.repository_index(request.ready)
            ]
        )

    def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, client_gone: threading.Event | None = None
    ) -> pb.RepositoryModelLoadResponse:
        """``client_gone``: set by the frontend when the call is cancelled, its stream reset or its deadline passed:
        the load stops (issue 37)."""
        parameters = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in request.parameters.items()
        }
        self.core.load_model(request.model_name, parameters, client_gone)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        dependents = request.parameters.get("unload_dependents")
        self.core.unload_model(request.model_name, bool(dependents is not None and dependents.bool_param))
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ----------------------------------------------------------------------
    def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.core.shared_memory_status(request.name, SYSTEM):
            assert isinstance(region, SystemRegionStatus)
            status = response.regions[region.name]
            status.name, status.key, status.offset, status.byte_size = (
                region.name, region.key, region.offset, region.byte_size
            )
        return response

    def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, client: str = ""
    ) -> pb.SystemSharedMemoryRegisterResponse:
        """``client``: the peer's address, which the transport knows (registrations are bounded per client)."""
        self.core.register_system_shared_memory(request.name, request.key, request.offset, request.byte_size, client)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.core.unregister_shared_memory(request.name, SYSTEM)
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self.core.shared_memory_status(request.name, CUDA):
            assert isinstance(region, CudaRegionStatus)
            status = response.regions[region.name]
            status.name, status.device_id, status.byte_size = region.name, region.device_id, region.byte_size
        return response

    def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, client: str = ""
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self.core.register_cuda_shared_memory(
            request.name, request.raw_handle, request.device_id, request.byte_size, client
        )
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.core.unregister_shared_memory(request.name, CUDA)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and log settings ------------------------------------------------------------------
    def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        changes: dict[str, list[str] | None] = {key: list(value.value) for key, value in request.settings.items()}
        if changes:
            values = self.core.update_trace_settings(changes, request.model_name)
        else:
            values = self.core.trace_settings(request.model_name)  # NOT_FOUND for unknown models
        response = pb.TraceSettingResponse()
        for key, value in values.items():
            response.settings[key].value.extend(value)
        return response

    def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        changes: dict[str, Any] = {}
        for key, value in request.settings.items():
            choice = value.WhichOneof("parameter_choice")
            if choice is not None:
                changes[key] = getattr(value, choice)
        values = self.core.update_log_settings(changes)
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

    # -- grpc.health.v1 ----------------------------------------------------------------
    def HealthCheck(self, request: health_pb2.HealthCheckRequest) -> health_pb2.HealthCheckResponse:
        status = health_pb2.HealthCheckResponse
        if not request.service:
            ok = self.core.server_ready()
        else:
            if request.service != SERVICE and not self.core.model_known(request.service):
                # The health protocol: Check answers NOT_FOUND for a service it does not know.
                raise NotFound(f"unknown service '{request.service}'")
            ok = self.core.server_ready() if request.service == SERVICE else self.core.model_ready(request.service)
        return status(status=status.SERVING if ok else status.NOT_SERVING)


def _tensor_metadata(tensor: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)


def _copy_duration(source: Duration, target: pb.StatisticDuration) -> None:
    target.count, target.ns = source.count, source.ns


#: Unary RPCs of inference.GRPCInferenceService: name -> (request type, response type).
#: RPCs whose method takes the peer's address as ``client`` (bounded per client): every transport passes it.
CLIENT_AWARE_RPCS = frozenset({"SystemSharedMemoryRegister", "CudaSharedMemoryRegister"})
#: RPCs that stop when their client goes away (their method takes ``client_gone``, an event the frontend sets).
CANCELLABLE_RPCS = frozenset({"RepositoryModelLoad"})


def client_of_peer(peer: str) -> str:
    """The client part of a grpcio peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``unix:/path``): the host."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return peer


UNARY: dict[str, tuple[type[Message], type[Message]]] = {
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

#: grpc.health.v1.Health's unary RPC.
HEALTH_UNARY: dict[str, tuple[type[Message], type[Message]]] = {
    "Check": (health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
}

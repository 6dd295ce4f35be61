"""The non-inference calls: readiness, server/model metadata, model config, statistics.

Both protocols answer with the same plain dicts, so the rest of the bench does
not care where they came from:

- server metadata: ``{"name", "version", "extensions": [...]}``
- model metadata: ``{"name", "versions", "platform", "inputs": [T], "outputs": [T]}``
  with ``T = {"name", "datatype", "shape": [int]}``
- model config (``None`` when the server has none): ``{"max_batch_size",
  "inputs": {name: {"datatype", "dims", "optional", "is_shape_tensor"}},
  "dynamic_batching", "sequence_batching", "decoupled"}``
- statistics: counters summed over the returned versions, see :data:`STAT_KEYS`.

Only ServerReady, ServerMetadata and ModelMetadata are required (the KServe V2
core); ModelConfig and ModelStatistics are optional Triton extensions.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from typing import TYPE_CHECKING, Any

from .target import BenchError, Target
from .tls import grpc_channel, ssl_context

if TYPE_CHECKING:  # grpc is imported by the gRPC client only: an HTTP bench does without it
    import grpc

SERVICE = "inference.GRPCInferenceService"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
]
#: Duration counters of Triton's InferStatistics that the bench reads ([count, ns] each).
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
#: Failures worth waiting out while a server starts (gRPC status names, HTTP codes).
TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "503", "ConnectionError", "TimeoutError", "RemoteDisconnected")
#: Every key of a statistics dict.
STAT_KEYS = DURATIONS + ("inference_count", "execution_count")


class ControlClient:
    """Base: the calls every protocol offers."""

    target: Target

    def server_ready(self) -> bool:
        raise NotImplementedError

    def server_metadata(self) -> dict:
        raise NotImplementedError

    def model_metadata(self, model: str, version: str = "") -> dict:
        raise NotImplementedError

    def model_config(self, model: str, version: str = "") -> dict | None:
        raise NotImplementedError

    def model_statistics(self, model: str, version: str = "") -> dict | None:
        raise NotImplementedError

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        raise NotImplementedError

    def unregister_system_shm(self, name: str) -> None:
        raise NotImplementedError

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise NotImplementedError

    def unregister_cuda_shm(self, name: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def wait_ready(self, timeout: float) -> None:
        """Poll ServerReady until true; BenchError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last, status = "", "UNAVAILABLE"
        while True:
            try:
                if self.server_ready():
                    return
                last = "ServerReady says false"
            except BenchError as exc:
                last, status = str(exc), exc.status or status
                if status not in TRANSIENT:
                    raise
            if time.monotonic() >= deadline:
                raise BenchError(
                    f"server at {self.target.url} not ready after {timeout:.0f} s: {last}", stage="ready", status=status
                )
            time.sleep(0.1)


def empty_stats() -> dict:
    stats: dict[str, Any] = {key: [0, 0] for key in DURATIONS}
    stats["inference_count"] = 0
    stats["execution_count"] = 0
    return stats


def connect(target: Target, timeout: float = 10.0) -> ControlClient:
    return GrpcControl(target, timeout) if target.protocol == "grpc" else HttpControl(target, timeout)


# --------------------------------------------------------------------------- gRPC
class GrpcControl(ControlClient):
    """Raw-channel unary calls with the generated messages of :mod:`fastoip._proto`."""

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        import grpc

        from .._proto import grpc_service_pb2 as pb

        self._grpc = grpc
        self._pb = pb
        self.target = target
        self.timeout = timeout
        self.channel = grpc_channel(target.address, GRPC_OPTIONS, target.tls)

    def _call(self, method: str, request: Any, response_type: Any, stage: str) -> Any:
        fn: grpc.UnaryUnaryMultiCallable[bytes, Any] = self.channel.unary_unary(
            f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=response_type.FromString
        )
        try:
            return fn(request.SerializeToString(), timeout=self.timeout)
        except self._grpc.RpcError as exc:
            code = exc.code().name if exc.code() is not None else "UNKNOWN"
            raise BenchError(f"{method} failed: {code}: {exc.details()}", stage=stage, status=code) from None

    def server_ready(self) -> bool:
        return self._call("ServerReady", self._pb.ServerReadyRequest(), self._pb.ServerReadyResponse, "ready").ready

    def server_metadata(self) -> dict:
        r = self._call("ServerMetadata", self._pb.ServerMetadataRequest(), self._pb.ServerMetadataResponse, "server")
        return {"name": r.name, "version": r.version, "extensions": list(r.extensions)}

    def model_metadata(self, model: str, version: str = "") -> dict:
        r = self._call(
            "ModelMetadata",
            self._pb.ModelMetadataRequest(name=model, version=version),
            self._pb.ModelMetadataResponse,
            "metadata",
        )

        def tensors(items: Any) -> list[dict]:
            return [{"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]} for t in items]

        return {
            "name": r.name,
            "versions": list(r.versions),
            "platform": r.platform,
            "inputs": tensors(r.inputs),
            "outputs": tensors(r.outputs),
        }

    def model_config(self, model: str, version: str = "") -> dict | None:
        from .._proto import model_config_pb2 as mc
        from ..datatypes import CONFIG_TO_V2

        try:
            r = self._call(
                "ModelConfig",
                self._pb.ModelConfigRequest(name=model, version=version),
                self._pb.ModelConfigResponse,
                "config",
            )
        except BenchError as exc:
            if exc.status in ("UNIMPLEMENTED", "NOT_FOUND", "UNKNOWN"):
                return None
            raise
        config = r.config
        inputs = {}
        for item in config.input:
            name = mc.DataType.Name(item.data_type)
            inputs[item.name] = {
                "datatype": CONFIG_TO_V2.get(name, ""),
                "dims": [int(d) for d in item.dims],
                "optional": bool(item.optional),
                "is_shape_tensor": bool(item.is_shape_tensor),
            }
        return {
            "max_batch_size": int(config.max_batch_size),
            "inputs": inputs,
            "dynamic_batching": config.HasField("dynamic_batching"),
            "sequence_batching": config.HasField("sequence_batching"),
            "decoupled": bool(config.model_transaction_policy.decoupled),
        }

    def model_statistics(self, model: str, version: str = "") -> dict | None:
        try:
            r = self._call(
                "ModelStatistics",
                self._pb.ModelStatisticsRequest(name=model, version=version),
                self._pb.ModelStatisticsResponse,
                "statistics",
            )
        except BenchError:
            return None
        stats = empty_stats()
        for entry in r.model_stats:
            for key in DURATIONS:
                duration = getattr(entry.inference_stats, key)
                stats[key][0] += duration.count
                stats[key][1] += duration.ns
            stats["inference_count"] += entry.inference_count
            stats["execution_count"] += entry.execution_count
        return stats

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._call(
            "SystemSharedMemoryRegister",
            self._pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size),
            self._pb.SystemSharedMemoryRegisterResponse,
            "shm",
        )

    def unregister_system_shm(self, name: str) -> None:
        self._call(
            "SystemSharedMemoryUnregister",
            self._pb.SystemSharedMemoryUnregisterRequest(name=name),
            self._pb.SystemSharedMemoryUnregisterResponse,
            "shm",
        )

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        request = self._pb.CudaSharedMemoryRegisterRequest(
            name=name, raw_handle=raw_handle, device_id=device_id, byte_size=byte_size
        )
        self._call("CudaSharedMemoryRegister", request, self._pb.CudaSharedMemoryRegisterResponse, "shm")

    def unregister_cuda_shm(self, name: str) -> None:
        self._call(
            "CudaSharedMemoryUnregister",
            self._pb.CudaSharedMemoryUnregisterRequest(name=name),
            self._pb.CudaSharedMemoryUnregisterResponse,
            "shm",
        )

    def close(self) -> None:
        self.channel.close()


# --------------------------------------------------------------------------- HTTP
class HttpControl(ControlClient):
    """Blocking JSON calls over one keep-alive connection (http.client)."""

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _get(self, path: str, stage: str, method: str = "GET", body: dict | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = (
                    http.client.HTTPSConnection(self.target.host, self.target.port, timeout=self.timeout,
                                                context=ssl_context(self.target.tls))
                    if self.target.tls is not None
                    else http.client.HTTPConnection(self.target.host, self.target.port, timeout=self.timeout)
                )
            try:
                self._conn.request(method, path, body=data)
                response = self._conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                self._conn = None
                if attempt:
                    status = "UNAVAILABLE" if isinstance(exc, ConnectionError) else type(exc).__name__
                    raise BenchError(f"{method} {path} failed: {exc}", stage=stage, status=status) from None
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"error": raw[:200].decode("latin-1")}
        return response.status, payload

    def _ok(self, path: str, stage: str, method: str = "GET", body: dict | None = None) -> Any:
        status, payload = self._get(path, stage, method, body)
        if status != 200:
            message = payload.get("error", "") if isinstance(payload, dict) else ""
            raise BenchError(f"{method} {path} failed: HTTP {status}: {message}", stage=stage, status=str(status))
        return payload

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")

    def server_ready(self) -> bool:
        status, _ = self._get("/v2/health/ready", "ready")
        return status == 200

    def server_metadata(self) -> dict:
        r = self._ok("/v2", "server")
        return {"name": r.get("name", ""), "version": r.get("version", ""), "extensions": list(r.get("extensions", []))}

    def model_metadata(self, model: str, version: str = "") -> dict:
        r = self._ok(self._model_path(model, version), "metadata")

        def tensors(items: Any) -> list[dict]:
            return [
                {"name": t["name"], "datatype": t["datatype"], "shape": [int(d) for d in t.get("shape", [])]}
                for t in items or []
            ]

        return {
            "name": r.get("name", model),
            "versions": [str(v) for v in r.get("versions", [])],
            "platform": r.get("platform", ""),
            "inputs": tensors(r.get("inputs")),
            "outputs": tensors(r.get("outputs")),
        }

    def model_config(self, model: str, version: str = "") -> dict | None:
        from ..datatypes import CONFIG_TO_V2

        status, r = self._get(self._model_path(model, version) + "/config", "config")
        if status != 200 or not isinstance(r, dict):
            return None
        if "config" in r and isinstance(r["config"], dict):  # a gRPC-style wrapper
            r = r["config"]
        inputs = {}
        for item in r.get("input", []):
            inputs[item["name"]] = {
                "datatype": CONFIG_TO_V2.get(item.get("data_type", ""), ""),
                "dims": [int(d) for d in item.get("dims", [])],
                "optional": bool(item.get("optional", False)),
                "is_shape_tensor": bool(item.get("is_shape_tensor", False)),
            }
        return {
            "max_batch_size": int(r.get("max_batch_size", 0)),
            "inputs": inputs,
            "dynamic_batching": "dynamic_batching" in r,
            "sequence_batching": "sequence_batching" in r,
            "decoupled": bool((r.get("model_transaction_policy") or {}).get("decoupled", False)),
        }

    def model_statistics(self, model: str, version: str = "") -> dict | None:
        try:
            status, r = self._get(self._model_path(model, version) + "/stats", "statistics")
        except BenchError:
            return None
        if status != 200 or not isinstance(r, dict):
            return None
        stats = empty_stats()
        for entry in r.get("model_stats", []):
            inference = entry.get("inference_stats", {})
            for key in DURATIONS:
                duration = inference.get(key, {})
                stats[key][0] += int(duration.get("count", 0))
                stats[key][1] += int(duration.get("ns", 0))
            stats["inference_count"] += int(entry.get("inference_count", 0))
            stats["execution_count"] += int(entry.get("execution_count", 0))
        return stats

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        body = {"key": key, "offset": 0, "byte_size": byte_size}
        self._ok(f"/v2/systemsharedmemory/region/{name}/register", "shm", "POST", body)

    def unregister_system_shm(self, name: str) -> None:
        self._ok(f"/v2/systemsharedmemory/region/{name}/unregister", "shm", "POST", {})

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        handle = {"b64": base64.b64encode(raw_handle).decode()}
        body = {"raw_handle": handle, "device_id": device_id, "byte_size": byte_size}
        self._ok(f"/v2/cudasharedmemory/region/{name}/register", "shm", "POST", body)

    def unregister_cuda_shm(self, name: str) -> None:
        self._ok(f"/v2/cudasharedmemory/region/{name}/unregister", "shm", "POST", {})

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

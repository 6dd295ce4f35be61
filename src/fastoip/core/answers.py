"""What the Core answers, as typed values (frontends turn them into JSON or protobuf).

Rules:
- Frozen, slotted dataclasses holding plain values (str, int, tuples): nothing
  here refers to a model, a lock or a protobuf message, so an answer can be
  handed to any thread and serialised as it is (orjson writes dataclasses).
- Field names are the KServe V2 / Triton JSON names, so the HTTP frontend
  writes an answer with no renaming and the gRPC frontend copies field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    #: -1 for a variable dimension; a batching model's shape starts with the batch dimension (-1).
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class Duration:
    """A count and a cumulative duration in nanoseconds."""

    count: int
    ns: int


@dataclass(frozen=True, slots=True)
class InferenceStatistics:
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    cache_hit: Duration
    cache_miss: Duration


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """Compute time of the executions of one batch size."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    name: str
    version: str
    #: Milliseconds since the epoch of the last execution (0: none yet).
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: InferenceStatistics
    batch_stats: tuple[BatchStatistics, ...]

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> ModelStatistics:
        """From ``metrics.VersionCounters.snapshot()`` (Triton's JSON shape)."""

        def duration(value: dict[str, int]) -> Duration:
            return Duration(value["count"], value["ns"])

        stats = snap["inference_stats"]
        return cls(
            name=snap["name"],
            version=snap["version"],
            last_inference=snap["last_inference"],
            inference_count=snap["inference_count"],
            execution_count=snap["execution_count"],
            inference_stats=InferenceStatistics(
                **{key: duration(stats.get(key, {"count": 0, "ns": 0})) for key in _INFERENCE_KEYS}
            ),
            batch_stats=tuple(
                BatchStatistics(
                    batch_size=batch["batch_size"],
                    compute_input=duration(batch["compute_input"]),
                    compute_infer=duration(batch["compute_infer"]),
                    compute_output=duration(batch["compute_output"]),
                )
                for batch in snap["batch_stats"]
            ),
        )


_INFERENCE_KEYS = tuple(InferenceStatistics.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class RepositoryIndexEntry:
    name: str
    #: "" for a model that has no loaded version (never loaded, failed, unloaded).
    version: str
    #: READY, LOADING, UNLOADING, UNAVAILABLE, or "" for a model never loaded.
    state: str
    #: Why the latest load failed (older versions may still serve), else "".
    reason: str


@dataclass(frozen=True, slots=True)
class SystemRegionStatus:
    """A registered system (POSIX) shared-memory region."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    """A registered CUDA shared-memory region."""

    name: str
    device_id: int
    byte_size: int


RegionStatus = SystemRegionStatus | CudaRegionStatus

"""The Core: the API every frontend calls (see :mod:`.core`), its typed answers and its call context."""

from ..model_config import config_to_json  # the Triton JSON form of model_config()'s answer
from ..shared_memory import CUDA, SYSTEM
from .answers import (
    BatchStatistics,
    CudaRegionStatus,
    Duration,
    InferenceStatistics,
    ModelMetadata,
    ModelStatistics,
    RegionStatus,
    RepositoryIndexEntry,
    ServerMetadata,
    SystemRegionStatus,
    TensorMetadata,
)
from .call import CallContext, FinishedCall, OnDone, OnResponse, Ticket, on_loop, start_in_bursts
from .control import EXTENSIONS, ModelControl
from .core import Core
from .dataplane import SERVER_NAME, DataPlane

__all__ = [
    "CUDA",
    "SYSTEM",
    "EXTENSIONS",
    "SERVER_NAME",
    "BatchStatistics",
    "CallContext",
    "Core",
    "CudaRegionStatus",
    "DataPlane",
    "Duration",
    "FinishedCall",
    "InferenceStatistics",
    "ModelControl",
    "ModelMetadata",
    "ModelStatistics",
    "RegionStatus",
    "RepositoryIndexEntry",
    "OnDone",
    "OnResponse",
    "ServerMetadata",
    "SystemRegionStatus",
    "TensorMetadata",
    "Ticket",
    "config_to_json",
    "on_loop",
    "start_in_bursts",
]

"""Server-wide options that several layers read (the ground floor: imports nothing of fastoip but a type name).

Rules:
- Plain dataclasses with defaults; the CLI and ``server/app.py`` fill them in,
  the repository and the backends only read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core_link import CoreLink


@dataclass
class RepositoryOptions:
    """Server-wide defaults for models whose config leaves things out."""

    #: Triton's default-max-batch-size backend setting (--backend-config), 4 as in Triton.
    default_max_batch_size: int = 4
    #: False with Triton's --strict-model-config / --disable-auto-complete-config.
    auto_complete: bool = True
    #: ONNX Runtime intra-op threads per session; 0 leaves ORT's default (one per physical core), as Triton.
    intra_op_threads: int = 0
    #: ONNX Runtime inter-op threads (parallel execution mode only); 0 leaves ORT's default.
    inter_op_threads: int = 0
    use_gpu: bool = True
    #: Applied to models with max_batch_size > 0 and no dynamic_batching block (None: no batcher).
    default_batching: dict[str, Any] | None = None
    #: Loads requested through the API may run code a client brings (uploaded .py files, Python models of them).
    allow_code_loads: bool = False
    #: What this repository's backends reach in the Core that owns it (a Triton Python model's BLS, readiness,
    #: model control) and leave with it: the Core sets its own :class:`~fastoip.core_link.CoreLink` here (a copy
    #: of the options per Core); None outside a Core.
    server_link: CoreLink | None = None
    #: Triton's --model-load-thread-count (default 4): models of one load operation (start-up, a poll) load on
    #: this many threads, and a model's versions load side by side on up to this many.
    load_threads: int = 4
    #: The most bytes one tensor an ONNX graph computes may take, sized at load and checked on each request's
    #: outputs (issue 37, ``backends/onnx_cost.py``; --onnx-max-tensor-bytes, default 64 MiB).
    onnx_max_tensor_bytes: int = 64 * 1024 * 1024
    #: Which ONNX models that bound applies to: "uploaded" (files a load request brought), "all" or "none".
    onnx_max_tensor_bytes_for: str = "uploaded"
    #: Set by the repository for one load: this load's ONNX graphs are under ``onnx_max_tensor_bytes``.
    bound_onnx_graph: bool = False
    #: Set by the repository for one load: raises when the load must stop (the server shuts down, or the load's
    #: client went away); backends call it between the instances they build (issue 37).
    check_stop: Callable[[], None] | None = None

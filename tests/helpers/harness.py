"""Build a Core in-process on a temporary repository (real ONNX Runtime, no sockets).

For tests of what does not cross a socket: the Core's completion path, its
answers, model control.  End-to-end tests (``serverproc.py``) stay for the
frontends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fastoip.core import Core
from fastoip.options import RepositoryOptions
from fastoip.types import InferInput, InferRequest, RequestedOutput

#: ``simple`` with no batcher (auto-complete adds one above max_batch_size 1): a request runs on the caller's thread.
DIRECT_SIMPLE = 'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\n'

#: A batcher that holds a lone request for 30 s: it waits in the queue until a test cancels it.
HOLDING_BATCHER = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 30000000 }
"""


@contextlib.contextmanager
def core_on(root: Path, *, load: bool = True, **options: Any) -> Iterator[Core]:
    """A Core on ``root`` (CPU only, 4 workers), models loaded, closed at the end."""
    core = Core(root, RepositoryOptions(use_gpu=False), worker_threads=4, **options)
    try:
        if load:
            core.load_models()
        yield core
    finally:
        core.close()


def simple_request(
    a: np.ndarray | None = None,
    b: np.ndarray | None = None,
    *,
    model: str = "simple",
    request_id: str = "",
    outputs: list[RequestedOutput] | None = None,
) -> InferRequest:
    """A request for the demo ``simple`` model (INT32 [1, 16] + and -); default inputs 0..15 and 1s."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16) if a is None else a
    b = np.ones((1, 16), dtype=np.int32) if b is None else b
    return InferRequest(
        model,
        id=request_id,
        inputs=[InferInput("INPUT0", "INT32", a.shape, a), InferInput("INPUT1", "INT32", b.shape, b)],
        outputs=outputs,
    )


def fp32_request(model: str, rows: int = 1, width: int = 16) -> InferRequest:
    """A request for a demo FP32 identity model (``identity_fp32``: [batch, 16])."""
    data = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    return InferRequest(model, inputs=[InferInput("INPUT0", "FP32", data.shape, data)])


def success_and_failure(core: Core, model: str) -> tuple[int, int]:
    """(successful, failed) request counts of ``model`` from its statistics."""
    (stats,) = core.statistics(model)
    return stats.inference_stats.success.count, stats.inference_stats.fail.count

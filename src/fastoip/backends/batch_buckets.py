"""Fixed batch sizes for an ONNX model: one ORT session per size, each batch padded up to the next size.

Why: on the CUDA EP a session re-plans its cuDNN convolutions every time its input shape changes, and it
keeps no plan for a shape it saw before.  Measured on an H200 (onnxruntime-gpu 1.31.1, cuDNN 9.19,
2026-11-27, benchmarks/RESULTS.md "The GPU check, first run"): a ResNet-50-shaped CNN took 110-160 ms
per change of batch size with HEURISTIC search and ~600 ms with ORT's default EXHAUSTIVE search, against
2-8 ms for a batch; a dynamic batcher changes the size almost every batch, so at c=16 the model served
64 infer/s against 376 at c=1.  Sessions that each see one shape plan once (batch 1: 2.0 ms, 8: 2.9 ms,
32: 8.1 ms, alternating).

Rules:
- The model config's ``parameters { key: "cuda_batch_buckets" }``: ``auto`` (the default), ``off``, or a
  list of sizes such as ``"1,4,16"`` (integers from 1 to ``max_batch_size``; ``max_batch_size`` is always
  added, so every batch fits).
- ``auto`` turns buckets on only where they pay: a batching model (``max_batch_size`` > 1) on the CUDA EP
  whose graph has a convolution (:data:`CONVOLUTIONS`) and whose file is at most
  :data:`AUTO_MAX_MODEL_BYTES` (each size is a whole session: its own copy of the weights on the GPU).
  The sizes are the powers of two below ``max_batch_size``, ``max_batch_size`` and every
  ``preferred_batch_size`` of the dynamic batcher.
- ``auto`` is on for every batching model on the CUDA EP whose config asks for CUDA graphs (``ort_graphs.py``: a
  graph is captured for one shape).
- ``auto`` stays off when the session runs on the TensorRT EP (the config's ``tensorrt`` accelerator): ORT's
  TensorRT EP rebuilds its engine only when a batch falls outside the range of shapes it has built for (or within
  the config's ``trt_profile_*_shapes``), so one session stops re-planning once it has seen the largest batch,
  while a session per size would build and hold an engine per size.  A listed set of sizes still applies.
- An explicit list applies on any execution provider (on the CPU it only costs memory; the tests use it).
- Never with Triton's ragged batching (``allow_ragged_batch``, ``batch_input``, ``batch_output``): dim 0 is
  then the requests' elements, not one row each; ``auto`` stays off and a list is refused.
- A batch of ``n`` rows runs on the smallest size >= ``n``; the added rows are zeros, and every output
  whose dim 0 is the padded size is cut back to ``n`` rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument
from ..scheduling.buffers import BufferPool, Lease

PARAMETER = "cuda_batch_buckets"
#: Operators whose CUDA kernels plan per input shape (cuDNN convolutions).
CONVOLUTIONS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv", "NhwcConv"})
#: ``auto`` leaves larger models alone: a session per size multiplies their weights on the GPU.
AUTO_MAX_MODEL_BYTES = 512 * 1024 * 1024


def bucket_sizes(
    config: mc.ModelConfig, model_path: Path, on_gpu: bool, tensorrt: bool = False, cuda_graph: bool = False
) -> tuple[int, ...]:
    """The batch sizes to keep a session for, ascending; empty when the model runs every batch as it comes.

    ``tensorrt``: the session runs on the TensorRT EP (``auto`` is then off); ``cuda_graph``: the config asks for
    CUDA graphs (``ort_graphs.py``), which need one shape a session: ``auto`` is then on whatever the operators.
    """
    value = config.parameters[PARAMETER].string_value.strip().lower() if PARAMETER in config.parameters else "auto"
    largest = config.max_batch_size
    if value in ("off", "none", "false", "0", ""):
        return ()
    if _ragged(config):
        if value != "auto":
            raise InvalidArgument(
                f"model '{config.name}': parameter '{PARAMETER}' cannot be used with ragged batching "
                "(allow_ragged_batch, batch_input or batch_output: dim 0 is not one row per request)"
            )
        return ()
    if value == "auto":
        if not on_gpu or tensorrt or largest <= 1:
            return ()
        if not cuda_graph and (not _fits_auto(model_path) or not has_convolution(model_path)):
            return ()
        sizes = {1 << shift for shift in range(largest.bit_length()) if 1 << shift < largest}
        if config.HasField("dynamic_batching"):
            sizes.update(size for size in config.dynamic_batching.preferred_batch_size if 0 < size < largest)
        return tuple(sorted(sizes | {largest}))
    if largest <= 0:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{PARAMETER}' needs a batching model (max_batch_size > 0)"
        )
    try:
        listed = {int(part) for part in value.split(",") if part.strip()}
    except ValueError:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{PARAMETER}' must be auto, off or batch sizes such as "
            f"\"1,4,16\", got '{value}'"
        ) from None
    out_of_range = sorted(size for size in listed if not 1 <= size <= largest)
    if out_of_range:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{PARAMETER}' lists {out_of_range}, outside 1 to the "
            f"max_batch_size {largest}"
        )
    return tuple(sorted(listed | {largest}))


def _ragged(config: mc.ModelConfig) -> bool:
    """Whether the model batches ragged (its dim 0 is then elements, not rows: padding rows would change it)."""
    return bool(config.batch_input or config.batch_output or any(t.allow_ragged_batch for t in config.input))


def _fits_auto(model_path: Path) -> bool:
    try:
        return model_path.stat().st_size <= AUTO_MAX_MODEL_BYTES
    except OSError:
        return False


def has_convolution(model_path: Path) -> bool:
    """Whether the model's graph (or a graph nested in one of its nodes) has a convolution."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # ORT loaded it; a file onnx cannot parse simply gets no buckets
        return False
    return any(node.op_type in CONVOLUTIONS for node in _nodes(model.graph))


def _nodes(graph: object) -> Iterable:
    for node in graph.node:  # type: ignore[attr-defined]
        yield node
        for attribute in node.attribute:
            if attribute.g.node:
                yield from _nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _nodes(subgraph)


def smallest_fit(sizes: tuple[int, ...], rows: int) -> int:
    """The smallest size that holds ``rows``, or ``rows`` itself when none does."""
    for size in sizes:
        if size >= rows:
            return size
    return rows


def padded_feeds(
    feeds: dict[str, np.ndarray], rows: int, size: int, pool: BufferPool, leases: list[Lease]
) -> dict[str, np.ndarray]:
    """``feeds`` with dim 0 grown from ``rows`` to ``size`` (zeros after the data), in buffers from ``pool``.

    Each lease is appended to ``leases``: the caller gives them back once the model ran.
    """
    padded: dict[str, np.ndarray] = {}
    for name, array in feeds.items():
        if array.dtype == object:  # strings: a list of references, the padding is empty strings
            grown = np.empty((size, *array.shape[1:]), dtype=object)
            grown[:rows] = array
            grown[rows:] = b""
            padded[name] = grown
            continue
        lease = pool.take(name, array.dtype, (size, *array.shape[1:]))
        leases.append(lease)
        lease.view[:rows] = array
        lease.view[rows:] = 0
        padded[name] = lease.view
    return padded


def cut_rows(outputs: list[np.ndarray], rows: int, size: int) -> list[np.ndarray]:
    """Each output's first ``rows`` rows where its dim 0 is the padded ``size`` (views, no copy)."""
    return [out[:rows] if out.ndim and out.shape[0] == size else out for out in outputs]

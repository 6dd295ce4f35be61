"""Triton's ragged batching: ragged inputs, ``batch_input`` and ``batch_output`` (ONNX models).

Rules (Triton's semantics: the backend library's ``backend_input_collector.cc`` and
``backend_output_responder.cc``, and the onnxruntime backend that calls them):
- An input with ``allow_ragged_batch`` reaches the model flat: the elements of
  every request of the execution, one request after another, shape
  ``[total elements]``.  Requests batch together whatever their shapes of it.
- Each ``batch_input`` feeds each of its ``target_name`` model inputs with
  values of its ``data_type`` (INT32 or FP32) computed from the shape of its
  source input in every request of the execution:

  * ``BATCH_ELEMENT_COUNT``: ``[requests]``, each request's element count;
  * ``BATCH_ACCUMULATED_ELEMENT_COUNT``: ``[requests]``, the running sum of them;
  * ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``: ``[requests + 1]``, 0 then the running sum;
  * ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``: ``[largest element count]``, only the shape speaks (zeros);
  * ``BATCH_ITEM_SHAPE``: ``[batch items, rank - 1]``, each batch item's shape without the batch dim
    (a request of batch size n gives n equal rows);
  * ``BATCH_ITEM_SHAPE_FLATTEN``: the same values, flat.
- A ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE``: the model's
  output is read flat; each request gets the next elements, shaped as the
  target output's config shape (batch dim first) with each variable dim taken
  from the source input's shape in that request, at the same index.
- Every other output is split along dim 0 by the requests' batch sizes, as
  any batched output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._proto import model_config_pb2 as mc
from ..errors import InternalError
from .job import Job

_KIND = mc.BatchInput.Kind


@dataclass(frozen=True)
class BatchInputSpec:
    """One ``batch_input`` entry, read once."""

    kind: int
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


@dataclass(frozen=True)
class BatchOutputSpec:
    """One target of a ``batch_output`` entry, read once."""

    source: str
    #: The target output's config shape, batch dim first when the model batches (-1: taken from the source).
    shape: tuple[int, ...]


class RaggedPlan:
    """What a model's config asks of ragged batching; built only when it asks for any of it."""

    __slots__ = ("model_name", "batching", "ragged", "batch_inputs", "batch_outputs")

    def __init__(self, config: mc.ModelConfig) -> None:
        self.model_name = config.name
        self.batching = config.max_batch_size > 0
        #: Inputs with ``allow_ragged_batch``.
        self.ragged = frozenset(entry.name for entry in config.input if entry.allow_ragged_batch)
        self.batch_inputs = tuple(
            BatchInputSpec(
                entry.kind,
                tuple(entry.target_name),
                np.dtype(np.float32 if entry.data_type == mc.TYPE_FP32 else np.int32),
                entry.source_input[0],
            )
            for entry in config.batch_input
        )
        outputs = {entry.name: entry for entry in config.output}
        batch_dim = (-1,) if self.batching else ()
        self.batch_outputs: dict[str, BatchOutputSpec] = {}
        for entry in config.batch_output:
            for target in entry.target_name:
                output = outputs[target]  # validated at load: every target is a config output
                dims = output.reshape.shape if output.HasField("reshape") else output.dims
                self.batch_outputs[target] = BatchOutputSpec(entry.source_input[0], batch_dim + tuple(dims))

    @staticmethod
    def of(config: mc.ModelConfig) -> RaggedPlan | None:
        """The plan for ``config``, or None when it has no ragged input, batch input or batch output."""
        if config.batch_input or config.batch_output or any(entry.allow_ragged_batch for entry in config.input):
            return RaggedPlan(config)
        return None

    # -- into the model -----------------------------------------------------------------
    def merge(self, jobs: Sequence[Job]) -> tuple[dict[str, np.ndarray], int]:
        """The feeds of one execution of ``jobs``: ragged inputs flat, the others merged along dim 0 (the
        model's own dims when it does not batch), plus every batch input; and the batch size."""
        batch_size = sum(job.batch_size for job in jobs)
        feeds: dict[str, np.ndarray] = {}
        for name in jobs[0].feeds:
            parts = [job.feeds[name] for job in jobs]
            if name in self.ragged:
                # Copy (several requests): every request's elements one after another; one request: a view.
                flat = [part.reshape(-1) for part in parts]
                feeds[name] = flat[0] if len(flat) == 1 else np.concatenate(flat)
            elif len(parts) == 1:
                feeds[name] = parts[0]
            else:
                feeds[name] = np.concatenate(parts, axis=0)  # Copy: the requests' rows into one batch.
        for batch_input in self.batch_inputs:
            values = self._batch_input(batch_input, jobs)
            for target in batch_input.targets:
                feeds[target] = values
        return feeds, batch_size

    @staticmethod
    def _batch_input(spec: BatchInputSpec, jobs: Sequence[Job]) -> np.ndarray:
        shapes = [job.feeds[spec.source].shape for job in jobs]
        kind = spec.kind
        if kind in (_KIND.BATCH_ITEM_SHAPE, _KIND.BATCH_ITEM_SHAPE_FLATTEN):
            rank = max((len(shape) for shape in shapes), default=1) - 1
            rows = [shape[1:] for shape in shapes for _ in range(shape[0] if shape else 0)]
            items = np.array(rows, dtype=spec.dtype).reshape(len(rows), max(rank, 0))
            return items.reshape(-1) if kind == _KIND.BATCH_ITEM_SHAPE_FLATTEN else items
        counts = np.array([math.prod(shape) for shape in shapes], dtype=np.int64)
        if kind == _KIND.BATCH_ELEMENT_COUNT:
            return counts.astype(spec.dtype)
        if kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT:
            return np.cumsum(counts).astype(spec.dtype)
        if kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
            return np.concatenate(([0], np.cumsum(counts))).astype(spec.dtype)
        if kind == _KIND.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
            return np.zeros(int(counts.max()) if len(counts) else 0, dtype=spec.dtype)
        raise InternalError(f"unsupported batch input kind {_KIND.Name(kind)}")  # validated at load

    # -- out of the model -----------------------------------------------------------------
    def split(self, jobs: Sequence[Job], name: str, array: np.ndarray, batch_size: int) -> list[np.ndarray]:
        """Each job's part of output ``name`` (views, no copy)."""
        spec = self.batch_outputs.get(name)
        if spec is not None:
            return self._scatter(jobs, name, spec, array)
        if not self.batching:
            return [array for _ in jobs]  # one request per execution: the whole output
        if array.shape[:1] != (batch_size,):
            raise InternalError(
                f"model '{self.model_name}' returned output '{name}' of shape {list(array.shape)} "
                f"for a batch of {batch_size}"
            )
        parts, offset = [], 0
        for job in jobs:
            parts.append(array[offset : offset + job.batch_size])
            offset += job.batch_size
        return parts

    def _scatter(self, jobs: Sequence[Job], name: str, spec: BatchOutputSpec, array: np.ndarray) -> list[np.ndarray]:
        flat = array.reshape(-1)
        parts, offset = [], 0
        for job in jobs:
            source = job.feeds[spec.source].shape
            shape = tuple(
                (source[index] if index < len(source) else 1) if dim == -1 else dim
                for index, dim in enumerate(spec.shape)
            )
            count = math.prod(shape)
            if offset + count > flat.size:
                raise InternalError(
                    f"model '{self.model_name}' returned {flat.size} elements for batch output '{name}', "
                    f"fewer than its requests' shapes need"
                )
            parts.append(flat[offset : offset + count].reshape(shape))
            offset += count
        return parts

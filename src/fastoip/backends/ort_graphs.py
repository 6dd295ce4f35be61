"""CUDA graphs for ONNX models: ORT's CUDA EP option ``enable_cuda_graph``, with every shape fixed.

Rules:
- Asked for as Triton's onnxruntime backend takes it: the ``cuda`` execution accelerator's parameter
  ``enable_cuda_graph: "1"`` (the backend hands the accelerator's parameters to the CUDA EP as given; the config's
  ``optimization { cuda { graphs } }`` is read by Triton's other backends, not this one, nor here).
- A captured graph replays the same kernels on the same device addresses, so each session (one per batch bucket)
  runs on input and output buffers of fixed shapes, allocated and bound once (:class:`GraphRunner`).  A run copies
  its inputs into them (device to device for inputs in CUDA regions, host to device otherwise), zeros the rows past
  the batch, replays, and copies the requested outputs' rows out.
- So the load refuses, on every machine (GPU or not, as every other accelerator setting is checked), a config whose
  shapes are not fixed (:func:`check_fixed_shapes`): an input or output dim other than the batch dim that is not a
  number, string inputs or outputs, or a batching model whose batch buckets are ``off``.  With the option,
  ``cuda_batch_buckets: auto`` is on for every batching model on the CUDA EP (``batch_buckets.bucket_sizes``).
- ORT itself refuses a graph whose nodes are not all on the CUDA EP; the load then fails with its message.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._proto import model_config_pb2 as mc
from ..cuda import CudaRuntime, DeviceArray, DeviceBatch
from ..datatypes import ORT_TYPE_TO_V2, numpy_dtype
from ..errors import InvalidArgument
from ..model_config import DiscoveredTensor, shape_text
from .batch_buckets import PARAMETER as BUCKETS_PARAMETER

CUDA_GRAPH_OPTION = "enable_cuda_graph"


def wants_cuda_graph(cuda_options: Mapping[str, str]) -> bool:
    """Whether the CUDA EP options (checked: flags are "0" or "1") ask for CUDA graphs."""
    return cuda_options.get(CUDA_GRAPH_OPTION) == "1"


def check_fixed_shapes(
    config: mc.ModelConfig, inputs: Sequence[DiscoveredTensor], outputs: Sequence[DiscoveredTensor]
) -> None:
    """Refuse a config that asks for CUDA graphs where a shape is not fixed (see the module rules)."""
    what = f"model '{config.name}': the cuda execution accelerator's {CUDA_GRAPH_OPTION} needs every shape fixed"
    batching = config.max_batch_size > 0
    buckets = config.parameters[BUCKETS_PARAMETER].string_value.strip().lower() if (
        BUCKETS_PARAMETER in config.parameters) else "auto"
    if batching and config.max_batch_size > 1 and buckets in ("off", "none", "false", "0", ""):
        raise InvalidArgument(
            f"{what}: batches of any size are run as they come while '{BUCKETS_PARAMETER}' is off (leave it auto, "
            "or list the batch sizes)"
        )
    skip = 1 if batching else 0
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for tensor in tensors:
            if tensor.datatype == "BYTES":
                raise InvalidArgument(f"{what}: {kind} '{tensor.name}' is a string tensor, whose size follows its data")
            if any(dim is None for dim in tensor.shape[skip:]):
                shape = [-1 if dim is None else dim for dim in tensor.shape]
                raise InvalidArgument(
                    f"{what}: {kind} '{tensor.name}' has the shape {shape_text(shape)} in the model, whose "
                    f"{'non-batch ' if batching else ''}dims must all be numbers"
                )


class DeviceCopier:
    """Copies between host and device memory (cudaMemcpy's direction from the pointers) on the default stream."""

    def __init__(self, runtime: CudaRuntime) -> None:
        self._runtime = runtime

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        self._runtime.copy(destination, source, nbytes)

    def zero(self, pointer: int, nbytes: int) -> None:
        self._runtime.zero(pointer, nbytes)

    def synchronize(self) -> None:
        self._runtime.synchronize()


class HostCopier:
    """The same verbs on host memory (a session on the CPU; the tests' stand-in for device memory)."""

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        ctypes.memmove(destination, source, nbytes)

    def zero(self, pointer: int, nbytes: int) -> None:
        ctypes.memset(pointer, 0, nbytes)

    def synchronize(self) -> None:
        return None


class _Bound:
    """One input or output buffer of fixed shape, bound to the session once."""

    __slots__ = ("name", "value", "dtype", "shape", "pointer", "row_bytes")

    def __init__(self, ort: Any, name: str, dtype: np.dtype, shape: list[int], device: tuple[str, int]) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype.type, device[0], device[1])
        self.pointer = int(self.value.data_ptr())
        self.row_bytes = dtype.itemsize * math.prod(shape[1:]) if shape else dtype.itemsize


class GraphRunner:
    """Runs one session on buffers bound once (what a captured CUDA graph replays on); thread-safe.

    ``batch``: the session's batch size (dim 0 of every tensor), or None for a model that does not batch.
    """

    def __init__(
        self, ort: Any, session: Any, batch: int | None, device: tuple[str, int], copier: DeviceCopier | HostCopier
    ) -> None:
        self.batch = batch
        self._session = session
        self._copier = copier
        self._lock = threading.Lock()
        self._binding = session.io_binding()
        self._inputs: dict[str, _Bound] = {}
        self._outputs: dict[str, _Bound] = {}
        for tensors, bound, bind in (
            (session.get_inputs(), self._inputs, self._binding.bind_ortvalue_input),
            (session.get_outputs(), self._outputs, self._binding.bind_ortvalue_output),
        ):
            for tensor in tensors:
                dims = list(tensor.shape or ())
                shape = [batch, *dims[1:]] if batch is not None else dims
                if not all(type(dim) is int and dim >= 0 for dim in shape):  # (check_fixed_shapes refused these)
                    raise InvalidArgument(f"tensor '{tensor.name}' has no fixed shape ({dims}) for a CUDA graph")
                buffer = _Bound(ort, tensor.name, numpy_dtype(ORT_TYPE_TO_V2[tensor.type]), shape, device)
                bound[tensor.name] = buffer
                bind(tensor.name, buffer.value)

    def warm_up(self, runs: int = 2) -> None:
        """Runs on zeros: ORT warms up, then captures the graph, before any request pays for it."""
        with self._lock:
            for buffer in self._inputs.values():
                self._copier.zero(buffer.pointer, buffer.row_bytes * (buffer.shape[0] if buffer.shape else 1))
            self._copier.synchronize()
            for _ in range(runs):
                self._session.run_with_iobinding(self._binding)

    def run(self, feeds: Mapping[str, Any], rows: int, output_names: Sequence[str]) -> list[np.ndarray]:
        """Copy ``feeds`` (``rows`` rows each when batching) into the bound inputs, replay, and return the first
        ``rows`` rows of each of ``output_names`` (new host arrays: the buffers are the next run's)."""
        with self._lock:
            for name, value in feeds.items():
                self._fill(self._inputs[name], value)
            self._copier.synchronize()
            self._session.run_with_iobinding(self._binding)
            self._binding.synchronize_outputs()  # (ORT's stream done before the outputs are read)
            results = []
            for name in output_names:
                buffer = self._outputs[name]
                shape = (rows, *buffer.shape[1:]) if self.batch is not None else buffer.shape
                out = np.empty(shape, buffer.dtype)
                if out.nbytes:
                    self._copier.copy(out.ctypes.data, buffer.pointer, out.nbytes)  # copy: the one output copy
                results.append(out)
            return results

    def _fill(self, buffer: _Bound, value: Any) -> None:
        parts = value.parts if type(value) is DeviceBatch else [value]
        offset = buffer.pointer
        end = buffer.pointer + (buffer.row_bytes * buffer.shape[0] if buffer.shape else buffer.dtype.itemsize)
        for part in parts:
            if type(part) is DeviceArray:
                source = part.where.pointer  # copy: device to device (an input in a CUDA region)
            else:
                part = np.ascontiguousarray(part, buffer.dtype)
                source = part.ctypes.data  # copy: host to device (the one input copy)
            if offset + part.nbytes > end:
                raise InvalidArgument(f"input '{buffer.name}' has more rows than the session's {buffer.shape}")
            if part.nbytes:
                self._copier.copy(offset, source, part.nbytes)
            offset += part.nbytes
        if end > offset:
            self._copier.zero(offset, end - offset)  # the padding rows

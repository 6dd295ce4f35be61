"""``--shared-memory system|cuda``: tensors in shared-memory regions, as perf_analyzer does it.

- One input region per model holds the inputs of every distinct request (each
  tensor at its own 64-byte aligned offset); it is written once.
- One output region holds each output whose size is known in advance (fixed
  datatype and shape); all requests share it, so under load its content is
  whatever finished last (only the probe reads it back, for ``--verify``).
  Other outputs (BYTES, variable dims) come back in the response as usual.
- System regions are ``/dev/shm/bench_fastoip-<pid>-<n>-{in,out}`` (not ``fastoip-``: a server refuses
  those keys, its own), registered with SystemSharedMemoryRegister (gRPC) or
  ``POST v2/systemsharedmemory/region/<name>/register`` (HTTP), and unregistered and unlinked when the model is done.
- CUDA regions are cudaMalloc allocations on ``device_id`` (GPU 0), filled with
  cudaMemcpy and registered by their cudaIPC handle (CudaSharedMemoryRegister,
  ``POST v2/cudasharedmemory/region/<name>/register``); freed when the model is done.
"""

from __future__ import annotations

import itertools
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..datatypes import ITEM_SIZES, NUMPY_DTYPES
from .inputs import ModelPlan, raw_bytes
from .target import BenchError

SHM_DIR = "/dev/shm"
ALIGN = 64
REGION, OFFSET, BYTE_SIZE = "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"
_counter = itertools.count()


@dataclass
class Placement:
    """Where one request's tensors live: parameters per input, and per output (empty: inline)."""

    inputs: dict[str, dict] = field(default_factory=dict)
    outputs: list[tuple[str, dict]] = field(default_factory=list)


def _align(value: int) -> int:
    return (value + ALIGN - 1) // ALIGN * ALIGN


class _SystemRegion:
    """A POSIX shared-memory object of ``size`` bytes, mapped here."""

    def __init__(self, key: str, size: int) -> None:
        self.key = key
        self.path = os.path.join(SHM_DIR, key)
        self.size = max(1, size)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self.mapping = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)

    def write(self, offset: int, blob: bytes) -> None:
        self.mapping[offset : offset + len(blob)] = blob

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.mapping[offset : offset + size])

    def register(self, control: Any) -> None:
        control.register_system_shm(self.key, self.key, self.size)

    def unregister(self, control: Any) -> None:
        control.unregister_system_shm(self.key)

    def close(self) -> None:
        self.mapping.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class _CudaRegion:
    """``size`` bytes of device memory, shared with the server by its cudaIPC handle."""

    def __init__(self, key: str, size: int, device_id: int = 0) -> None:
        from .. import cuda

        runtime = cuda.runtime()
        if runtime is None:
            raise BenchError("--shared-memory cuda needs a GPU and the CUDA runtime on the client", stage="shm")
        self.runtime, self.key, self.size, self.device_id = runtime, key, max(1, size), device_id
        self.pointer = self._cuda(runtime.malloc, self.size, device_id)

    def _cuda(self, call: Any, *args: Any) -> Any:
        from ..cuda import CudaError

        try:
            return call(*args)
        except CudaError as exc:
            raise BenchError(f"CUDA shared memory region '{self.key}': {exc}", stage="shm") from None

    def write(self, offset: int, blob: bytes) -> None:
        source = np.frombuffer(blob, dtype=np.uint8)
        self._cuda(self.runtime.copy, self.pointer + offset, source.ctypes.data, source.nbytes)

    def read(self, offset: int, size: int) -> bytes:
        out = np.empty(size, dtype=np.uint8)
        self._cuda(self.runtime.copy, out.ctypes.data, self.pointer + offset, size)
        return out.tobytes()

    def register(self, control: Any) -> None:
        handle = self._cuda(self.runtime.ipc_handle, self.pointer)
        control.register_cuda_shm(self.key, handle, self.device_id, self.size)

    def unregister(self, control: Any) -> None:
        control.unregister_cuda_shm(self.key)

    def close(self) -> None:
        if self.pointer:
            self._cuda(self.runtime.free, self.pointer)
            self.pointer = 0


class SharedRegions:
    """The regions of one model: created, filled and registered on construction; ``close()`` undoes it.

    ``kind``: "system" or "cuda".
    """

    def __init__(
        self, control: Any, plan: ModelPlan, requests: list[dict[str, np.ndarray]], kind: str = "system"
    ) -> None:
        if kind == "system" and not os.path.isdir(SHM_DIR):
            raise BenchError(f"--shared-memory system needs {SHM_DIR}", stage="shm")
        self.control = control
        self.kind = kind
        self.registered: list[_SystemRegion | _CudaRegion] = []
        self.regions: list[_SystemRegion | _CudaRegion] = []
        base = f"bench_fastoip-{os.getpid()}-{next(_counter)}"
        try:
            self._build(base, plan, requests)
        except BaseException:
            self.close()
            raise

    def _build(self, base: str, plan: ModelPlan, requests: list[dict[str, np.ndarray]]) -> None:
        blobs = [[raw_bytes(t.datatype, tensors[t.name]) for t in plan.inputs] for tensors in requests]
        offsets, total = [], 0
        for request_blobs in blobs:
            row = []
            for blob in request_blobs:
                row.append((total, len(blob)))
                total = _align(total + len(blob))
            offsets.append(row)
        inputs = self._region(f"{base}-in", total)
        for request_blobs, row in zip(blobs, offsets, strict=True):
            for blob, (offset, _size) in zip(request_blobs, row, strict=True):
                inputs.write(offset, blob)
        self.output_spans: dict[str, tuple[int, int, str, list[int]]] = {}
        out_total = 0
        for output in plan.outputs:
            if output.datatype == "BYTES" or any(d < 0 for d in output.shape):
                continue
            size = int(np.prod(output.shape)) * ITEM_SIZES[output.datatype]
            self.output_spans[output.name] = (out_total, size, output.datatype, list(output.shape))
            out_total = _align(out_total + size)
        outputs = self._region(f"{base}-out", out_total) if self.output_spans else None
        self.outputs = outputs
        self.placements = []
        for row in offsets:
            placement = Placement()
            for tensor, (offset, size) in zip(plan.inputs, row, strict=True):
                placement.inputs[tensor.name] = {REGION: inputs.key, OFFSET: offset, BYTE_SIZE: size}
            if outputs is not None:
                for output in plan.outputs:
                    span = self.output_spans.get(output.name)
                    params = {REGION: outputs.key, OFFSET: span[0], BYTE_SIZE: span[1]} if span else {}
                    placement.outputs.append((output.name, params))
            self.placements.append(placement)

    def _region(self, key: str, size: int) -> _SystemRegion | _CudaRegion:
        region = _CudaRegion(key, size) if self.kind == "cuda" else _SystemRegion(key, size)
        self.regions.append(region)
        # Region name = key: unique per bench process and model.
        region.register(self.control)
        self.registered.append(region)
        return region

    @property
    def shm_outputs(self) -> set[str]:
        return set(self.output_spans)

    def fill_outputs(self, outputs: list[Any]) -> None:
        """Give outputs that were written into the region their data (for the probe's checks)."""
        if self.outputs is None:
            return
        for output in outputs:
            span = self.output_spans.get(output.name)
            if span is None or output.data is not None:
                continue
            offset, size, datatype, shape = span
            data = self.outputs.read(offset, size)
            output.data = np.frombuffer(data, dtype=NUMPY_DTYPES[datatype]).reshape(shape)

    def close(self) -> None:
        for region in self.registered:
            try:
                region.unregister(self.control)
            except BenchError:
                pass
        self.registered.clear()
        for region in self.regions:
            try:
                region.close()
            except BenchError:
                pass  # nothing more to do for it; the others are still released
        self.regions.clear()

"""The few CUDA runtime calls fastoip needs, through ctypes (no CUDA Python package).

Rules:
- ``runtime()`` loads ``libcudart`` once: the copy onnxruntime-gpu's NVIDIA wheels
  ship, or the system's; ``None`` when there is none or no device answers.
  Nothing here is imported or loaded on a CPU-only server until asked.
- Used for: pinned (page-locked) host buffers for batches on the CUDA EP,
  CUDA shared-memory regions (cudaIPC handles that clients such as
  ``tritonclient.utils.cuda_shared_memory`` create), and the regions
  ``fastoip bench --shared-memory cuda`` creates as such a client.
- ``DeviceBytes`` is a span of device memory; ``DeviceArray`` is one typed
  tensor in it: what ORT writes when an output is bound to the span, and an
  input read from a CUDA region that ORT reads in place (``backends/onnx.py``).
- ``gather_to_device`` merges a batch's inputs into one device buffer from a
  ``DevicePool`` (device-to-device copies; host parts are copied up).
- Every CUDA error becomes :class:`CudaError` with CUDA's own message.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np

log = logging.getLogger("fastoip.cuda")

IPC_HANDLE_BYTES = 64
HOST_ALLOC_PORTABLE = 1
IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (unified addressing)


class CudaError(RuntimeError):
    pass


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def _candidates() -> list[str]:
    """libcudart locations, newest CUDA first: NVIDIA's pip wheels, then the loader's search path.

    ``FASTOIP_CUDA_RUNTIME`` names the one library to use instead (CUDA in an unusual place).
    """
    chosen = os.environ.get("FASTOIP_CUDA_RUNTIME")
    if chosen:
        return [chosen]
    found = []
    for site in sys.path:
        found += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so.*")), reverse=True)
        found += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so.*")), reverse=True)
    return found + ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]


class CudaRuntime:
    """Bound libcudart functions; every call checks its cudaError_t."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        c_void_p, c_size_t, c_uint, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [c_int]
        signatures = {
            "cudaGetDeviceCount": [ctypes.POINTER(c_int)],
            "cudaSetDevice": [c_int],
            "cudaGetDevice": [ctypes.POINTER(c_int)],
            "cudaHostAlloc": [ctypes.POINTER(c_void_p), c_size_t, c_uint],
            "cudaFreeHost": [c_void_p],
            "cudaMalloc": [ctypes.POINTER(c_void_p), c_size_t],
            "cudaFree": [c_void_p],
            "cudaIpcGetMemHandle": [ctypes.POINTER(_IpcHandle), c_void_p],
            "cudaIpcOpenMemHandle": [ctypes.POINTER(c_void_p), _IpcHandle, c_uint],
            "cudaIpcCloseMemHandle": [c_void_p],
            "cudaMemcpy": [c_void_p, c_void_p, c_size_t, c_int],
            "cudaMemset": [c_void_p, c_int, c_size_t],
            "cudaStreamSynchronize": [c_void_p],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = c_int

    def _call(self, name: str, *args: object, what: str = "") -> None:
        """libcudart's ``name`` on ``args``; a status other than cudaSuccess raises :class:`CudaError` with CUDA's
        own message, naming ``what`` (default: the function)."""
        status = getattr(self._lib, name)(*args)
        if status != 0:
            message = self._lib.cudaGetErrorString(status).decode(errors="replace")
            raise CudaError(f"{what or name} failed: {message} (cudaError {status})")

    def _new_pointer(self, name: str, *args: object) -> int:
        """The address that ``name`` (cudaMalloc, cudaHostAlloc, cudaIpcOpenMemHandle) writes into its first
        argument, the other arguments being ``args``."""
        pointer = ctypes.c_void_p()
        self._call(name, ctypes.byref(pointer), *args)
        return int(pointer.value or 0)

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self._call("cudaGetDeviceCount", ctypes.byref(count))
        return count.value

    def host_alloc(self, nbytes: int) -> int:
        return self._new_pointer("cudaHostAlloc", nbytes, HOST_ALLOC_PORTABLE)

    def free_host(self, pointer: int) -> None:
        self._call("cudaFreeHost", ctypes.c_void_p(pointer))

    def malloc(self, nbytes: int, device_id: int) -> int:
        """Device memory on ``device_id`` (the calling thread's device is left as it was)."""
        with self._on_device(device_id):
            return self._new_pointer("cudaMalloc", nbytes)

    def free(self, pointer: int) -> None:
        self._call("cudaFree", ctypes.c_void_p(pointer))

    def ipc_handle(self, pointer: int) -> bytes:
        """The 64-byte cudaIpcMemHandle_t another process opens to share this allocation."""
        handle = _IpcHandle()
        self._call("cudaIpcGetMemHandle", ctypes.byref(handle), ctypes.c_void_p(pointer))
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    @contextlib.contextmanager
    def _on_device(self, device_id: int) -> Iterator[None]:
        previous = ctypes.c_int(0)
        self._call("cudaGetDevice", ctypes.byref(previous))
        self._call("cudaSetDevice", device_id, what=f"cudaSetDevice({device_id})")
        try:
            yield
        finally:
            self._lib.cudaSetDevice(previous.value)

    def ipc_open(self, raw_handle: bytes, device_id: int) -> int:
        """Map another process's cudaMalloc allocation; returns its address in this process."""
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise CudaError(f"a cudaIpcMemHandle_t is {IPC_HANDLE_BYTES} bytes, got {len(raw_handle)}")
        handle = _IpcHandle()
        ctypes.memmove(ctypes.byref(handle), raw_handle, IPC_HANDLE_BYTES)
        with self._on_device(device_id):  # the calling thread's device is left as it was
            return self._new_pointer("cudaIpcOpenMemHandle", handle, IPC_MEM_LAZY_ENABLE_PEER_ACCESS)

    def ipc_close(self, pointer: int) -> None:
        self._call("cudaIpcCloseMemHandle", ctypes.c_void_p(pointer))

    def allocation_size(self, pointer: int) -> int | None:
        """Bytes from ``pointer`` to the end of its allocation (driver API), or None if unknown."""
        try:
            driver = ctypes.CDLL("libcuda.so.1")
            function = driver.cuMemGetAddressRange_v2
        except (OSError, AttributeError):
            return None
        function.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        function.restype = ctypes.c_int
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        if function(ctypes.byref(base), ctypes.byref(size), pointer) != 0:
            return None
        return int(base.value + size.value - pointer)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """A synchronous copy in any direction (host or device pointers)."""
        self._call("cudaMemcpy", ctypes.c_void_p(destination), ctypes.c_void_p(source), nbytes, MEMCPY_DEFAULT)

    def synchronize(self) -> None:
        """Wait for the copies and fills issued here (the default stream): a device-to-device ``copy`` and ``zero``
        return before they are done, and ORT reads on a stream of its own that does not wait for them."""
        self._call("cudaStreamSynchronize", None)

    def zero(self, pointer: int, nbytes: int) -> None:
        """``nbytes`` of zeros at ``pointer`` (device memory)."""
        self._call("cudaMemset", ctypes.c_void_p(pointer), 0, nbytes)


def free_quietly(free: Callable[[int], None], pointer: int, what: str) -> None:
    """``free(pointer)`` from a finalizer (``__del__``), where a CudaError can only be logged."""
    try:
        free(pointer)
    except CudaError as exc:  # nothing to do but say so
        log.warning("freeing %s: %s", what, exc)


_runtime: CudaRuntime | None = None
_searched = False
_search_lock = threading.Lock()


def runtime() -> CudaRuntime | None:
    """The CUDA runtime when a library loads and at least one device answers, else None."""
    global _runtime, _searched
    with _search_lock:
        if not _searched:
            _searched = True
            _runtime = _load()
    return _runtime


def _load() -> CudaRuntime | None:
    tried = []
    for candidate in _candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        tried.append(candidate)
        try:
            cuda = CudaRuntime(lib)
            if cuda.device_count() > 0:
                log.info("CUDA runtime: %s", candidate)
                return cuda
        except (AttributeError, CudaError) as exc:
            # on a host without a GPU the runtime says "driver version is insufficient": true, and read as an
            # error by everyone; the detail is for whoever debugs a GPU host
            log.debug("CUDA runtime %s is not usable: %s", candidate, exc)
    if tried:
        log.info("no CUDA GPU on this host: models run on the CPU")
    return None


# -- pinned host memory ------------------------------------------------------------------------
#: Triton's --pinned-memory-pool-byte-size default: 256 MB.
DEFAULT_PINNED_POOL_BYTES = 256 * 1024 * 1024


class PinnedPool:
    """The budget of page-locked host bytes (Triton's pinned memory pool: its size and what is in use).

    Triton carves its pool out of one block; here each batch buffer is its own
    ``cudaHostAlloc`` and the pool is the bound on their total: a buffer that
    would pass it is allocated pageable instead (Triton falls back the same way).
    """

    def __init__(self, total: int = DEFAULT_PINNED_POOL_BYTES) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.total:
                return False
            self.used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used = max(0, self.used - nbytes)


#: The process's pool (``fastoip serve --pinned-memory-pool-byte-size`` sets its size).
pinned_pool = PinnedPool()


def set_pinned_pool_size(total: int) -> None:
    """Triton's --pinned-memory-pool-byte-size: 0 turns pinned batch buffers off."""
    pinned_pool.total = total


class _PinnedBlock:
    """Owns one cudaHostAlloc block; numpy arrays on it keep it alive through ``base``."""

    def __init__(self, cuda: CudaRuntime, nbytes: int) -> None:
        self._cuda = cuda
        self._nbytes = 0
        self._pointer = cuda.host_alloc(nbytes)
        self._nbytes = nbytes
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (self._pointer, False),
            "version": 3,
        }

    def __del__(self) -> None:
        if self._pointer:
            free_quietly(self._cuda.free_host, self._pointer, "pinned memory")
            self._pointer = 0
            pinned_pool.release(self._nbytes)


def pinned_allocator(nbytes: int) -> np.ndarray:
    """Page-locked host bytes (a DMA source for the CUDA EP's host-to-device copy).

    Falls back to ordinary memory, with one warning, when CUDA cannot pin it.
    """
    cuda = runtime()
    if cuda is not None:
        if not pinned_pool.reserve(nbytes):
            _warn_once(f"the pinned memory pool ({pinned_pool.total} bytes) is used up: "
                       "further batches use pageable memory")
            return np.empty(nbytes, dtype=np.uint8)
        try:
            return np.asarray(_PinnedBlock(cuda, nbytes))
        except CudaError as exc:
            pinned_pool.release(nbytes)
            _warn_once(f"pinned host memory is not available, batches use pageable memory: {exc}")
    else:
        _warn_once("no CUDA runtime found: batches use pageable host memory")
    return np.empty(nbytes, dtype=np.uint8)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


# -- device memory spans -----------------------------------------------------------------------
class DeviceBytes:
    """``nbytes`` of device memory at ``pointer`` on ``device_id``; ``owner`` keeps the mapping open."""

    __slots__ = ("pointer", "nbytes", "device_id", "owner")

    def __init__(self, pointer: int, nbytes: int, device_id: int, owner: object) -> None:
        self.pointer = pointer
        self.nbytes = nbytes
        self.device_id = device_id
        self.owner = owner


class DeviceArray:
    """A tensor ORT wrote into device memory: enough of an array for a response (shape, dtype)."""

    __slots__ = ("where", "dtype", "shape", "nbytes")

    def __init__(self, where: DeviceBytes, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.where = where
        self.dtype = dtype
        self.shape = shape
        self.nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))


class DeviceBatch:
    """One input of a batch, still in its requests' parts (some in device memory): the backend gathers it into one
    device buffer of its own (:func:`gather_to_device`), padded to the batch size it runs."""

    __slots__ = ("parts", "dtype", "shape", "nbytes")

    def __init__(self, parts: list) -> None:
        first = parts[0]
        self.parts = parts
        self.dtype: np.dtype = first.dtype
        self.shape = (sum(int(part.shape[0]) for part in parts), *first.shape[1:])
        self.nbytes = sum(int(part.nbytes) for part in parts)


def host_copy(array: DeviceArray) -> np.ndarray:
    """``array``'s bytes on the host, in a new array (for a consumer that needs host memory)."""
    host = np.empty(array.shape, array.dtype)
    owner = array.where.owner
    cuda = getattr(owner, "runtime", None) or runtime()
    if cuda is None:  # pragma: no cover - a DeviceArray exists only where a runtime opened its memory
        raise CudaError("no CUDA runtime to copy a device tensor to the host")
    if array.nbytes:
        cuda.copy(host.ctypes.data, array.where.pointer, array.nbytes)
    return host


class DeviceBlock:
    """One cudaMalloc allocation, freed when the last reference goes (a ``DevicePool``'s buffer)."""

    __slots__ = ("runtime", "pointer", "nbytes", "device_id", "__weakref__")

    def __init__(self, cuda: CudaRuntime, nbytes: int, device_id: int) -> None:
        self.runtime = cuda
        self.pointer = 0
        self.pointer = cuda.malloc(nbytes, device_id)
        self.nbytes = nbytes
        self.device_id = device_id

    def __del__(self) -> None:
        if self.pointer:
            free_quietly(self.runtime.free, self.pointer, "device memory")
            self.pointer = 0


class DevicePool:
    """Free device buffers per (input name, device), as ``scheduling.buffers.BufferPool`` keeps host ones.

    A buffer is taken for one execution and given back after it; each grows to the largest batch seen, so the
    pool holds at most (executions at once) x (inputs) buffers.  Thread-safe.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[str, int], list[DeviceBlock]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.allocations = 0

    def take(self, cuda: CudaRuntime, name: str, nbytes: int, device_id: int) -> DeviceBlock:
        key = (name, device_id)
        block = None
        with self._lock:
            free = self._free.get(key)
            if free:
                block = free.pop()
        if block is None or block.nbytes < nbytes:
            self.allocations += 1
            block = DeviceBlock(cuda, max(nbytes, 256), device_id)  # (cudaMalloc aligns to 256 bytes)
        return block

    def give_back(self, name: str, block: DeviceBlock) -> None:
        with self._lock:
            if not self._closed:
                self._free.setdefault((name, block.device_id), []).append(block)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._free.clear()


def gather_to_device(
    name: str, parts: list, rows: int, device_id: int, pool: DevicePool, taken: list[tuple[str, DeviceBlock]]
) -> DeviceArray:
    """``parts`` (DeviceArrays and host arrays of one dtype, same non-batch shape) one after another along dim 0
    in one device buffer of ``rows`` rows; rows past the parts are zeros (bucket padding).

    The buffer comes from ``pool`` and is appended to ``taken``: the caller gives it back once the model ran.
    """
    first = parts[0]
    dtype = first.dtype
    inner = tuple(first.shape[1:])
    row_bytes = dtype.itemsize * math.prod(inner)
    cuda = _runtime_of(parts)
    block = pool.take(cuda, name, rows * row_bytes, device_id)
    taken.append((name, block))
    offset = block.pointer
    for part in parts:
        nbytes = part.nbytes
        if type(part) is DeviceArray:
            source = part.where.pointer  # copy: device to device, each request's rows into the batch buffer
        else:
            part = np.ascontiguousarray(part)
            source = part.ctypes.data  # copy: host to device (a request whose input came in host memory)
        if nbytes:
            cuda.copy(offset, source, nbytes)
        offset += nbytes
    end = block.pointer + rows * row_bytes
    if end > offset:
        cuda.zero(offset, end - offset)
    cuda.synchronize()  # done before ORT, on its own stream, reads the buffer
    return DeviceArray(DeviceBytes(block.pointer, rows * row_bytes, device_id, block), dtype, (rows, *inner))


def _runtime_of(parts: list) -> CudaRuntime:
    for part in parts:
        if type(part) is DeviceArray:
            owner = part.where.owner
            cuda = getattr(owner, "runtime", None)
            if isinstance(cuda, CudaRuntime):
                return cuda
    found = runtime()
    if found is None:  # pragma: no cover - a DeviceArray exists only where a runtime opened its memory
        raise CudaError("no CUDA runtime to gather device inputs")
    return found

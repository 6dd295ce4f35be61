"""Shared-memory regions: Triton's system_shared_memory and cuda_shared_memory extensions.

Rules:
- System and CUDA regions share one namespace of names, as in Triton.
- A region is a POSIX shared-memory object (``shm_open(key)``, i.e.
  ``/dev/shm/<key>``) mapped once at registration; ``offset`` and
  ``byte_size`` delimit the part the client lends to the server.
- Inputs read from a region are numpy views on the mapping (no copy).
  Outputs are copied into the region (the one output copy), unless the backend
  computed them there in the first place (ONNX models: no copy at all).
- Every offset and size a request names is checked against the region.
- Unregistering only drops the registry's reference: a request still using
  the region keeps the mapping alive through its views, and the mapping is
  unmapped when the last view goes away.  In-flight requests are never cut off.
- The client owns the object and may shrink it at any time.  Every use checks
  the object's current size (``fstat``) and refuses a region that no longer
  fits; a shrink racing with a request is caught by the SIGBUS guard
  (``_shmguard``), and the request answers INVALID_ARGUMENT instead of the
  server dying.  A region that faulted stays refused until re-registered.
- Keys name regular files directly in /dev/shm: no symlinks (``O_NOFOLLOW``),
  no FIFOs, devices or directories, and not Triton's reserved prefix.
- A client can name only memory it lent: a key starting with ``fastoip-``
  (the server's and its workers' segments, :data:`OWN_KEY_PREFIX`) is refused
  before anything is opened, and so is any other name for one of those
  objects (a hard link: same device and inode), in the same words as a
  reserved prefix, without saying whether the object exists or how large it is.
  A refusal for a bad offset or size does not state the object's size either.
- Registrations are bounded: :data:`REGION_LIMIT` in all and
  :data:`REGION_LIMIT_PER_CLIENT` per client (its address) by default
  (``--shared-memory-max-regions``, ``--shared-memory-max-regions-per-client``),
  at most :data:`REGION_LIMIT_CEILING`, below the SIGBUS guard's 4,096
  mappings, so one client cannot take the table from the others; past either
  the answer is RESOURCE_EXHAUSTED at once: HTTP 429 past the client's share
  (it must unregister), 503 with Retry-After past the server's table
  (``errors``).
- A CUDA region is another process's cudaMalloc allocation, opened from its
  cudaIPC handle on the client's device.  Inputs in it stay there (a
  ``DeviceArray`` that ORT reads in place) when the model says it reads device
  inputs on that GPU; otherwise they are copied to host memory (one copy, as
  if they had come over the wire).  Outputs are copied in,
  or bound as ORT's output on the CUDA EP (no copy).  The handle is closed when
  the registry and the last request using it let go (``CudaMapping``).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from dataclasses import dataclass

import numpy as np

from . import cuda
from ._shmguard import GuardedMapping
from .cuda import DeviceArray, DeviceBytes
from .datatypes import ITEM_SIZES, numpy_dtype
from .errors import AlreadyExists, InternalError, InvalidArgument, NotFound, ResourceExhausted, Unavailable

SHM_DIR = "/dev/shm"
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
#: Keys Triton keeps for its Python backend's own regions (``kTritonSharedMemoryRegionPrefix``).
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
#: Keys reserved for fastoip's own objects (the Python workers' segments were ``fastoip-pyw-*`` files; they are
#: nameless memfds now): never a client's.
OWN_KEY_PREFIX = "fastoip-"
#: Regions registered at once (system and CUDA), and per client, by default (``--shared-memory-max-regions``,
#: ``--shared-memory-max-regions-per-client``): below the SIGBUS guard's 4,096 mappings.
REGION_LIMIT = 1024
REGION_LIMIT_PER_CLIENT = 256
#: The most ``--shared-memory-max-regions`` may say: half the SIGBUS guard's table (``_shmguard.h``), whatever
#: else maps under the guard keeps the rest.
REGION_LIMIT_CEILING = 2048


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: GuardedMapping
    client: str = ""

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def check_intact(self) -> None:
        """Refuse the region when a fault was repaired in it or its object no longer holds it."""
        if self.mapping.faulted:
            raise InvalidArgument(
                f"shared memory region '{self.name}' shrank while in use (its object '{self.key}' was truncated); "
                "register it again to use it"
            )
        size = self.mapping.file_size()
        if size < self.offset + self.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{self.name}': the object '{self.key}' is "
                f"now {size} bytes, smaller than offset {self.offset} + byte size {self.byte_size}"
            )


class CudaMapping:
    """An opened cudaIPC handle: closed when nothing refers to it any more."""

    def __init__(self, runtime: cuda.CudaRuntime, pointer: int) -> None:
        self.runtime = runtime
        self.pointer = pointer

    def __del__(self) -> None:
        try:
            self.runtime.ipc_close(self.pointer)
        except cuda.CudaError as exc:  # nothing else to do with it at this point
            import logging

            logging.getLogger("fastoip.shared_memory").warning("closing a CUDA shared memory handle: %s", exc)


@dataclass
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    mapping: CudaMapping
    offset: int = 0  # the handle names the whole allocation
    client: str = ""

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


SYSTEM, CUDA = "system", "cuda"


def cuda_unavailable() -> Unavailable:
    return Unavailable("CUDA shared memory needs a GPU and the CUDA runtime; neither is available on this server")


def _kind_class(kind: str) -> type:
    # Status and unregister work on any host, as in Triton: without a GPU there are simply no CUDA regions.
    return CudaRegion if kind == CUDA else Region


def _reserved(name: str, key: str, prefix: str) -> InvalidArgument:
    # Triton's words for its reserved prefix (shared_memory_manager.cc), nothing about the object itself
    return InvalidArgument(
        f"cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved "
        f"prefix '{prefix}'"
    )


def _is_own_object(info: os.stat_result) -> bool:
    """Whether the file ``info`` describes is one of fastoip's own objects under another name (a hard link).

    Registration only (a scan of the ``fastoip-`` names in /dev/shm); the infer path never calls it."""
    if info.st_nlink < 2:
        return False  # its only name is the one given, which is not ours
    try:
        with os.scandir(SHM_DIR) as entries:
            for entry in entries:
                if entry.name.startswith(OWN_KEY_PREFIX):
                    try:
                        own = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if own.st_ino == info.st_ino and own.st_dev == info.st_dev:
                        return True
    except OSError:
        return False
    return False


def _open_key(name: str, key: str) -> int:
    """Open the object ``key`` names in /dev/shm for reading and writing: a plain name, never a link."""
    bare = key.lstrip("/")  # as glibc's shm_open: every leading '/' goes
    if not bare:
        raise InvalidArgument(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    for prefix in (RESERVED_KEY_PREFIX, OWN_KEY_PREFIX):
        if bare.startswith(prefix):
            raise _reserved(name, key, prefix)
    if "/" in bare or "\0" in bare or bare in (".", ".."):
        # Triton's shm_open fails on these: its words, then why (a client mistake here: INVALID_ARGUMENT).
        raise InvalidArgument(
            f"Unable to open shared memory region: '{key}' (region '{name}': not a valid POSIX shared memory "
            "name ('/name' or 'name', without further '/' or NUL))"
        )
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after, by fstat).
        return os.open(os.path.join(SHM_DIR, bare), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        message = f"Unable to open shared memory region: '{key}' (region '{name}': {reason})"
        # No such object: Triton's shm_open failure, INTERNAL; a link or a directory is fastoip's refusal.
        raise (InternalError if exc.errno == errno.ENOENT else InvalidArgument)(message) from None


#: Triton's ``SIZE_MAX`` (a 64-bit size_t): an offset and byte size that add past it overflow in Triton.
_SIZE_MAX = 2**64 - 1


class SharedMemoryRegistry:
    """Registered system and CUDA regions by name; thread-safe."""

    def __init__(self, limit: int = REGION_LIMIT, limit_per_client: int = REGION_LIMIT_PER_CLIENT) -> None:
        self._regions: dict[str, Region | CudaRegion] = {}
        self._lock = threading.Lock()
        self.limit = limit
        self.limit_per_client = limit_per_client
        #: Regions registered per client (its address; "" for callers in this process).
        self._per_client: dict[str, int] = {}

    def _check_new(self, name: str, client: str) -> None:
        if not name:
            raise InvalidArgument("failed to register shared memory region '': invalid args (the region needs a name)")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if self._per_client.get(client, 0) >= self.limit_per_client:
            raise ResourceExhausted(
                f"cannot register shared memory region '{name}': this client already has {self.limit_per_client} "
                "regions registered, the most one client may; unregister some first"
            )
        if len(self._regions) >= self.limit:
            raise ResourceExhausted(  # the server's table, not this client's share: 503 with Retry-After
                f"cannot register shared memory region '{name}': the server holds {self.limit} shared memory "
                "regions, the most it takes; try again once some are unregistered", retry_after=1,
            )

    def _add(self, region: Region | CudaRegion) -> None:
        with self._lock:
            self._check_new(region.name, region.client)
            self._regions[region.name] = region
            self._per_client[region.client] = self._per_client.get(region.client, 0) + 1

    def _forget(self, name: str) -> None:
        """Drop ``name`` (the lock is held)."""
        region = self._regions.pop(name)
        left = self._per_client.get(region.client, 1) - 1
        if left > 0:
            self._per_client[region.client] = left
        else:
            self._per_client.pop(region.client, None)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int, client: str = "") -> None:
        """Open a client's cudaIPC handle (``raw_handle``: the 64 raw bytes) on ``device_id``."""
        with self._lock:
            self._check_new(name, client)
        runtime = cuda.runtime()
        if runtime is None:
            raise cuda_unavailable()
        if device_id < 0 or byte_size <= 0:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args (device_id {device_id} and "
                f"byte_size {byte_size} must be non-negative and positive)"
            )
        try:
            pointer = runtime.ipc_open(raw_handle, device_id)
        except cuda.CudaError as exc:
            raise InvalidArgument(f"failed to register CUDA shared memory region '{name}': {exc}") from None
        mapping = CudaMapping(runtime, pointer)
        allocated = runtime.allocation_size(pointer)
        if allocated is not None and byte_size > allocated:
            raise InvalidArgument(
                f"CUDA shared memory region '{name}': byte_size {byte_size} exceeds the allocation's "
                f"{allocated} bytes"
            )
        self._add(CudaRegion(name, device_id, byte_size, mapping, client=client))

    def register(self, name: str, key: str, offset: int, byte_size: int, client: str = "") -> None:
        """Map ``byte_size`` bytes at ``offset`` of the object ``key`` as region ``name``, for ``client`` (its
        address: the per-client bound)."""
        with self._lock:
            self._check_new(name, client)
        fd = _open_key(name, key)
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and _is_own_object(info):
                raise _reserved(name, key, OWN_KEY_PREFIX)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgument(
                    f"unable to register shared memory region '{name}': key '{key}' is not a shared memory object "
                    "(a regular file in /dev/shm)"
                )
            size = info.st_size
            if offset < 0 or byte_size <= 0 or offset + byte_size > size:
                # (the object's size is not stated: a probe learns no more than that the span does not fit)
                why = (f"byte_size {byte_size} must be positive" if byte_size <= 0 else
                       f"offset {offset} + byte_size {byte_size} exceeds the shared memory object '{key}'")
                raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args ({why})")
            try:
                mapping = GuardedMapping(fd, size)
            except MemoryError as exc:  # the SIGBUS guard's table is full (the bounds above keep room in it)
                raise ResourceExhausted(f"unable to map shared memory region '{name}': {exc}") from None
            except OSError as exc:
                raise InvalidArgument(f"unable to map shared memory region '{name}': {exc}") from None
        finally:
            os.close(fd)
        self._add(Region(name, key, offset, byte_size, mapping, client=client))

    def unregister(self, name: str = "", kind: str = SYSTEM) -> None:
        """Forget ``name`` (or every region of ``kind`` when empty); mappings in use stay until released."""
        wanted = _kind_class(kind)
        with self._lock:
            names = [name] if name else list(self._regions)
            # Triton: unregistering an unknown region is not an error.  A mapping (system or
            # CUDA) is released when the last request holding it is done.
            for n in names:
                if isinstance(self._regions.get(n), wanted):
                    self._forget(n)

    def status(self, name: str = "", kind: str = SYSTEM) -> list[dict]:
        wanted = _kind_class(kind)
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
                if not isinstance(region, wanted):
                    other = SYSTEM if kind == CUDA else CUDA
                    raise NotFound(
                        f"The region named '{name}' is registered as {other} shared memory, not {kind} shared memory"
                    )
                return [region.status()]
            return [r.status() for r in self._regions.values() if isinstance(r, wanted)]

    def _get(self, name: str) -> Region | CudaRegion:
        region = self._regions.get(name)  # one dict lookup is atomic; the lock guards check-then-act
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        return region

    def _span(
        self, tensor: str, parameters: dict, uses: list[Region] | None
    ) -> tuple[Region | CudaRegion, int, int]:
        region = self._get(str(parameters[REGION]))
        if isinstance(region, Region):
            region.check_intact()  # the client may have shrunk it since the last use
            if uses is not None:
                uses.append(region)
        offset = parameters.get(OFFSET, 0)
        byte_size = parameters.get(BYTE_SIZE)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgument(f"tensor '{tensor}': invalid {OFFSET} {offset!r}")
        if byte_size is None:
            byte_size = region.byte_size - offset
        if not isinstance(byte_size, int) or isinstance(byte_size, bool) or byte_size < 0:
            raise InvalidArgument(f"tensor '{tensor}': invalid {BYTE_SIZE} {byte_size!r}")
        if offset < region.byte_size and byte_size > _SIZE_MAX - offset:  # Triton's check, in its order and words
            raise InvalidArgument(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value "
                f"({_SIZE_MAX}) for region '{region.name}'"
            )
        if offset + byte_size > region.byte_size:
            triton = "Invalid offset" if offset >= region.byte_size else "Invalid offset + byte size"
            raise InvalidArgument(
                f"{triton} for shared memory region: '{region.name}' (tensor '{tensor}': shared memory offset "
                f"{offset} + byte size {byte_size} exceeds region '{region.name}' of {region.byte_size} bytes)"
            )
        return region, region.offset + offset, byte_size

    def input_view(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        parameters: dict,
        uses: list[Region] | None = None,
        model: str = "",
        device_id: int = -1,
    ) -> np.ndarray | DeviceArray:
        """A zero-copy view of an input held in a region, checked against the region (``model``: for errors).

        The system region is appended to ``uses``: check them with :func:`check_intact`
        once the request is done, before its answer goes out.  ``device_id`` (>= 0): the model reads
        inputs in device memory on that GPU, so an input in a CUDA region there stays there (a
        ``DeviceArray``); otherwise it comes to the host.
        """
        region, start, byte_size = self._span(name, parameters, uses)
        count = 1
        for dim in shape:
            if dim < 0:
                raise InvalidArgument(f"input '{name}': negative dimension in shape {list(shape)}")
            count *= dim
        expected = count * ITEM_SIZES.get(datatype, 0)
        if datatype != "BYTES" and expected != byte_size:
            raise InvalidArgument(
                f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got "
                f"{byte_size} (input '{name}': {datatype} {list(shape)} needs {expected} bytes, "
                f"but {BYTE_SIZE} is {byte_size})"
            )
        if isinstance(region, CudaRegion):
            if device_id >= 0 and region.device_id == device_id and datatype not in ("BYTES", "BF16"):
                dtype = numpy_dtype(datatype)
                if (region.mapping.pointer + start) % dtype.alignment == 0:
                    # No copy: ORT reads the client's device memory (IO binding, ``backends/onnx.py``).
                    where = DeviceBytes(region.mapping.pointer + start, byte_size, device_id, region.mapping)
                    return DeviceArray(where, dtype, shape)
            # Device bytes come to the host once, as a tensor from the wire would.
            host = np.empty(byte_size, dtype=np.uint8)
            _cuda_copy(region.mapping, host.ctypes.data, region.mapping.pointer + start, byte_size, f"input '{name}'")
            source, start = host.data, 0
        else:
            source = memoryview(region.mapping)
        if datatype == "BYTES":
            from ._codec import deserialize_bytes_tensor

            return deserialize_bytes_tensor(source[start : start + byte_size], count).reshape(shape)
        # The view holds a buffer export of the mapping, which keeps it mapped while the request uses it.
        return np.frombuffer(source, numpy_dtype(datatype), count, start).reshape(shape)

    def output_view(
        self, name: str, parameters: dict, uses: list[Region] | None = None
    ) -> np.ndarray | DeviceBytes:
        """The writable bytes of a region an output goes to, checked against the region.

        Resolved before the request runs, so a bad region fails fast and a backend
        can write the output there directly (see :func:`write_output`).  The region
        is appended to ``uses`` as in :meth:`input_view`.
        """
        region, start, byte_size = self._span(name, parameters, uses)
        if isinstance(region, CudaRegion):
            mapping = region.mapping
            return DeviceBytes(mapping.pointer + start, byte_size, region.device_id, mapping)
        return np.frombuffer(memoryview(region.mapping), np.uint8, byte_size, start)


def write_output(
    name: str, array: np.ndarray | DeviceArray, datatype: str, destination: np.ndarray | DeviceBytes
) -> None:
    """Put an output into its region bytes ``destination`` (the one output copy).

    Nothing is copied when the backend already computed the output in place.
    """
    if isinstance(array, DeviceArray):
        if array.where is destination:
            return  # ORT wrote it into the CUDA region
        raise InternalError(f"output '{name}' is in device memory that is not its shared memory region")
    if datatype == "BYTES":
        from ._codec import serialize_bytes_tensor

        data = np.frombuffer(serialize_bytes_tensor(array), dtype=np.uint8)
    else:
        in_place = type(destination) is np.ndarray and array.ctypes.data == destination.ctypes.data
        if in_place and array.nbytes <= destination.nbytes:
            return  # written in place by the backend
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.nbytes > destination.nbytes:
        raise InvalidArgument(
            f"output '{name}' needs {data.nbytes} bytes but shared memory byte size is {destination.nbytes}"
        )
    if isinstance(destination, DeviceBytes):
        mapping = destination.owner
        assert isinstance(mapping, CudaMapping)
        _cuda_copy(mapping, destination.pointer, data.ctypes.data, data.nbytes, f"output '{name}'")
        return
    destination[: data.nbytes] = data


def _cuda_copy(mapping: CudaMapping, destination: int, source: int, nbytes: int, what: str) -> None:
    """A copy to or from a CUDA region; a CUDA failure names the tensor."""
    try:
        mapping.runtime.copy(destination, source, nbytes)
    except cuda.CudaError as exc:
        raise InvalidArgument(f"{what}: copying CUDA shared memory failed: {exc}") from None


def check_intact(uses: list[Region]) -> None:
    """After a request: refuse its answer when a region it read or wrote shrank meanwhile.

    A shrink racing with the request was caught by the SIGBUS guard, which put zero
    pages where the client's were, so whatever was computed is not the client's.
    """
    for region in uses:
        region.check_intact()


def uses_region(parameters: dict | None) -> bool:
    return parameters is not None and REGION in parameters

"""Tensors between the server and a Python worker process: shared memory for their bytes, not pickled copies.

Rules:
- An array of at least :data:`INLINE_LIMIT` bytes (numeric) is written once into
  shared memory by the side that sends it; the message carries only the
  segment's name, dtype and shape.  The receiver reads a numpy view on the
  mapping (no copy).
- Segments are reused: each has a one-byte busy flag in its first page; the
  sender sets it when it writes, and the receiver clears it when the last view
  on the data is gone (``weakref.finalize``), so a steady stream of tensors
  costs one copy each, not a new file and fresh pages each.  A sender keeps up
  to :data:`POOL_SIZE` segments (``/dev/shm/fastoip-pyw-<pid>-<n>``); past that
  (views kept by a model) a tensor goes into a one-shot file the receiver
  unlinks when it maps it.
- Smaller numeric arrays travel inside the message as their raw bytes (a
  ``bytearray``), dtype and shape: pickling a numpy array costs ~10 us to dump
  and ~5 us to load, its bytes ~1 us (measured, 16 x FP32).  The receiver gets
  a writable array on those bytes.  Both ends are the codec's C
  (``pack_inline`` / ``unpack_inline``, ~0.1 us each), which checks that
  shape, dtype and byte count agree.  BYTES (object) arrays are pickled.
- :data:`COPIED` counts the bytes each side copied into shared memory.
- A side that dies leaves its files behind; :func:`remove_files_of` removes a
  dead worker's files by its pid (and forgets their mappings); a side that exits
  removes its own segments.
- The busy flag is a plain byte store and load: ordered on x86-64 (total store
  order); other architectures would need a fence.
"""

from __future__ import annotations

import atexit
import errno
import glob
import itertools
import mmap
import os
import sys
import threading
import weakref
from typing import Any

import numpy as np

from .._codec import pack_inline, unpack_inline

#: Arrays smaller than this travel in the message itself.
INLINE_LIMIT = 64 * 1024
#: Segments a sender keeps for reuse.
POOL_SIZE = 32
#: Bytes before a segment's data (the busy flag is byte 0).
HEADER = 64
_SHM_DIR = "/dev/shm"
_counter = itertools.count()
_lock = threading.Lock()


class _Counter:
    def __init__(self) -> None:
        self.bytes_to_shm = 0
        self.arrays_to_shm = 0
        self.arrays_inline = 0
        self.segments_made = 0


COPIED = _Counter()


class _Segment:
    __slots__ = ("name", "region", "capacity")

    def __init__(self, name: str, region: mmap.mmap, capacity: int) -> None:
        self.name = name
        self.region = region
        self.capacity = capacity


#: This process's segments, for reuse.
_pool: list[_Segment] = []
#: Segments of other processes this one maps (by name).
_mapped: dict[str, mmap.mmap] = {}


#: python_backend's words when its shared memory cannot grow (Triton's QA matches them).
NO_ROOM = "Failed to increase the shared memory pool size"


def _reserve(fd: int, size: int) -> None:
    """Back a new segment with memory now: a full /dev/shm is an error here, in Triton's words, instead of a
    SIGBUS in whichever process first writes a page that has no memory behind it."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise OSError(exc.errno, f"{NO_ROOM}: shared memory has no room for {size} bytes") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: as before
            raise


def _new_file(size: int) -> tuple[str, mmap.mmap]:
    name = f"fastoip-pyw-{os.getpid()}-{next(_counter)}"
    path = os.path.join(_SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        _reserve(fd, size)
        region = mmap.mmap(fd, size)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    COPIED.segments_made += 1
    return name, region


def _take_segment(nbytes: int) -> tuple[str, mmap.mmap, bool]:
    """A free pooled segment that fits (marked busy), else a new one: ``(name, region, pooled)``."""
    with _lock:
        for segment in _pool:
            if segment.capacity >= nbytes and segment.region[0] == 0:
                segment.region[0] = 1
                return segment.name, segment.region, True
        if len(_pool) < POOL_SIZE:
            capacity = 1 << max(16, (nbytes - 1).bit_length())
            name, region = _new_file(HEADER + capacity)
            region[0] = 1
            _pool.append(_Segment(name, region, capacity))
            return name, region, True
    name, region = _new_file(HEADER + nbytes)
    return name, region, False


def pack(array: np.ndarray) -> tuple:
    """What goes into a message for ``array``."""
    # A small array's bytes go into the message (one copy, in C order whatever its strides; no numpy pickling);
    # every numeric one when there is no shared memory.
    packed = pack_inline(array, INLINE_LIMIT)
    if packed is None and not array.dtype.hasobject and not os.path.isdir(_SHM_DIR):
        packed = pack_inline(array, sys.maxsize)
    if packed is not None:
        COPIED.arrays_inline += 1
        return packed
    dtype = array.dtype
    if dtype.hasobject:
        COPIED.arrays_inline += 1
        return ("i", array)
    segment, region, pooled = _take_segment(array.nbytes)
    # The one copy of these bytes on their way across (the receiver maps them).
    np.frombuffer(region, dtype=dtype, count=array.size, offset=HEADER).reshape(array.shape)[...] = array
    if not pooled:
        region.close()
    COPIED.bytes_to_shm += array.nbytes
    COPIED.arrays_to_shm += 1
    return ("p" if pooled else "s", segment, dtype.str, array.shape)


def _release(region: mmap.mmap) -> None:
    try:
        region[0] = 0  # the sender may reuse the segment
    except ValueError:  # closed meanwhile (its process died)
        pass


def unpack(packed: tuple) -> np.ndarray:
    """The array a message carries (a read-only view on shared memory for large ones)."""
    kind = packed[0]
    if kind == "b":
        return unpack_inline(packed)
    if kind == "i":
        return packed[1]
    _, name, dtype, shape = packed
    path = os.path.join(_SHM_DIR, name)
    region = _mapped.get(name) if kind == "p" else None
    if region is None:
        fd = os.open(path, os.O_RDWR)
        try:
            region = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
            if kind == "s":
                os.unlink(path)
        if kind == "p":
            with _lock:
                _mapped[name] = region
    count = int(np.prod(shape)) if shape else 1
    flat = np.frombuffer(region, dtype=np.dtype(dtype), count=count, offset=HEADER)
    flat.flags.writeable = False
    if kind == "p":
        weakref.finalize(flat, _release, region)
    return flat.reshape(shape)


def discard(packed: tuple) -> None:
    """Give back the segment of a packed array that will never be unpacked."""
    if packed[0] == "s":
        try:
            os.unlink(os.path.join(_SHM_DIR, packed[1]))
        except FileNotFoundError:
            pass
    elif packed[0] == "p":
        with _lock:
            for segment in _pool:
                if segment.name == packed[1]:
                    segment.region[0] = 0


def pack_tensors(tensors: list) -> list:
    return [(name, datatype, pack(np.asarray(array))) for name, datatype, array in tensors]


def unpack_tensors(tensors: list) -> list:
    return [(name, datatype, unpack(packed)) for name, datatype, packed in tensors]


def remove_files_of(pid: int) -> None:
    """Remove what a dead process left in shared memory, and forget its segments' mappings."""
    prefix = f"fastoip-pyw-{pid}-"
    with _lock:
        for name in [n for n in _mapped if n.startswith(prefix)]:
            del _mapped[name]  # closed when the last view on it is gone
    for path in glob.glob(os.path.join(_SHM_DIR, prefix + "*")):
        try:
            os.unlink(path)
        except OSError:
            pass


@atexit.register
def _remove_own_segments() -> None:
    remove_files_of(os.getpid())


def pack_request(data: Any) -> Any:
    request_id, correlation_id, flags, parameters, inputs, requested, trace = data
    return (request_id, correlation_id, flags, parameters, pack_tensors(inputs), requested, trace)


def unpack_request(data: Any) -> Any:
    request_id, correlation_id, flags, parameters, inputs, requested, trace = data
    return (request_id, correlation_id, flags, parameters, unpack_tensors(inputs), requested, trace)


def pack_response(data: Any) -> Any:
    if data is None:
        return None
    outputs, error, parameters = data
    return (pack_tensors(outputs), error, parameters)


def unpack_response(data: Any) -> Any:
    if data is None:
        return None
    outputs, error, parameters = data
    return (unpack_tensors(outputs), error, parameters)

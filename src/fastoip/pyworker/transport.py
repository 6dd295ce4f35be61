"""Tensors between the server and a Python worker process: shared memory for their bytes, not pickled copies.

Rules:
- An array of at least :data:`INLINE_LIMIT` bytes (numeric) is written once into a
  fresh POSIX shared-memory file (``/dev/shm/fastoip-pyw-<pid>-<n>``) by the side
  that sends it; the message carries only its name, dtype and shape.  The
  receiver maps the file, unlinks it at once and reads a numpy view on the
  mapping (no copy; the mapping lives as long as the array does).
- Smaller arrays and BYTES (object) arrays travel inside the pickled message
  (their size is small against the message's own cost).
- :data:`COPIED` counts the bytes each side copied into shared memory (tests
  and benchmarks read it to show what crossed and how).
- A side that dies leaves its files behind; :func:`remove_files_of` removes a
  dead worker's files by its pid.
"""

from __future__ import annotations

import glob
import itertools
import mmap
import os
from typing import Any

import numpy as np

#: Arrays smaller than this travel in the message itself.
INLINE_LIMIT = 64 * 1024
_SHM_DIR = "/dev/shm"
_counter = itertools.count()


class _Counter:
    def __init__(self) -> None:
        self.bytes_to_shm = 0
        self.arrays_to_shm = 0
        self.arrays_inline = 0


COPIED = _Counter()


def pack(array: np.ndarray) -> tuple:
    """What goes into a message for ``array``."""
    if array.dtype == object or array.nbytes < INLINE_LIMIT or not os.path.isdir(_SHM_DIR):
        COPIED.arrays_inline += 1
        return ("i", array)
    name = f"fastoip-pyw-{os.getpid()}-{next(_counter)}"
    path = os.path.join(_SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, array.nbytes)
        with mmap.mmap(fd, array.nbytes) as region:
            # The one copy of these bytes on their way across (the receiver maps them).
            np.frombuffer(region, dtype=array.dtype, count=array.size).reshape(array.shape)[...] = array
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    COPIED.bytes_to_shm += array.nbytes
    COPIED.arrays_to_shm += 1
    return ("s", name, array.dtype.str, array.shape)


def unpack(packed: tuple) -> np.ndarray:
    """The array a message carries (a read-only view on shared memory for large ones)."""
    if packed[0] == "i":
        return packed[1]
    _, name, dtype, shape = packed
    path = os.path.join(_SHM_DIR, name)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        region = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
        os.unlink(path)
    return np.frombuffer(region, dtype=np.dtype(dtype)).reshape(shape)


def discard(packed: tuple) -> None:
    """Remove the file of a packed array that will never be unpacked."""
    if packed[0] == "s":
        try:
            os.unlink(os.path.join(_SHM_DIR, packed[1]))
        except FileNotFoundError:
            pass


def pack_tensors(tensors: list) -> list:
    return [(name, datatype, pack(np.asarray(array))) for name, datatype, array in tensors]


def unpack_tensors(tensors: list) -> list:
    return [(name, datatype, unpack(packed)) for name, datatype, packed in tensors]


def remove_files_of(pid: int) -> None:
    """Remove what a dead process left in shared memory."""
    for path in glob.glob(os.path.join(_SHM_DIR, f"fastoip-pyw-{pid}-*")):
        try:
            os.unlink(path)
        except OSError:
            pass


def pack_request(data: Any) -> Any:
    request_id, correlation_id, flags, parameters, inputs, requested = data
    return (request_id, correlation_id, flags, parameters, pack_tensors(inputs), requested)


def unpack_request(data: Any) -> Any:
    request_id, correlation_id, flags, parameters, inputs, requested = data
    return (request_id, correlation_id, flags, parameters, unpack_tensors(inputs), requested)


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

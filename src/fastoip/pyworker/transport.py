"""Tensors between the server and a Python worker process: shared memory for their bytes, not pickled copies.

Rules:
- An array of at least :data:`INLINE_LIMIT` bytes (numeric) is written once into
  a shared-memory segment by the side that sends it; the message carries only
  the segment's index, dtype and shape, ``("m", index, dtype, shape)``.  The
  receiver reads a numpy view on its mapping (no copy).  The segments are
  :mod:`.segments`': made by the server (a memfd: no name anyone could open or
  register), handed to the worker as descriptors, named by index only, reused
  (a busy flag the receiver clears when its last view is gone), bounded per
  worker (``--python-shm-pool``) and in all (``--python-shm-pool-total``), and
  retired when idle.  An index the sender may not use is refused (the server
  ends a worker that sends one).
- Without a peer's segments (``segments`` None: nothing to hand over through,
  or no ``memfd_create``) every numeric array travels inside the message.
- Smaller numeric arrays travel inside the message as their raw bytes (a
  ``bytearray``), dtype and shape: pickling a numpy array costs ~10 us to dump
  and ~5 us to load, its bytes ~1 us (measured, 16 x FP32).  The receiver gets
  a writable array on those bytes.  Both ends are the codec's C
  (``pack_inline`` / ``unpack_inline``, ~0.1 us each), which checks that
  shape, dtype and byte count agree.  BYTES (object) arrays travel in the
  message in Triton's framing (each element a 4-byte little-endian length and
  its bytes; str elements as UTF-8), ``("t", bytes, shape)``: never pickled.
- What a message carries is checked when it is unpacked (the other process
  wrote it): the kind, the dtype (numeric only), the shape against the bytes
  and against the segment's capacity.
- :data:`COPIED` counts the bytes each side copied into shared memory.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._codec import deserialize_bytes_tensor, pack_inline, serialize_bytes_tensor, unpack_inline
from ..datatypes import to_bytes_elements
from ..errors import InferenceError
from .channel import ProtocolError, RequestData, request_of
from .segments import HEADER, NO_ROOM, SegmentRefused, Segments, ServerSegments, SharedMemoryFull, released_with

__all__ = ["HEADER", "NO_ROOM", "SegmentRefused", "SharedMemoryFull"]

#: Arrays smaller than this travel in the message itself.
INLINE_LIMIT = 64 * 1024


class _Counter:
    def __init__(self) -> None:
        self.bytes_to_shm = 0
        self.arrays_to_shm = 0
        self.arrays_inline = 0


COPIED = _Counter()


def pack(array: np.ndarray, segments: Segments | None) -> tuple:
    """What goes into a message for ``array`` (:class:`SharedMemoryFull` when there is no room for it)."""
    # A small array's bytes go into the message (one copy, in C order whatever its strides; no numpy pickling);
    # every numeric one when there are no segments.
    packed = pack_inline(array, INLINE_LIMIT)
    if packed is None and segments is None and not array.dtype.hasobject:
        packed = pack_inline(array, sys.maxsize)
    if packed is not None:
        COPIED.arrays_inline += 1
        return packed
    dtype = array.dtype
    if dtype.hasobject:
        COPIED.arrays_inline += 1
        try:
            framed = serialize_bytes_tensor(array)
        except (TypeError, ValueError):  # elements that are neither bytes nor str: as Triton, their str()
            framed = serialize_bytes_tensor(to_bytes_elements(array))
        return ("t", framed, array.shape)
    assert segments is not None
    segment = segments.take(array.nbytes)
    # The one copy of these bytes on their way across (the receiver maps them); the pages are reserved.
    np.frombuffer(segment.view, dtype=dtype, count=array.size, offset=HEADER).reshape(array.shape)[...] = array
    COPIED.bytes_to_shm += array.nbytes
    COPIED.arrays_to_shm += 1
    return ("m", segment.index, dtype.str, array.shape)


def _shape(value: Any) -> tuple:
    if type(value) is not list and type(value) is not tuple:
        raise ProtocolError(f"a tensor's shape is not a list of sizes: {value!r}")
    for n in value:
        if type(n) is not int or n < 0:
            raise ProtocolError(f"a tensor's shape is not a list of sizes: {value!r}")
    return tuple(value)


def unpack(packed: Any, segments: Segments | None) -> np.ndarray:
    """The array a message carries (a read-only view on shared memory for large ones); ProtocolError (a
    ValueError) when it is not one of :func:`pack`'s forms, SegmentRefused for a segment the sender may not
    name (``segments``: the sender's, as this side sees them)."""
    if (type(packed) is not list and type(packed) is not tuple) or not packed:
        raise ProtocolError("a packed tensor is a tagged list")
    kind = packed[0]
    if kind == "b" and len(packed) == 4:
        data = packed[1]
        if type(data) is bytes:  # (msgpack gives bytes: the array is writable on a bytearray, the model may write)
            data = bytearray(data)
        try:  # (the codec checks the parts: a bytearray, a dtype name, sizes that agree with the bytes)
            return unpack_inline(("b", data, packed[2], tuple(packed[3])))
        except (TypeError, ValueError) as bad:
            raise ProtocolError(f"not a packed tensor: {bad}") from None
    if kind == "t" and len(packed) == 3 and isinstance(packed[1], (bytes, bytearray)):
        shape = _shape(packed[2])
        try:
            elements = deserialize_bytes_tensor(packed[1], int(np.prod(shape)) if shape else 1)
        except InferenceError as codec_error:  # (the codec's CodecError: a length that lies)
            raise ProtocolError(f"a BYTES tensor's framing is broken: {codec_error}") from None
        return elements.reshape(shape)
    if kind != "m" or len(packed) != 4 or type(packed[2]) is not str or segments is None:
        raise ProtocolError(f"not a packed tensor (kind {str(kind)[:20]!r})")
    try:
        dtype = np.dtype(packed[2])
    except TypeError:
        raise ProtocolError(f"not a dtype: {packed[2][:20]!r}") from None
    if dtype.hasobject:
        raise ProtocolError(f"a tensor in shared memory cannot hold objects (dtype {packed[2]!r})")
    shape = _shape(packed[3])  # (one binding of shape per function: mypyc types it once)
    count = 1
    for n in shape:
        count *= n
    segment = segments.open(packed[1], count * dtype.itemsize)  # (checked before any view is made)
    flat = np.frombuffer(segment.view, dtype=dtype, count=count, offset=HEADER)
    flat.flags.writeable = False
    released_with(flat, segment)
    return flat.reshape(shape)


def discard(packed: tuple, segments: Segments | None) -> None:
    """Give back the segment of a packed array (taken here) that will never be unpacked."""
    if packed[0] == "m" and segments is not None:
        segments.discard(packed[1])


def pack_tensors(tensors: list, segments: Segments | None) -> list:
    """Every tensor packed, or none: what was packed before a failure (no room) is given back."""
    packed: list = []
    try:
        for name, datatype, array in tensors:
            packed.append((name, datatype, pack(np.asarray(array), segments)))
    except BaseException:
        for _, _, tensor in packed:
            discard(tensor, segments)
        raise
    return packed


def unpack_tensors(tensors: Any, segments: Segments | None) -> list:
    if type(tensors) is not list and type(tensors) is not tuple:
        raise ProtocolError("tensors are a list of (name, datatype, packed tensor)")
    out = []
    for item in tensors:
        if len(item) != 3 or type(item[0]) is not str or type(item[1]) is not str:
            raise ProtocolError("a tensor is (name, datatype, packed tensor)")
        out.append((item[0], item[1], unpack(item[2], segments)))
    return out


def pack_request(data: Any, segments: Segments | None) -> RequestData:
    request_id, correlation_id, flags, parameters, inputs, requested, trace = data
    return RequestData(request_id, correlation_id, flags, parameters, pack_tensors(inputs, segments), requested,
                       trace)


def pack_requests(requests: list, segments: Segments | None) -> list:
    """Several requests packed, or none (as :func:`pack_tensors`)."""
    packed: list = []
    try:
        for data in requests:
            packed.append(pack_request(data, segments))
    except BaseException:
        for request in packed:
            discard_request(request, segments)
        raise
    return packed


def discard_request(request: Any, segments: Segments | None) -> None:
    """Give back the segments of a packed request that will never be unpacked."""
    for _, _, tensor in request[4]:
        discard(tensor, segments)


def move_requests(requests: list, source: ServerSegments, target: Segments | None) -> list:
    """Requests packed for one worker, packed for another (a dead worker's replacement): what is in the first
    one's segments is copied into the second's, the rest stays as it is; all or none (as :func:`pack_requests`)."""
    moved: list = []
    try:
        for request in requests:
            inputs = []
            for name, datatype, tensor in request[4]:
                if tensor[0] == "m":
                    segment = source.written(tensor[1])
                    if segment is None:
                        raise SharedMemoryFull(f"{NO_ROOM}: the input '{name}' is no longer in shared memory")
                    dtype = np.dtype(tensor[2])
                    count = 1
                    for n in tensor[3]:
                        count *= n
                    array = np.frombuffer(segment.view, dtype=dtype, count=count, offset=HEADER)
                    tensor = pack(array.reshape(tensor[3]), target)
                inputs.append((name, datatype, tensor))
            moved.append(RequestData(request[0], request[1], request[2], request[3], inputs, request[5], request[6]))
    except BaseException:
        for request in moved:
            discard_request(request, target)
        raise
    for request in requests:
        discard_request(request, source)
    return moved


def unpack_request(data: Any, segments: Segments | None) -> RequestData:
    """A request the other side packed, its tensors unpacked (ProtocolError when it is not one)."""
    request = request_of(data)
    # (built whole: NamedTuple._replace costs a dict and a _make, ~1 us on the per-call path)
    return RequestData(request[0], request[1], request[2], request[3], unpack_tensors(request[4], segments),
                       request[5], request[6])


def pack_response(data: Any, segments: Segments | None) -> Any:
    if data is None:
        return None
    outputs, error, parameters = data
    return (pack_tensors(outputs, segments), error, parameters)


def unpack_response(data: Any, segments: Segments | None) -> Any:
    """``(outputs, error (code, message) or None, parameters)`` the other side packed (ProtocolError when it is
    not one)."""
    if data is None:
        return None
    try:
        outputs, error, parameters = data
    except (TypeError, ValueError):
        raise ProtocolError("a response is (outputs, error, parameters)") from None
    if error is not None:
        if (type(error) is not list and type(error) is not tuple) or len(error) != 2 or type(error[0]) is not int or (
            type(error[1]) is not str
        ):
            raise ProtocolError("a response's error is (code, message)")
        error = (error[0], error[1])
    if type(parameters) is not dict:
        raise ProtocolError("a response's parameters are a dict")
    return (unpack_tensors(outputs, segments), error, parameters)

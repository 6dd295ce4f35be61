# cython: language_level=3
"""Native codec for KServe V2 / Triton gRPC messages (protobuf package ``inference``).

Reads ModelInferRequest / ModelInferResponse wire bytes straight into the
objects of :mod:`fastoip.types` and writes them back, with no protobuf objects
in between.  Public functions: decode_infer_request, decode_infer_response,
encode_infer_request, encode_infer_response, encode_stream_response,
serialize_bytes_tensor, deserialize_bytes_tensor (see _codec.pyi).  This file
holds them; the code is in the include files ``wire/codec/*.pxi``, one concern
each (listed at the ``include`` lines); the C declarations are in ``_codec.pxd``
and the C helpers in ``_codec.h`` (asyncpg's pgproto and httptools keep theirs
the same way).

Invariants
----------
Reading (a ``Reader`` cursor over ``const uchar*`` with pos/end):
* Every varint is at most 10 bytes and fits in 64 bits (a 10th byte above 1 is
  refused; protobuf silently truncates it).  Tags are at most 5 bytes and fit
  in 32 bits.  Field number 0, wire types 6/7 and groups (wire types 3/4, which
  protobuf would skip as unknown fields) raise CodecError.  Every length is
  checked against the end of the enclosing message before anything is read.
* Strings are valid UTF-8 (model/tensor/parameter names, ids, string_param),
  as protobuf checks on parse.
* Protobuf semantics: unknown fields and known fields with an unexpected wire
  type are skipped; the last occurrence of a scalar field wins; repeated
  scalars may be packed or not; a sub-message that occurs twice is merged
  (``contents``: the repeated fields of all occurrences are concatenated; a
  parameter value: the last set choice wins); a later map entry with the same
  key replaces the earlier one; a map entry holding any other field (unknown,
  or key/value with another wire type) leaves the map unchanged, as upb keeps
  such an entry among the unknown fields.
* An InferParameter with no choice set is not put in the parameters dict (it
  removes an earlier value of the same key, as protobuf's map would).
* Rules protobuf does not check, all CodecError naming the tensor: known
  datatype; no negative dimension and at most numpy's 64 dimensions; element
  count computed with an overflow check before each multiply (non-zero dims
  times the item size must fit in int64, as numpy needs); fixed-size raw data exactly count * itemsize
  bytes; BYTES data at least 4 bytes per declared element before anything is
  allocated, each length checked against what remains and all bytes used;
  typed ``contents`` counted (and the field checked against the datatype)
  before the array is allocated; one raw_input_contents entry per input that
  has neither a ``shared_memory_region`` parameter nor ``contents``, and no
  ``contents`` at all when raw_input_contents is used.
* Raw tensor data is never copied on decode: an input/output read from
  ``raw_*_contents`` is a read-only numpy view on the received buffer whose
  base is that buffer (for non-``bytes`` buffers a read-only memoryview that
  holds a buffer export, so a bytearray cannot be resized under the view).
  Typed ``contents`` and BYTES tensors are decoded into new arrays.

Writing (``Plan``: size everything first, then write):
* The exact size is computed first, then the message is written into ONE
  ``bytes`` object, one memcpy per tensor.  Fields are written in field-number
  order and empty strings/maps are skipped, as protobuf's serializer does, so
  the bytes equal ``SerializeToString()`` of the same content (same map order).
* Every Python object whose memory the write reads is kept alive by the plan
  (a strong reference or a held buffer export) until it is done, so
  Python code that runs while planning (``__index__``, ``str()``, other
  threads) cannot free it.
* Tensor data must have the datatype's numpy dtype (a byte-swapped one is
  converted, BF16 may also be int16 bits, a non-contiguous array is made
  contiguous); anything else is a CodecError rather than a silent cast.

Also:
* Model, tensor and parameter names go through a small cache of str objects
  (they repeat from request to request); request ids and values do not.
* When the classes of fastoip.types have the exact __slots__ checked at import,
  decoded objects are allocated and their slots filled directly (no Python
  __init__ call); otherwise the classes are called.
* Copies and typed-contents fills of 256 KiB or more run without the GIL.
* The host is little-endian (checked at import): tensor bytes on the wire are
  little-endian and are viewed or copied as they are.
"""

import sys
from operator import index as _operator_index

import numpy as np

cimport numpy as cnp

cnp.import_array()

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.memoryview cimport PyMemoryView_FromObject
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_New, PyTuple_SET_ITEM
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from .datatypes import NUMPY_DTYPES
from .errors import CodecError
from . import types as _types

# The classes of fastoip.types, as C globals (no module-dict lookup per use).
cdef type InferInput = _types.InferInput
cdef type InferOutput = _types.InferOutput
cdef type InferRequest = _types.InferRequest
cdef type InferResponse = _types.InferResponse
cdef type RequestedOutput = _types.RequestedOutput
cdef type UInt64 = _types.UInt64

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("fastoip._codec needs a little-endian host")

ctypedef unsigned char uchar

cdef str _INPUT = "input"
cdef str _OUTPUT = "output"

# The codec, one concern per include file (asyncpg's pgproto manner), in dependency order.  Cython
# compiles them as one module: cdef functions stay C calls that the compiler can inline across files.
include "wire/codec/fields.pxi"       # wire types and the field numbers of every message read or written
include "wire/codec/datatypes.pxi"    # the V2 datatype table
include "wire/codec/vec.pxi"          # a growable vector on the C stack
include "wire/codec/primitives.pxi"   # varints, tags, lengths: the read cursor and the writers
include "wire/codec/strings.pxi"      # UTF-8 strings both ways, the name cache
include "wire/codec/objects.pxi"      # building fastoip.types objects (slots filled in place)
include "wire/codec/params.pxi"       # map<string, InferParameter> both ways
include "wire/codec/tensors.pxi"      # tensor headers: name, datatype, shape, parameters
include "wire/codec/bytes.pxi"        # BYTES tensors: element limit, length-prefixed framing
include "wire/codec/contents.pxi"     # tensor data on decode: raw views, typed contents
include "wire/codec/decode.pxi"       # ModelInferRequest / ModelInferResponse -> objects
include "wire/codec/encode.pxi"       # objects -> ModelInferRequest / ModelInferResponse / stream response
include "wire/codec/inline.pxi"       # small tensors inside a Python worker's messages


# --------------------------------------------------------------------------- #
# Public API (see _codec.pyi)                                                  #
# --------------------------------------------------------------------------- #

def decode_infer_request(data):
    """Parse ModelInferRequest wire bytes into an InferRequest (raw inputs are zero-copy views)."""
    return _decode(data, False)


def decode_infer_response(data):
    """Parse ModelInferResponse wire bytes into an InferResponse (raw outputs are zero-copy views)."""
    return _decode(data, True)


def deserialize_bytes_tensor(buffer, count):
    """Decode ``count`` length-prefixed BYTES elements that fill ``buffer`` exactly."""
    cdef Py_buffer view
    cdef int64_t n
    try:
        n = count
    except OverflowError:
        raise CodecError(f"BYTES tensor: element count {count} is out of range") from None
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        return _bytes_array(<const uchar*>view.buf, view.len, n, "BYTES tensor")
    finally:
        PyBuffer_Release(&view)


def encode_infer_response(response):
    """Serialize an InferResponse as ModelInferResponse wire bytes (all data in raw_output_contents)."""
    return _encode(response, False, None)


def encode_infer_response_parts(response, Py_ssize_t min_ref=65536):
    """``encode_infer_response`` as a list of parts (bytes-like) whose concatenation is the message.

    Every fixed-size output of at least ``min_ref`` bytes is a byte view of its array (not copied);
    the caller keeps the parts until they are sent.
    """
    if min_ref < 0:
        raise ValueError("min_ref must be >= 0")
    return _encode_parts(response, min_ref)


def gather_rows(list parts, cnp.ndarray out):
    """``np.concatenate(parts, axis=0, out=out)`` by one ``memcpy`` a part, where every part is a C-contiguous
    array of ``out``'s dtype and row shape and together they fill ``out`` (a batch of small requests: ~2 us
    a batch less than numpy's checks per part).  False, with ``out`` not written, when one is not so."""
    cdef cnp.ndarray part
    cdef Py_ssize_t total = 0, k
    cdef int ndim = cnp.PyArray_NDIM(out)
    cdef char *destination
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out) or out.dtype.hasobject:
        return False
    for obj in parts:
        if not isinstance(obj, cnp.ndarray):
            return False
        part = <cnp.ndarray>obj
        if cnp.PyArray_NDIM(part) != ndim or not cnp.PyArray_IS_C_CONTIGUOUS(part):
            return False
        if not cnp.PyArray_EquivTypes(part.dtype, out.dtype):
            return False
        for k in range(1, ndim):
            if cnp.PyArray_DIM(part, k) != cnp.PyArray_DIM(out, k):
                return False
        total += cnp.PyArray_NBYTES(part)
    if ndim == 0 or total != cnp.PyArray_NBYTES(out):
        return False
    destination = <char *>cnp.PyArray_DATA(out)
    for obj in parts:
        part = <cnp.ndarray>obj
        memcpy(destination, cnp.PyArray_DATA(part), cnp.PyArray_NBYTES(part))
        destination += cnp.PyArray_NBYTES(part)
    return True


def split_rows(array, list counts):
    """Views of ``array``'s consecutive row ranges, ``counts[i]`` rows each: ``array[offset:offset + count]``
    without numpy's indexing machinery (a batch's outputs split per request: ~0.1 us a view less).  None
    when ``array`` is not a C-contiguous ``numpy.ndarray`` (exactly) of one dimension or more: slice it
    then.  ValueError when a count is negative or the counts need more rows than ``array`` has."""
    cdef cnp.ndarray source
    cdef cnp.npy_intp dims[64]
    cdef int ndim, k
    cdef Py_ssize_t rows, offset = 0, count, row_bytes
    cdef char *data
    cdef int flags
    cdef list views = []
    if type(array) is not cnp.ndarray:
        return None
    source = <cnp.ndarray>array
    ndim = cnp.PyArray_NDIM(source)
    if ndim == 0 or ndim > 64 or not cnp.PyArray_IS_C_CONTIGUOUS(source):
        return None
    rows = cnp.PyArray_DIM(source, 0)
    row_bytes = cnp.PyArray_ITEMSIZE(source)
    for k in range(ndim):
        dims[k] = cnp.PyArray_DIM(source, k)
        if k:
            row_bytes *= dims[k]
    flags = cnp.NPY_ARRAY_WRITEABLE if cnp.PyArray_ISWRITEABLE(source) else 0
    data = <char *>cnp.PyArray_DATA(source)
    for obj in counts:
        count = obj
        if count < 0 or count > rows - offset:
            raise ValueError(f"{count} rows from row {offset} of an array of {rows} rows")
        dims[0] = count
        views.append(fastoip_array_view(source, source.dtype, ndim, dims, data + offset * row_bytes, flags))
        offset += count
    return views


def pack_inline(array, Py_ssize_t limit):
    """``("b", bytearray of array's bytes in C order, dtype.str, shape)`` for a numeric ndarray of fewer than
    ``limit`` bytes; None for anything else (object arrays, larger ones, not an ndarray)."""
    return _pack_inline(array, limit)


def unpack_inline(tuple packed):
    """The writable array ``pack_inline`` packed (ValueError when the parts do not agree)."""
    return _unpack_inline(packed)


def new_output(name, datatype, data):
    """``InferOutput(name, datatype, data.shape, data)`` (no parameters), built as the decoder builds it."""
    shape = data.shape
    if type(shape) is not tuple:
        return InferOutput(name, datatype, shape, data)
    obj = _make_tensor(InferOutput, &_L_OUTPUT, name, datatype, shape, {})
    _set_data(obj, InferOutput, &_L_OUTPUT, data)
    return obj


def new_response(model_name, model_version, request_id, list outputs):
    """``InferResponse(model_name, model_version, request_id, None, outputs)``, built as the decoder builds it."""
    return _make_message(InferResponse, &_L_RESPONSE, model_name, model_version, request_id, {}, outputs, None)


def request_without_data(request):
    """A copy of ``request`` whose inputs keep name, datatype, shape and parameters but no data; the
    request itself is not changed.  (The Core lets go of a request's input arrays when its execution
    ends; built as the decoder builds these objects, slots filled in place: ~0.1 us, not ~1 us.)"""
    cdef list inputs = []
    for tensor in _attr(request, InferRequest, &_L_REQUEST, 4, "inputs"):
        name = _attr(tensor, InferInput, &_L_INPUT, 0, "name")
        datatype = _attr(tensor, InferInput, &_L_INPUT, 1, "datatype")
        shape = _attr(tensor, InferInput, &_L_INPUT, 2, "shape")
        params = _attr(tensor, InferInput, &_L_INPUT, 4, "parameters")
        if type(shape) is tuple and type(params) is dict:
            inputs.append(_make_tensor(InferInput, &_L_INPUT, name, datatype, shape, params))
        else:
            inputs.append(InferInput(name, datatype, shape, None, params))
    params = _attr(request, InferRequest, &_L_REQUEST, 3, "parameters")
    outputs = _attr(request, InferRequest, &_L_REQUEST, 5, "outputs")
    model_name = _attr(request, InferRequest, &_L_REQUEST, 0, "model_name")
    model_version = _attr(request, InferRequest, &_L_REQUEST, 1, "model_version")
    request_id = _attr(request, InferRequest, &_L_REQUEST, 2, "id")
    if type(params) is dict and type(outputs) is list:
        return _make_message(InferRequest, &_L_REQUEST, model_name, model_version, request_id, params, inputs,
                             outputs)
    return InferRequest(model_name, model_version, request_id, params, inputs, outputs)


def encode_infer_request(request):
    """Serialize an InferRequest as ModelInferRequest wire bytes (data in raw_input_contents)."""
    return _encode(request, True, None)


def encode_stream_response(response=None, error_message=""):
    """Serialize a ModelStreamInferResponse: error_message=1 and/or infer_response=2."""
    if not PyUnicode_Check(error_message):
        raise CodecError(f"error_message must be a str, got {type(error_message).__name__}")
    return _encode(response, False, error_message)


def serialize_bytes_tensor(array):
    """The BYTES framing of an array: per element a uint32 LE length then its bytes."""
    items = _bytes_items(array)
    cdef Py_ssize_t size = _bytes_items_size(items, "BYTES tensor")
    out = PyBytes_FromStringAndSize(NULL, size)
    _write_bytes_items(PyBytes_AS_STRING(out), items)
    return out


def set_max_bytes_elements(limit):
    """Set the most BYTES elements a decoded tensor may have (the server's ``--max-bytes-elements``)."""
    global _max_bytes_elements
    if limit < 1:
        raise ValueError("the BYTES element limit must be at least 1")
    _max_bytes_elements = limit


def max_bytes_elements():
    return _max_bytes_elements


def set_max_bytes_memory(limit):
    """Set the memory one BYTES tensor's decoded elements may take (the server's ``--max-bytes-memory``)."""
    global _max_bytes_memory
    if limit < 1:
        raise ValueError("the BYTES memory limit must be at least 1 byte")
    _max_bytes_memory = limit


def max_bytes_memory():
    return _max_bytes_memory

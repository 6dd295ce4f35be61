# cython: language_level=3
"""Native codec for KServe V2 / Triton gRPC messages (protobuf package ``inference``).

Reads ModelInferRequest / ModelInferResponse wire bytes straight into the
objects of :mod:`fastoip.types` and writes them back, with no protobuf objects
in between.  Public functions: decode_infer_request, decode_infer_response,
encode_infer_request, encode_infer_response, encode_stream_response,
serialize_bytes_tensor, deserialize_bytes_tensor (see _codec.pyi).

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
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_New, PyTuple_SET_ITEM
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

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    PyObject* _PyUnicode_DecodeUTF8 "PyUnicode_DecodeUTF8" (
        const char* s, Py_ssize_t size, const char* errors)
    const char* _PyUnicode_AsUTF8AndSize "PyUnicode_AsUTF8AndSize" (object s, Py_ssize_t* size)
    int PyErr_ExceptionMatches(object exc)
    void PyErr_Clear()
    void* PyMem_Calloc(size_t nelem, size_t elsize)
    bint PyUnicode_Check(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    bint PyDict_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object o) except? <unsigned long long>-1
    double PyFloat_AsDouble(object o) except? -1.0

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("fastoip._codec needs a little-endian host")

ctypedef unsigned char uchar

# --------------------------------------------------------------------------- #
# Datatype table                                                               #
# --------------------------------------------------------------------------- #

cdef enum:
    DT_BOOL = 0
    DT_UINT8 = 1
    DT_UINT16 = 2
    DT_UINT32 = 3
    DT_UINT64 = 4
    DT_INT8 = 5
    DT_INT16 = 6
    DT_INT32 = 7
    DT_INT64 = 8
    DT_FP16 = 9
    DT_FP32 = 10
    DT_FP64 = 11
    DT_BF16 = 12
    DT_BYTES = 13
    N_DT = 14

# InferTensorContents field numbers.
cdef enum:
    F_BOOL = 1
    F_INT = 2
    F_INT64 = 3
    F_UINT = 4
    F_UINT64 = 5
    F_FP32 = 6
    F_FP64 = 7
    F_BYTES = 8

cdef const char* _DT_C[N_DT]
cdef Py_ssize_t _DT_LEN[N_DT]
cdef int _ITEMSIZE[N_DT]
cdef int _CONTENTS_FIELD[N_DT]   # 0: no typed field (FP16, BF16)

cdef tuple _DT_NAMES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
             "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES")
cdef tuple _DT_NAMES_B = tuple([s.encode("ascii") for s in _DT_NAMES])
cdef dict _DT_CODE = {name: i for i, name in enumerate(_DT_NAMES)}
cdef tuple _DT_NUMPY = tuple([NUMPY_DTYPES[name] for name in _DT_NAMES])
cdef tuple _FIELD_NAMES = ("", "bool_contents", "int_contents", "int64_contents", "uint_contents",
                "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents")

cdef int _i
for _i in range(N_DT):
    _DT_C[_i] = _DT_NAMES_B[_i]
    _DT_LEN[_i] = len(_DT_NAMES_B[_i])
    _ITEMSIZE[_i] = 0 if _i == DT_BYTES else _DT_NUMPY[_i].itemsize
for _i, _f in enumerate((F_BOOL, F_UINT, F_UINT, F_UINT, F_UINT64, F_INT, F_INT, F_INT,
                         F_INT64, 0, F_FP32, F_FP64, 0, F_BYTES)):
    _CONTENTS_FIELD[_i] = _f

cdef Py_ssize_t _MAX_DIMS = 64   # numpy 2; numpy 1 allows 32
try:
    np.empty((1,) * 64, dtype=np.uint8)
except ValueError:  # pragma: no cover
    _MAX_DIMS = 32

cdef object _OBJECT_DTYPE = np.dtype(object)
cdef object _INT16_DTYPE = np.dtype("<i2")
cdef object _ndarray = np.ndarray
cdef object _np_empty = np.empty
cdef object _np_array = np.array
cdef object _np_frombuffer = np.frombuffer
cdef object _memoryview = memoryview

# Copies and typed-contents fills of at least this many bytes run with the GIL
# released (below it, releasing and re-taking the GIL costs more than it frees).
cdef enum:
    NOGIL_COPY = 1 << 18

cdef inline int _match_dtype(const uchar* p, Py_ssize_t n) noexcept nogil:
    cdef int i
    for i in range(N_DT):
        if _DT_LEN[i] == n and memcmp(p, _DT_C[i], <size_t>n) == 0:
            return i
    return -1


cdef str _shape_str(tuple shape):
    return "[" + ",".join([str(d) for d in shape]) + "]"


# --------------------------------------------------------------------------- #
# Small growable vector with inline storage (lives on the C stack)             #
# --------------------------------------------------------------------------- #

cdef enum:
    VEC_INLINE = 256    # bytes of inline storage

cdef struct Vec:
    char* heap          # NULL while the items fit in ``small``
    Py_ssize_t n
    Py_ssize_t cap
    Py_ssize_t itemsize
    char small[VEC_INLINE]

cdef inline void _vinit(Vec* v, Py_ssize_t itemsize) noexcept nogil:
    v.heap = NULL
    v.n = 0
    v.itemsize = itemsize
    v.cap = VEC_INLINE // itemsize

cdef inline char* _vdata(Vec* v) noexcept nogil:
    return v.heap if v.heap != NULL else v.small

cdef int _vgrow(Vec* v) except -1:
    cdef Py_ssize_t cap = v.cap * 2
    cdef char* mem
    if v.heap == NULL:
        mem = <char*>PyMem_Malloc(cap * v.itemsize)
        if mem == NULL:
            raise MemoryError()
        memcpy(mem, v.small, v.n * v.itemsize)
    else:
        mem = <char*>PyMem_Realloc(v.heap, cap * v.itemsize)
        if mem == NULL:
            raise MemoryError()
    v.heap = mem
    v.cap = cap
    return 0

cdef inline void* _vpush(Vec* v) except NULL:
    if v.n == v.cap:
        _vgrow(v)
    v.n += 1
    return _vdata(v) + (v.n - 1) * v.itemsize

cdef inline void _vfree(Vec* v) noexcept:
    if v.heap != NULL:
        PyMem_Free(v.heap)
        v.heap = NULL
    v.n = 0


# --------------------------------------------------------------------------- #
# Reading: a cursor over ``const uchar*`` (like asyncpg's FRBuffer)            #
# --------------------------------------------------------------------------- #

cdef struct Reader:
    const uchar* base   # start of the whole buffer (for offsets in messages)
    const uchar* p      # next byte to read
    const uchar* end    # end of the current (sub-)message

cdef struct Span:
    Py_ssize_t off      # offset from Reader.base
    Py_ssize_t n


cdef inline const uchar* _varint(const uchar* p, const uchar* end, uint64_t* out) noexcept nogil:
    """Decode one varint; NULL when it is truncated, longer than 10 bytes or overflows 64 bits."""
    cdef uint64_t v = 0, b
    cdef int shift = 0
    if p < end and p[0] < 0x80:
        out[0] = p[0]
        return p + 1
    while p < end:
        b = p[0]
        p += 1
        if shift == 63 and b > 1:
            return NULL
        v |= (b & 0x7F) << shift
        if b < 0x80:
            out[0] = v
            return p
        shift += 7
    return NULL


cdef int _varint_error(Reader* r) except -1:
    """Raise for the bad varint at ``r.p`` (cold path)."""
    cdef const uchar* p = r.p
    cdef int i = 0
    while p < r.end and i < 10 and p[0] >= 0x80:
        p += 1
        i += 1
    if p >= r.end:
        raise CodecError(f"truncated message: varint at byte {r.p - r.base} runs past the end")
    raise CodecError(f"malformed varint at byte {r.p - r.base}: longer than 10 bytes or over 64 bits")


cdef int _tag_error(Reader* r) except -1:
    """Raise for the bad tag at ``r.p`` (cold path)."""
    cdef uint64_t tag = 0
    cdef const uchar* q = _varint(r.p, r.end, &tag)
    cdef Py_ssize_t at = r.p - r.base
    if q == NULL:
        return _varint_error(r)
    if q - r.p > 5 or tag > 0xFFFFFFFFu:
        raise CodecError(f"malformed tag at byte {at}")
    field = tag >> 3
    wt = tag & 7
    if field == 0:
        raise CodecError(f"invalid field number 0 at byte {at}")
    if wt == 3 or wt == 4:
        raise CodecError(
            f"protobuf groups are not supported (field {field}, wire type {wt}, byte {at})")
    raise CodecError(f"invalid wire type {wt} for field {field} at byte {at}")


cdef inline int _read_varint(Reader* r, uint64_t* out) except -1:
    cdef const uchar* q = _varint(r.p, r.end, out)
    if q == NULL:
        _varint_error(r)
        return -1
    r.p = q
    return 0


cdef inline int _read_tag(Reader* r, uint32_t* field, int* wt) except -1:
    """Read a tag; field number 0, groups (wire types 3/4) and wire types 6/7 raise."""
    cdef uint64_t tag
    cdef const uchar* q = r.p
    if q < r.end and q[0] < 0x80:
        tag = q[0]
        q += 1
    else:
        q = _varint(q, r.end, &tag)
        if q == NULL or q - r.p > 5 or tag > 0xFFFFFFFFu:
            _tag_error(r)
            return -1
    # bits 3, 4, 6 and 7 of 0xD8: the wire types that are rejected
    if (tag >> 3) == 0 or (0xD8 >> (tag & 7)) & 1:
        _tag_error(r)
        return -1
    r.p = q
    field[0] = <uint32_t>(tag >> 3)
    wt[0] = <int>(tag & 7)
    return 0


cdef int _len_error(Reader* r, uint64_t n, const uchar* payload) except -1:
    raise CodecError(
        f"truncated message: field of {n} bytes at byte {payload - r.base} runs past the end "
        f"({r.end - payload} bytes left)")


cdef inline int _read_len(Reader* r, Reader* sub) except -1:
    """Read a length-delimited field's header; ``sub`` spans its payload, ``r`` moves past it."""
    cdef uint64_t n
    cdef const uchar* q = r.p
    if q < r.end and q[0] < 0x80:
        n = q[0]
        q += 1
    else:
        q = _varint(q, r.end, &n)
        if q == NULL:
            _varint_error(r)
            return -1
    if n > <uint64_t>(r.end - q):
        _len_error(r, n, q)
        return -1
    sub.base = r.base
    sub.p = q
    sub.end = q + n
    r.p = sub.end
    return 0


cdef int _need_error(Reader* r, Py_ssize_t n) except -1:
    raise CodecError(f"truncated message: {n}-byte value at byte {r.p - r.base} runs past the end")


cdef inline int _need(Reader* r, Py_ssize_t n) except -1:
    if r.end - r.p < n:
        return _need_error(r, n)
    return 0


cdef int _skip(Reader* r, int wt) except -1:
    cdef uint64_t v = 0
    cdef Reader sub
    if wt == 0:
        _read_varint(r, &v)
    elif wt == 1:
        _need(r, 8)
        r.p += 8
    elif wt == 2:
        _read_len(r, &sub)
    else:  # 5 (the others were rejected by _read_tag)
        _need(r, 4)
        r.p += 4
    return 0


cdef PyObject* _propagate() except NULL:
    """Return NULL so that the exception already set goes up to the caller."""
    return NULL


cdef object _unicode_error(str what, str problem):
    """Turn the pending UnicodeError into CodecError; anything else (MemoryError) goes up."""
    if PyErr_ExceptionMatches(UnicodeError):
        PyErr_Clear()
        raise CodecError(f"{what} {problem}")
    _propagate()


cdef inline object _str_from(const uchar* p, Py_ssize_t n, str what):
    """A str from UTF-8 bytes (copy: str objects own their text)."""
    cdef PyObject* o
    if n == 0:
        return ""
    o = _PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    if o == NULL:
        return _unicode_error(what, "is not valid UTF-8")
    s = <object>o       # takes a reference ...
    Py_DECREF(s)        # ... so drop the one returned by the call
    return s


cdef inline object _read_str(Reader* r, str what):
    cdef Reader sub
    _read_len(r, &sub)
    return _str_from(sub.p, sub.end - sub.p, what)


# Names (model, tensor and parameter names) repeat from request to request: a
# small direct-mapped cache hands back the same str object for the same UTF-8
# bytes instead of decoding a new one each time.  Entries are strong references
# that live as long as the module; the cache is only touched with the GIL held
# and no Python code runs between the lookup and the use of an entry.
cdef enum:
    NAME_CACHE_SIZE = 1024      # a power of two
    NAME_CACHE_MAX_LEN = 64     # longer names are not cached

cdef PyObject* _name_cache[NAME_CACHE_SIZE]
memset(_name_cache, 0, sizeof(_name_cache))


cdef object _name_from(const uchar* p, Py_ssize_t n, str what):
    """Like _str_from, for strings that are likely to repeat (cached)."""
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t i, cn
    cdef PyObject* entry
    cdef const char* cp
    if n == 0 or n > NAME_CACHE_MAX_LEN:
        return _str_from(p, n, what)
    for i in range(n):              # FNV-1a
        h = (h ^ p[i]) * 16777619u
    h &= NAME_CACHE_SIZE - 1
    entry = _name_cache[h]
    if entry != NULL:
        if PyUnicode_IS_COMPACT_ASCII(<object>entry):     # its bytes are its UTF-8
            cp = <const char*>PyUnicode_DATA(<object>entry)
            cn = PyUnicode_GET_LENGTH(<object>entry)
        else:   # decoded from valid UTF-8, so this returns its cached UTF-8 and cannot fail
            cp = PyUnicode_AsUTF8AndSize(<object>entry, &cn)
        if cn == n and memcmp(cp, p, n) == 0:
            return <object>entry
    s = _str_from(p, n, what)
    # Decoding may have run Python code (a GC finalizer) that changed the slot:
    # read it again, and swap with no Python code in between.
    entry = _name_cache[h]
    Py_INCREF(s)
    _name_cache[h] = <PyObject*>s
    Py_XDECREF(entry)
    return s


cdef inline object _read_name(Reader* r, str what):
    cdef Reader sub
    _read_len(r, &sub)
    return _name_from(sub.p, sub.end - sub.p, what)


cdef inline double _le_double(const uchar* p) noexcept nogil:
    cdef double d
    memcpy(&d, p, 8)
    return d


# --------------------------------------------------------------------------- #
# Parameters                                                                   #
# --------------------------------------------------------------------------- #

cdef object _UNSET = object()
cdef str _INPUT = "input"
cdef str _OUTPUT = "output"


cdef object _parse_param_value(Reader* r, object current):
    """InferParameter: merge one occurrence into ``current`` (the last set choice wins)."""
    cdef uint32_t field
    cdef int wt
    cdef uint64_t v = 0
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if field == 1 and wt == 0:
            _read_varint(r, &v)
            current = v != 0
        elif field == 2 and wt == 0:
            _read_varint(r, &v)
            current = <int64_t>v
        elif field == 3 and wt == 2:
            current = _read_str(r, "string_param")
        elif field == 4 and wt == 1:
            _need(r, 8)
            current = _le_double(r.p)
            r.p += 8
        elif field == 5 and wt == 0:
            _read_varint(r, &v)
            current = UInt64(v)
        else:
            _skip(r, wt)
    return current


cdef int _parse_param_entry(Reader* r, dict params) except -1:
    """One map<string, InferParameter> entry {key=1, value=2} into ``params``."""
    cdef uint32_t field
    cdef int wt
    cdef Reader sub
    cdef bint unknown = False
    key = ""
    value = _UNSET
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if field == 1 and wt == 2:
            key = _read_name(r, "parameter name")
        elif field == 2 and wt == 2:
            _read_len(r, &sub)
            value = _parse_param_value(&sub, value)
        else:
            _skip(r, wt)
            unknown = True
    if unknown:
        return 0    # protobuf keeps such an entry as an unknown field: the map is unchanged
    if value is _UNSET:
        params.pop(key, None)
    else:
        params[key] = value
    return 0


# --------------------------------------------------------------------------- #
# Building fastoip.types objects                                               #
# --------------------------------------------------------------------------- #
# The decoder makes thousands of these per second.  When the classes have the
# exact __slots__ layout checked below (verified once at import), an object is
# allocated with tp_alloc and its slots are filled in place, skipping the
# Python-level __init__ and the descriptor lookups of setattr.  Any other layout
# falls back to calling the class.

cdef extern from "Python.h":
    ctypedef struct _TypeObject "PyTypeObject":
        PyObject* (*tp_alloc)(_TypeObject*, Py_ssize_t)
    ctypedef struct _MemberDef "PyMemberDef":
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct _MemberDescr "PyMemberDescrObject":
        _MemberDef* d_member

cdef enum:
    _T_OBJECT_EX = 16   # structmember.h: an object slot, AttributeError when unset

cdef struct Layout:
    bint fast
    Py_ssize_t off[6]   # slot offsets, in the order of the class's __slots__

cdef Layout _L_INPUT, _L_OUTPUT, _L_REQUEST, _L_RESPONSE, _L_REQUESTED


cdef void _init_layout(Layout* L, type cls, tuple names):
    cdef _MemberDescr* md
    cdef Py_ssize_t i
    L.fast = False
    if (cls.__dict__.get("__slots__") != names or cls.__bases__ != (object,)
            or cls.__new__ is not object.__new__ or "__dict__" in cls.__dict__):
        return
    member_type = type(InferInput.__dict__["name"])
    for i, name in enumerate(names):
        d = cls.__dict__.get(name)
        if type(d) is not member_type:
            return
        md = <_MemberDescr*><PyObject*>d
        if md.d_member.type != _T_OBJECT_EX or md.d_member.flags != 0:
            return
        L.off[i] = md.d_member.offset
    L.fast = True


_init_layout(&_L_INPUT, InferInput, ("name", "datatype", "shape", "data", "parameters"))
_init_layout(&_L_OUTPUT, InferOutput, ("name", "datatype", "shape", "data", "parameters"))
_init_layout(&_L_REQUEST, InferRequest,
             ("model_name", "model_version", "id", "parameters", "inputs", "outputs"))
_init_layout(&_L_RESPONSE, InferResponse,
             ("model_name", "model_version", "id", "parameters", "outputs"))
_init_layout(&_L_REQUESTED, RequestedOutput, ("name", "parameters"))

#: True when the decoder fills slots in place (see above); for tests.
FAST_SLOTS = all(L.fast for L in (_L_INPUT, _L_OUTPUT, _L_REQUEST, _L_RESPONSE, _L_REQUESTED))


cdef inline object _alloc(type cls):
    cdef PyObject* o = (<_TypeObject*>cls).tp_alloc(<_TypeObject*>cls, 0)
    if o == NULL:
        raise MemoryError()
    obj = <object>o
    Py_DECREF(obj)   # <object> took a second reference
    return obj


cdef inline void _put(object obj, Py_ssize_t offset, object value) noexcept:
    """Store ``value`` in an empty (NULL) slot of a fresh object."""
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>obj) + offset)
    Py_INCREF(value)
    slot[0] = <PyObject*>value


cdef inline int _set_data(object tensor, type cls, Layout* L, object data) except -1:
    """``tensor.data = data`` (in place for exact instances of ``cls``, laid out as ``L``)."""
    cdef PyObject** slot
    cdef PyObject* old
    if L.fast and type(tensor) is cls:
        slot = <PyObject**>((<char*><PyObject*>tensor) + L.off[3])
        old = slot[0]
        Py_INCREF(data)
        slot[0] = <PyObject*>data
        Py_XDECREF(old)
    else:
        tensor.data = data
    return 0


cdef object _make_tensor(type cls, Layout* L, object name, object datatype, tuple shape,
                         dict params):
    if not L.fast:
        return cls(name, datatype, shape, None, params)
    obj = _alloc(cls)
    _put(obj, L.off[0], name)
    _put(obj, L.off[1], datatype)
    _put(obj, L.off[2], shape)
    _put(obj, L.off[3], None)
    _put(obj, L.off[4], params)
    return obj


cdef object _make_requested(object name, dict params):
    if not _L_REQUESTED.fast:
        return RequestedOutput(name, params)
    obj = _alloc(RequestedOutput)
    _put(obj, _L_REQUESTED.off[0], name)
    _put(obj, _L_REQUESTED.off[1], params)
    return obj


cdef object _make_message(type cls, Layout* L, object model_name, object model_version,
                          object request_id, dict params, list tensors, list requested):
    """An InferRequest (``requested`` is a list) or an InferResponse (``requested`` is None)."""
    if not L.fast:
        if requested is None:
            return cls(model_name, model_version, request_id, params, tensors)
        return cls(model_name, model_version, request_id, params, tensors, requested)
    obj = _alloc(cls)
    _put(obj, L.off[0], model_name)
    _put(obj, L.off[1], model_version)
    _put(obj, L.off[2], request_id)
    _put(obj, L.off[3], params)
    _put(obj, L.off[4], tensors)
    if requested is not None:
        _put(obj, L.off[5], requested)
    return obj


cdef inline object _attr(object obj, type cls, Layout* L, int i, str name):
    """``getattr(obj, name)``, read straight from the slot for exact instances of ``cls``."""
    cdef PyObject* v
    if L.fast and type(obj) is cls:
        v = (<PyObject**>((<char*><PyObject*>obj) + L.off[i]))[0]
        if v != NULL:
            return <object>v
    return getattr(obj, name)


# --------------------------------------------------------------------------- #
# Tensors (InferInputTensor / InferOutputTensor share field numbers)           #
# --------------------------------------------------------------------------- #

cdef struct TensorInfo:
    int code            # datatype code
    bint has_contents   # a ``contents`` field was present
    bint shm            # parameters name a shared_memory_region
    int64_t count       # element count (product of the shape)
    Py_ssize_t span_lo  # this tensor's ``contents`` occurrences in the spans vector
    Py_ssize_t span_hi


cdef object _parse_tensor(Reader* r, str kind, type cls, Vec* spans, Vec* dims, TensorInfo* info):
    """Parse one tensor message; returns the tensor object with ``data`` None and fills ``info``."""
    cdef uint32_t field
    cdef int wt, code = -1
    cdef uint64_t v = 0
    cdef Reader sub
    cdef Span* span
    cdef int64_t d, limit, count = 1
    cdef bint negative = False, zero = False, too_big = False
    cdef Py_ssize_t i
    cdef int64_t* dv
    cdef object item
    name = ""
    datatype = ""
    params = None
    dims.n = 0
    info.has_contents = False
    info.span_lo = spans.n
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if field == 1 and wt == 2:
            name = _read_name(r, "input name" if kind is _INPUT else "output name")
        elif field == 2 and wt == 2:
            _read_len(r, &sub)
            code = _match_dtype(sub.p, sub.end - sub.p)
            if code >= 0:
                datatype = _DT_NAMES[code]   # the interned canonical name
            else:
                datatype = _str_from(sub.p, sub.end - sub.p,
                                     "input datatype" if kind is _INPUT else "output datatype")
        elif field == 3 and wt == 2:  # packed shape
            _read_len(r, &sub)
            while sub.p < sub.end:
                _read_varint(&sub, &v)
                (<int64_t*>_vpush(dims))[0] = <int64_t>v
        elif field == 3 and wt == 0:  # unpacked shape element
            _read_varint(r, &v)
            (<int64_t*>_vpush(dims))[0] = <int64_t>v
        elif field == 4 and wt == 2:
            _read_len(r, &sub)
            if params is None:
                params = {}
            _parse_param_entry(&sub, params)
        elif field == 5 and wt == 2:
            _read_len(r, &sub)
            span = <Span*>_vpush(spans)
            span.off = sub.p - sub.base
            span.n = sub.end - sub.p
            info.has_contents = True
        else:
            _skip(r, wt)
    info.span_hi = spans.n
    if params is None:
        params = {}

    if code < 0:
        raise CodecError(f"{kind} '{name}': unknown datatype '{datatype}'")
    if dims.n > _MAX_DIMS:
        raise CodecError(f"{kind} '{name}': {dims.n} dimensions, numpy allows at most {_MAX_DIMS}")

    # Shape -> tuple.  Element count with an overflow check before each multiply:
    # the product of the non-zero dimensions times the item size (a pointer for
    # BYTES) must fit in int64, as numpy requires even of an empty array.
    limit = INT64_MAX // (_ITEMSIZE[code] if code != DT_BYTES else <int>sizeof(void*))
    dv = <int64_t*>_vdata(dims)
    shape = PyTuple_New(dims.n)
    for i in range(dims.n):
        d = dv[i]
        item = d
        Py_INCREF(item)
        PyTuple_SET_ITEM(shape, i, item)
        if d < 0:
            negative = True
        elif d == 0:
            zero = True
        elif not too_big:
            # (both under 2**29: the product is far below any limit, skip the slow division)
            if (count | d) >> 29 and count > limit // d:
                too_big = True
            else:
                count *= d
    if negative:
        raise CodecError(
            ("All input dimensions should be specified for " if kind is _INPUT else "")
            + f"{kind} '{name}': negative dimension in shape {_shape_str(shape)}")
    if too_big:
        raise CodecError(f"{kind} '{name}': shape {_shape_str(shape)} has too many elements")
    if zero:
        count = 0
    info.code = code
    info.count = count
    info.shm = len(<dict>params) != 0 and "shared_memory_region" in params
    if cls is InferInput:
        return _make_tensor(cls, &_L_INPUT, name, datatype, shape, params)
    return _make_tensor(cls, &_L_OUTPUT, name, datatype, shape, params)


# --------------------------------------------------------------------------- #
# Tensor data                                                                  #
# --------------------------------------------------------------------------- #

#: Most BYTES elements one request (and so one tensor) may decode into: each becomes a Python bytes
#: object (~40-60 bytes of memory for as little as 4 bytes on the wire), so a small request must not
#: expand without bound.
DEFAULT_MAX_BYTES_ELEMENTS = 1 << 17
cdef int64_t _max_bytes_elements = DEFAULT_MAX_BYTES_ELEMENTS


def set_max_bytes_elements(limit):
    """Set the most BYTES elements a decoded tensor may have (the server's ``--max-bytes-elements``)."""
    global _max_bytes_elements
    if limit < 1:
        raise ValueError("the BYTES element limit must be at least 1")
    _max_bytes_elements = limit


def max_bytes_elements():
    return _max_bytes_elements


cdef int _check_bytes_count(int64_t count, str what) except -1:
    """Refuse a BYTES tensor with more elements than the limit, before any element is built."""
    if count > _max_bytes_elements:
        raise CodecError(
            f"{what}: too many elements for a BYTES tensor: {count}, more than this server's limit of "
            f"{_max_bytes_elements} (--max-bytes-elements)")
    return 0


cdef int _check_request_bytes_count(TensorInfo* info, Py_ssize_t n) except -1:
    """The BYTES element limit counts every BYTES input a request carries, before any is decoded."""
    cdef int64_t total = 0
    cdef Py_ssize_t i
    for i in range(n):
        if info[i].code == DT_BYTES and not info[i].shm:
            if info[i].count > _max_bytes_elements - total:
                raise CodecError(
                    f"too many elements for BYTES tensors in one request: more than this server's limit of "
                    f"{_max_bytes_elements} (--max-bytes-elements)")
            total += info[i].count
    return 0


cdef object _bytes_array(const uchar* p, Py_ssize_t n, int64_t count, str what):
    """BYTES framing (uint32 LE length + bytes per element) -> 1-D object array of bytes."""
    cdef const uchar* end = p + n
    cdef uint32_t ln
    cdef Py_ssize_t i
    if count < 0:
        raise CodecError(f"{what}: negative BYTES element count {count}")
    if count > n // 4:
        raise CodecError(
            f"unexpected number of string elements: {what}: {count} BYTES elements need at least "
            f"{<object>count * 4} bytes, got {n}")
    _check_bytes_count(count, what)
    lst = PyList_New(<Py_ssize_t>count)
    for i in range(<Py_ssize_t>count):
        if end - p < 4:
            raise CodecError(f"incomplete string length indicator: {what}: BYTES element {i}: truncated length prefix")
        memcpy(&ln, p, 4)
        p += 4
        if ln > <uint64_t>(end - p):
            raise CodecError(
                f"{what}: BYTES element {i} declares {ln} bytes but only {end - p} remain")
        item = PyBytes_FromStringAndSize(<const char*>p, ln)   # copy: one bytes per element
        Py_INCREF(item)
        PyList_SET_ITEM(lst, i, item)
        p += ln
    if p != end:
        raise CodecError(
            f"unexpected number of string elements: {what}: {end - p} bytes left over after {count} BYTES elements")
    return _np_array(lst, _OBJECT_DTYPE)   # copy of the element pointers into the array


cdef extern from *:
    """
    /* A read-only C-contiguous array on data (inside base) whose base object is base.
       PyArray_NewFromDescr steals the dtype reference, PyArray_SetBaseObject the base's. */
    static PyObject* fastoip_bytes_view(PyObject* base, PyObject* dtype, int nd,
                                        npy_intp* dims, char* data) {
        PyObject* arr;
        Py_INCREF(dtype);
        arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)dtype, nd, dims, NULL,
                                   data, NPY_ARRAY_C_CONTIGUOUS, NULL);
        if (arr == NULL) return NULL;
        Py_INCREF(base);
        if (PyArray_SetBaseObject((PyArrayObject*)arr, base) < 0) {
            Py_DECREF(arr);
            return NULL;
        }
        return arr;
    }
    """
    object fastoip_bytes_view(object base, object dtype, int nd, cnp.npy_intp* dims, char* data)


cdef object _bytes_view(bytes base, object shape, object dtype, Py_ssize_t offset):
    """A zero-copy read-only view on ``base[offset:]`` through numpy's C API (several times
    cheaper than calling np.ndarray).  Shape and byte size are already checked."""
    cdef cnp.npy_intp dims[64]
    cdef Py_ssize_t i, nd = len(<tuple>shape)
    for i in range(nd):
        dims[i] = <cnp.npy_intp>(<object>PyTuple_GET_ITEM(shape, i))
    return fastoip_bytes_view(base, dtype, <int>nd, dims, PyBytes_AS_STRING(base) + offset)


cdef object _raw_tensor(object base, const uchar* start, Span span, TensorInfo* info,
                        object tensor, str kind):
    """A tensor from its raw entry: a read-only zero-copy view (BYTES: new object array)."""
    cdef int64_t count = info.count
    cdef int isz = _ITEMSIZE[info.code]
    shape = _attr(tensor, InferInput if kind is _INPUT else InferOutput,
                  &_L_INPUT if kind is _INPUT else &_L_OUTPUT, 2, "shape")
    if info.code == DT_BYTES:
        arr = _bytes_array(start + span.off, span.n, count, f"{kind} '{tensor.name}'")
        return arr.reshape(shape)
    if count > span.n // isz or count * isz != span.n:
        raise CodecError(
            # Triton's words first (clients match on them), then the detail.
            ("input byte size mismatch: " if kind is _INPUT else "")
            + f"{kind} '{tensor.name}': expected {<object>count * isz} bytes for {_DT_NAMES[info.code]} "
            f"{_shape_str(shape)}, got {span.n}")
    # No copy: a view on the received buffer (read-only because the buffer is).
    if PyBytes_CheckExact(base):
        return _bytes_view(base, shape, <object>PyTuple_GET_ITEM(_DT_NUMPY, info.code), span.off)
    # Any other buffer: np.ndarray(buffer=memoryview) would keep only the memoryview's
    # underlying object, without a buffer export, so a bytearray could then be resized
    # under the array.  frombuffer keeps the memoryview (and so the export) as its base.
    return _np_frombuffer(base, _DT_NUMPY[info.code], <Py_ssize_t>count, span.off).reshape(shape)


cdef int _scan_contents(Reader* r, Py_ssize_t* counts) except -1:
    """Validate one InferTensorContents and add up its elements per field."""
    cdef uint32_t field
    cdef int wt
    cdef uint64_t v = 0
    cdef Reader sub
    cdef Py_ssize_t n, k
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if F_BOOL <= field <= F_UINT64 and wt == 0:
            _read_varint(r, &v)
            counts[field] += 1
        elif F_BOOL <= field <= F_UINT64 and wt == 2:   # packed varints
            _read_len(r, &sub)
            k = 0
            while sub.p < sub.end:
                _read_varint(&sub, &v)
                k += 1
            counts[field] += k
        elif field == F_FP32 and wt == 5:
            _need(r, 4)
            r.p += 4
            counts[field] += 1
        elif field == F_FP64 and wt == 1:
            _need(r, 8)
            r.p += 8
            counts[field] += 1
        elif (field == F_FP32 or field == F_FP64) and wt == 2:   # packed fixed
            _read_len(r, &sub)
            n = sub.end - sub.p
            k = 4 if field == F_FP32 else 8
            if n % k:
                raise CodecError(
                    f"malformed packed {_FIELD_NAMES[field]}: {n} bytes is not a multiple of {k}")
            counts[field] += n // k
        elif field == F_BYTES and wt == 2:
            _read_len(r, &sub)
            counts[field] += 1
        else:
            _skip(r, wt)
    return 0


cdef inline const uchar* _skip_nogil(const uchar* p, const uchar* end, int wt) noexcept nogil:
    cdef uint64_t v = 0
    if wt == 0:
        return _varint(p, end, &v)
    if wt == 1:
        return p + 8
    if wt == 5:
        return p + 4
    p = _varint(p, end, &v)     # wt 2
    return p + v if p != NULL else NULL


cdef Py_ssize_t _fill_contents(const uchar* p, const uchar* end, int want, int isz,
                               char* dst, Py_ssize_t idx, Py_ssize_t cap) noexcept nogil:
    """Copy the values of field ``want`` into ``dst`` (already validated by _scan_contents).

    Varint values are stored as their low ``isz`` bytes (two's complement
    truncation, as a C cast does); bool as 0/1; fp32/fp64 are copied as they are.
    Returns the new element index.
    """
    cdef uint64_t tag = 0, v = 0, ln = 0
    cdef int wt
    cdef uint32_t field
    cdef const uchar* q
    cdef const uchar* qe
    while p != NULL and p < end:
        p = _varint(p, end, &tag)
        if p == NULL:
            break
        field = <uint32_t>(tag >> 3)
        wt = <int>(tag & 7)
        if field != <uint32_t>want:
            p = _skip_nogil(p, end, wt)
            continue
        if wt == 2:
            p = _varint(p, end, &ln)
            if p == NULL:
                break
            q = p
            qe = p + ln
            p = qe
            if want == F_FP32 or want == F_FP64:
                if idx + <Py_ssize_t>(ln // isz) > cap:
                    break
                memcpy(dst + idx * isz, q, ln)     # copy: packed floats
                idx += ln // isz
            else:
                while q != NULL and q < qe and idx < cap:
                    q = _varint(q, qe, &v)
                    if want == F_BOOL:
                        dst[idx] = v != 0
                    else:
                        memcpy(dst + idx * isz, &v, isz)
                    idx += 1
        elif wt == 0 and want <= F_UINT64:
            p = _varint(p, end, &v)
            if idx < cap:
                if want == F_BOOL:
                    dst[idx] = v != 0
                else:
                    memcpy(dst + idx * isz, &v, isz)
                idx += 1
        elif (wt == 5 and want == F_FP32) or (wt == 1 and want == F_FP64):
            if idx < cap:
                memcpy(dst + idx * isz, p, isz)
                idx += 1
            p += isz
        else:
            p = _skip_nogil(p, end, wt)
    return idx


cdef object _typed_tensor(const uchar* start, Span* spans, TensorInfo* info, object tensor, str kind):
    """A new array from typed ``contents`` (all occurrences merged, as protobuf does)."""
    cdef Py_ssize_t counts[9]
    cdef Reader r
    cdef Py_ssize_t i, idx
    cdef int f, want = _CONTENTS_FIELD[info.code]
    cdef Py_buffer view
    cdef uint32_t field
    cdef int wt
    cdef uint64_t v = 0
    cdef Reader sub
    memset(counts, 0, sizeof(counts))
    for i in range(info.span_lo, info.span_hi):
        r.base = start
        r.p = start + spans[i].off
        r.end = r.p + spans[i].n
        _scan_contents(&r, counts)
    name = tensor.name
    dt = _DT_NAMES[info.code]
    if want == 0:
        raise CodecError(
            f"{kind} '{name}': {dt} has no typed contents field; send it as raw_{kind}_contents")
    for f in range(1, 9):
        if f != want and counts[f] > 0:
            raise CodecError(
                f"{kind} '{name}': datatype {dt} takes {_FIELD_NAMES[want]}, got {_FIELD_NAMES[f]}")
    if counts[want] != info.count:
        raise CodecError(
            f"{kind} '{name}': {dt} {_shape_str(tensor.shape)} needs {info.count} elements, "
            f"{_FIELD_NAMES[want]} has {counts[want]}")
    shape = tensor.shape
    if want == F_BYTES:
        _check_bytes_count(counts[want], f"{kind} '{name}'")
        lst = PyList_New(counts[want])
        idx = 0
        for i in range(info.span_lo, info.span_hi):
            r.base = start
            r.p = start + spans[i].off
            r.end = r.p + spans[i].n
            while r.p < r.end:
                _read_tag(&r, &field, &wt)
                if field == F_BYTES and wt == 2 and idx < counts[want]:
                    _read_len(&r, &sub)
                    # copy: one bytes object per element
                    item = PyBytes_FromStringAndSize(<const char*>sub.p, sub.end - sub.p)
                    Py_INCREF(item)
                    PyList_SET_ITEM(lst, idx, item)
                    idx += 1
                else:
                    _skip(&r, wt)
        if idx != counts[want]:   # cannot happen after _scan_contents; the list must be full
            raise CodecError(f"{kind} '{name}': inconsistent contents")
        return _np_array(lst, _OBJECT_DTYPE).reshape(shape)
    arr = _np_empty(<Py_ssize_t>info.count, _DT_NUMPY[info.code])
    PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE)
    try:
        # The new array is private and the message buffer is held: large fills run without the GIL.
        idx = 0
        for i in range(info.span_lo, info.span_hi):
            if spans[i].n >= NOGIL_COPY:
                with nogil:
                    idx = _fill_contents(start + spans[i].off, start + spans[i].off + spans[i].n,
                                         want, _ITEMSIZE[info.code], <char*>view.buf, idx,
                                         <Py_ssize_t>info.count)
            else:
                idx = _fill_contents(start + spans[i].off, start + spans[i].off + spans[i].n,
                                     want, _ITEMSIZE[info.code], <char*>view.buf, idx,
                                     <Py_ssize_t>info.count)
    finally:
        PyBuffer_Release(&view)
    if idx != info.count:   # cannot happen after _scan_contents; kept as a guard
        raise CodecError(f"{kind} '{name}': inconsistent contents")
    return arr.reshape(shape)


# --------------------------------------------------------------------------- #
# Decoding requests and responses                                              #
# --------------------------------------------------------------------------- #

cdef object _readonly_bytes_view(object data):
    """A 1-D, read-only, byte-format memoryview of any contiguous buffer."""
    mv = _memoryview(data)
    if not mv.c_contiguous:
        raise CodecError("message buffer is not contiguous")
    if mv.ndim != 1 or mv.itemsize != 1 or mv.format != "B":
        mv = mv.cast("B")
    if not mv.readonly:
        mv = mv.toreadonly()
    return mv


cdef object _decode(object data, bint response):
    cdef Py_buffer view
    cdef bint have_view = False
    cdef Reader r, sub
    cdef Vec spans, infos, raws, dims
    cdef uint32_t field
    cdef int wt
    cdef Span* span
    cdef TensorInfo* info
    cdef Py_ssize_t i, j, n_tensors, needing
    cdef const uchar* start
    cdef str kind = _OUTPUT if response else _INPUT
    _vinit(&spans, sizeof(Span))
    _vinit(&infos, sizeof(TensorInfo))
    _vinit(&raws, sizeof(Span))
    _vinit(&dims, sizeof(int64_t))
    if PyBytes_CheckExact(data):
        base = data
        start = <const uchar*>PyBytes_AS_STRING(data)
        r.end = start + PyBytes_GET_SIZE(data)
    else:
        base = _readonly_bytes_view(data)
        PyObject_GetBuffer(base, &view, PyBUF_SIMPLE)
        have_view = True
        start = <const uchar*>view.buf
        r.end = start + view.len
    r.base = start
    r.p = start
    model_name = ""
    model_version = ""
    request_id = ""
    params = {}
    tensors = []
    requested = []
    tensor_cls = InferOutput if response else InferInput
    try:
        while r.p < r.end:
            _read_tag(&r, &field, &wt)
            if wt != 2:
                _skip(&r, wt)
            elif field == 1:
                model_name = _read_name(&r, "model_name")
            elif field == 2:
                model_version = _read_name(&r, "model_version")
            elif field == 3:
                request_id = _read_str(&r, "id")
            elif field == 4:
                _read_len(&r, &sub)
                _parse_param_entry(&sub, params)
            elif field == 5:
                _read_len(&r, &sub)
                info = <TensorInfo*>_vpush(&infos)
                tensors.append(_parse_tensor(&sub, kind, tensor_cls, &spans, &dims, info))
            elif field == 6 and not response:
                _read_len(&r, &sub)
                requested.append(_parse_requested_output(&sub))
            elif (field == 6 and response) or (field == 7 and not response):
                _read_len(&r, &sub)
                span = <Span*>_vpush(&raws)
                span.off = sub.p - start
                span.n = sub.end - sub.p
            else:
                _skip(&r, wt)

        # Attach the tensor data.
        n_tensors = len(tensors)
        info = <TensorInfo*>_vdata(&infos)
        span = <Span*>_vdata(&raws)
        if response:
            _attach_response_data(base, start, info, span, raws.n, <Span*>_vdata(&spans), tensors)
        else:
            needing = 0
            for i in range(n_tensors):
                if info[i].shm:
                    if info[i].has_contents:
                        raise CodecError(
                            f"input '{tensors[i].name}': a shared-memory input cannot carry contents")
                elif info[i].has_contents:
                    if raws.n:
                        raise CodecError(
                            f"input '{tensors[i].name}': contents and raw_input_contents cannot be "
                            f"mixed in one request")
                else:
                    needing += 1
            if raws.n != needing:
                raise CodecError(
                    f"expected {needing} raw_input_contents entries (one per input without "
                    f"shared memory or contents), got {raws.n}")
            _check_request_bytes_count(info, n_tensors)
            j = 0
            for i in range(n_tensors):
                t = tensors[i]
                if info[i].shm:
                    continue
                if info[i].has_contents:
                    _set_data(t, InferInput, &_L_INPUT,
                              _typed_tensor(start, <Span*>_vdata(&spans), &info[i], t, kind))
                else:
                    _set_data(t, InferInput, &_L_INPUT,
                              _raw_tensor(base, start, span[j], &info[i], t, kind))
                    j += 1
    finally:
        _vfree(&spans)
        _vfree(&infos)
        _vfree(&raws)
        _vfree(&dims)
        if have_view:
            PyBuffer_Release(&view)

    if response:
        return _make_message(InferResponse, &_L_RESPONSE, model_name, model_version, request_id,
                             params, tensors, None)
    return _make_message(InferRequest, &_L_REQUEST, model_name, model_version, request_id,
                         params, tensors, requested)


cdef object _parse_requested_output(Reader* r):
    cdef uint32_t field
    cdef int wt
    cdef Reader sub
    name = ""
    params = {}
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if field == 1 and wt == 2:
            name = _read_name(r, "output name")
        elif field == 2 and wt == 2:
            _read_len(r, &sub)
            _parse_param_entry(&sub, params)
        else:
            _skip(r, wt)
    return _make_requested(name, params)


cdef int _attach_response_data(object base, const uchar* start, TensorInfo* info, Span* raw,
                               Py_ssize_t n_raw, Span* spans, list outputs) except -1:
    """Response rule: one raw entry per output, or none (then each output has typed
    contents, is in shared memory, or has no elements).  An empty raw entry for an
    output that has elements means the server wrote it to shared memory (Triton and
    fastoip send no parameters with it): its data is None."""
    cdef Py_ssize_t i, n = len(outputs)
    if n_raw:
        if n_raw != n:
            raise CodecError(
                f"expected {n} raw_output_contents entries (one per output), got {n_raw}")
        for i in range(n):
            t = outputs[i]
            if info[i].has_contents:
                raise CodecError(
                    f"output '{t.name}': contents and raw_output_contents cannot be mixed "
                    f"in one response")
            if raw[i].n == 0 and (info[i].shm or info[i].count != 0):
                continue    # written to shared memory: no data here
            _set_data(t, InferOutput, &_L_OUTPUT, _raw_tensor(base, start, raw[i], &info[i], t, _OUTPUT))
    else:
        for i in range(n):
            t = outputs[i]
            if info[i].has_contents:
                _set_data(t, InferOutput, &_L_OUTPUT, _typed_tensor(start, spans, &info[i], t, _OUTPUT))
            elif info[i].shm:
                continue    # written to shared memory: no data here
            elif info[i].count == 0:
                _set_data(t, InferOutput, &_L_OUTPUT,
                          _np_empty(t.shape, <object>PyTuple_GET_ITEM(_DT_NUMPY, info[i].code)))
            else:
                raise CodecError(
                    f"output '{t.name}': no data for {_DT_NAMES[info[i].code]} "
                    f"{_shape_str(t.shape)} (no raw_output_contents and no contents)")
    return 0


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


# --------------------------------------------------------------------------- #
# Writing                                                                      #
# --------------------------------------------------------------------------- #

cdef inline Py_ssize_t _vsize(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n

cdef inline Py_ssize_t _ld(Py_ssize_t n) noexcept nogil:
    """Size of a length-delimited field with a 1-byte tag and an ``n``-byte payload."""
    return 1 + _vsize(<uint64_t>n) + n

cdef inline char* _wvarint(char* p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = <char>((v & 0x7F) | 0x80)
        v >>= 7
        p += 1
    p[0] = <char>v
    return p + 1

cdef inline char* _whead(char* p, uchar tag, Py_ssize_t n) noexcept nogil:
    p[0] = <char>tag
    return _wvarint(p + 1, <uint64_t>n)

cdef inline char* _wcopy(char* p, const char* src, Py_ssize_t n) noexcept nogil:
    memcpy(p, src, n)
    return p + n

cdef inline char* _wbytes(char* p, uchar tag, const char* src, Py_ssize_t n) noexcept nogil:
    return _wcopy(_whead(p, tag, n), src, n)


cdef struct StrRef:
    PyObject* owner     # a strong reference to the str, dropped by _plan_free (NULL: none)
    const char* p       # its UTF-8
    Py_ssize_t n

cdef struct ParamRec:
    StrRef key
    int field           # InferParameter field number: 1 bool, 2 int64, 3 string, 4 double, 5 uint64
    uint64_t u          # varint payload (bool, int64, uint64)
    double d
    StrRef s
    Py_ssize_t value_len
    Py_ssize_t entry_len

cdef struct TensorRec:
    StrRef name
    int code
    Py_ssize_t dims_lo, dims_hi
    Py_ssize_t shape_len    # packed shape payload size
    Py_ssize_t params_lo, params_hi, params_size
    Py_ssize_t body_len
    int data_kind           # 0: no data, 1: buffer in ``view``, 2: BYTES list in ``items``
    Py_ssize_t raw_len
    PyObject* items         # a strong reference (list of bytes), dropped by _plan_free
    bint has_view
    Py_buffer view

cdef struct OutRec:
    StrRef name
    Py_ssize_t params_lo, params_hi, params_size
    Py_ssize_t body_len

cdef struct Plan:
    # Everything needed to write one ModelInferRequest/ModelInferResponse: sizes
    # and pointers into Python objects.  The plan owns a strong reference to each
    # of those objects (StrRef.owner, TensorRec.items) or a buffer export
    # (TensorRec.view) until _plan_free.
    bint is_request
    StrRef model_name, model_version, id
    Py_ssize_t params_lo, params_hi, params_size
    TensorRec* tensors
    Py_ssize_t n_tensors
    OutRec* outs
    Py_ssize_t n_outs
    Vec params              # ParamRec
    Vec dims                # int64_t
    Py_ssize_t size         # bytes of the whole message


cdef void _plan_init(Plan* pl) noexcept:
    # (the inline storage of the two vectors needs no clearing)
    memset(pl, 0, <size_t>(<char*>&pl.params - <char*>pl))
    pl.size = 0
    _vinit(&pl.params, sizeof(ParamRec))
    _vinit(&pl.dims, sizeof(int64_t))


cdef inline void _str_release(StrRef* ref) noexcept:
    Py_XDECREF(ref.owner)
    ref.owner = NULL


cdef void _plan_free(Plan* pl) noexcept:
    cdef Py_ssize_t i
    cdef ParamRec* recs = <ParamRec*>_vdata(&pl.params)
    _str_release(&pl.model_name)
    _str_release(&pl.model_version)
    _str_release(&pl.id)
    for i in range(pl.params.n):
        _str_release(&recs[i].key)
        _str_release(&recs[i].s)
    if pl.tensors != NULL:
        for i in range(pl.n_tensors):
            _str_release(&pl.tensors[i].name)
            Py_XDECREF(pl.tensors[i].items)
            if pl.tensors[i].has_view:
                PyBuffer_Release(&pl.tensors[i].view)
        PyMem_Free(pl.tensors)
        pl.tensors = NULL
    if pl.outs != NULL:
        for i in range(pl.n_outs):
            _str_release(&pl.outs[i].name)
        PyMem_Free(pl.outs)
        pl.outs = NULL
    _vfree(&pl.params)
    _vfree(&pl.dims)


cdef str _where(str kind, object name):
    """The subject of an encoding error message: "output 'OUT0'", "request", ..."""
    return kind if name is None else f"{kind} '{name}'"


cdef int _plan_str(StrRef* ref, object s, str kind, object name, str what) except -1:
    """Point ``ref`` at the UTF-8 of a str, holding a reference to it."""
    if not PyUnicode_Check(s):
        raise CodecError(f"{_where(kind, name)}: {what} must be a str, got {type(s).__name__}")
    _str_release(ref)
    Py_INCREF(s)
    ref.owner = <PyObject*>s
    ref.p = _PyUnicode_AsUTF8AndSize(s, &ref.n)
    if ref.p == NULL:   # lone surrogates
        _unicode_error(f"{_where(kind, name)}: {what}", "cannot be encoded as UTF-8")
    return 0


cdef int _plan_params(Plan* pl, object params, Py_ssize_t* lo, Py_ssize_t* hi, Py_ssize_t* size,
                      str kind, object name) except -1:
    """Plan a parameters map; ``size`` is the total of its map-entry fields."""
    cdef ParamRec* rec
    cdef Py_ssize_t total = 0
    lo[0] = pl.params.n
    if params:
        if not PyDict_CheckExact(params):
            params = dict(params)
        for key, value in (<dict>params).items():
            rec = <ParamRec*>_vpush(&pl.params)
            memset(rec, 0, sizeof(ParamRec))    # _plan_free reads its owners
            if not _plan_param(rec, key, value, kind, name):
                _str_release(&rec.key)          # None: not written
                pl.params.n -= 1
                continue
            total += _ld(rec.entry_len)
    hi[0] = pl.params.n
    size[0] = total
    return 0


cdef bint _plan_param(ParamRec* rec, object key, object value, str kind,
                      object name) except -1:
    """One parameter: its InferParameter field from the Python type of the value."""
    cdef int overflow = 0
    cdef long long iv
    _plan_str(&rec.key, key, kind, name, "parameter name")
    t = type(value)
    if t is bool:
        rec.field = 1
        rec.u = 1 if value else 0
    elif t is int:
        rec.field = 2
        iv = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            raise CodecError(
                f"{_where(kind, name)} parameter '{key}': {value} does not fit in int64")
        rec.u = <uint64_t>iv
    elif t is float:
        rec.field = 4
        rec.d = PyFloat_AsDouble(value)
    elif t is str:
        rec.field = 3
        _plan_str(&rec.s, value, kind, name, f"parameter '{key}'")
    elif isinstance(value, UInt64):
        rec.field = 5
        try:
            rec.u = PyLong_AsUnsignedLongLong(value)
        except OverflowError:
            raise CodecError(
                f"{_where(kind, name)} parameter '{key}': {value} does not fit in uint64") from None
    elif value is None:
        return False
    elif isinstance(value, (bool, np.bool_)):
        return _plan_param(rec, key, bool(value), kind, name)
    elif isinstance(value, (int, np.integer)):
        return _plan_param(rec, key, int(value), kind, name)
    elif isinstance(value, (float, np.floating)):
        return _plan_param(rec, key, float(value), kind, name)
    elif isinstance(value, str):
        return _plan_param(rec, key, str(value), kind, name)
    else:
        raise CodecError(
            f"{_where(kind, name)} parameter '{key}': unsupported value type {type(value).__name__}")
    if rec.field == 1:
        rec.value_len = 2
    elif rec.field == 4:
        rec.value_len = 9
    elif rec.field == 3:
        rec.value_len = _ld(rec.s.n)
    else:
        rec.value_len = 1 + _vsize(rec.u)
    rec.entry_len = _ld(rec.key.n) + _ld(rec.value_len)
    return True


cdef object _shape_index(object dim, object shape, str kind, object name):
    """A shape element as an int (numpy integers and other __index__ types are accepted)."""
    try:
        return _operator_index(dim)
    except TypeError:
        raise CodecError(f"{_where(kind, name)}: shape {shape!r} must hold integers") from None


cdef int _plan_tensor(Plan* pl, TensorRec* rec, object t, str kind) except -1:
    cdef int64_t d, count = 1
    cdef Py_ssize_t shape_len = 0, body
    cdef int overflow = 0, code
    cdef bint negative = False, too_big = False
    cdef type cls = InferInput if kind is _INPUT else InferOutput
    cdef Layout* L = &_L_INPUT if kind is _INPUT else &_L_OUTPUT
    name = _attr(t, cls, L, 0, "name")
    _plan_str(&rec.name, name, kind, None, "name")
    datatype = _attr(t, cls, L, 1, "datatype")
    code_obj = _DT_CODE.get(datatype) if PyUnicode_Check(datatype) else None
    if code_obj is None:
        raise CodecError(f"{kind} '{name}': unknown datatype {datatype!r}")
    code = code_obj
    rec.code = code

    shape = _attr(t, cls, L, 2, "shape")
    rec.dims_lo = pl.dims.n
    for dim in shape:
        if not PyLong_CheckExact(dim):
            dim = _shape_index(dim, shape, kind, name)
        d = PyLong_AsLongLongAndOverflow(dim, &overflow)
        if overflow:
            raise CodecError(f"{kind} '{name}': dimension {dim} does not fit in int64")
        (<int64_t*>_vpush(&pl.dims))[0] = d
        shape_len += _vsize(<uint64_t>d)
        if d < 0:
            negative = True
        elif count != 0 and not too_big:
            if d == 0:
                count = 0
            elif (count | d) >> 29 and count > INT64_MAX // d:   # (division only for big values)
                too_big = True
            else:
                count *= d
    rec.dims_hi = pl.dims.n
    rec.shape_len = shape_len
    _plan_params(pl, _attr(t, cls, L, 4, "parameters"), &rec.params_lo, &rec.params_hi,
                 &rec.params_size, kind, name)

    data = _attr(t, cls, L, 3, "data")
    if data is None:
        rec.data_kind = 0
        rec.raw_len = 0
    else:
        if negative or too_big:
            raise CodecError(f"{kind} '{name}': invalid shape {list(shape)} for tensor data")
        if code == DT_BYTES:
            _plan_bytes_data(rec, data, count, kind, name)
        else:
            _plan_array_data(rec, data, count, kind, name)

    body = rec.params_size + _ld(_DT_LEN[code])
    if rec.name.n:
        body += _ld(rec.name.n)
    if shape_len:
        body += _ld(shape_len)
    rec.body_len = body
    return 0


cdef int _plan_array_data(TensorRec* rec, object data, int64_t count, str kind,
                          object name) except -1:
    """Hold a buffer export of a fixed-size tensor's data (made C-contiguous if needed)."""
    expected = <object>PyTuple_GET_ITEM(_DT_NUMPY, rec.code)
    if not isinstance(data, _ndarray):
        try:
            data = np.asarray(data, dtype=expected)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(
                f"{kind} '{name}': data is not {_DT_NAMES[rec.code]}: {exc}") from None
    dt = data.dtype
    if dt is not expected and dt != expected:
        if rec.code == DT_BF16 and dt == _INT16_DTYPE:
            pass   # raw bfloat16 bits in a signed array: the same bytes
        elif dt.kind == expected.kind and dt.itemsize == expected.itemsize:
            data = data.astype(expected)   # copy: byte order swap
        else:
            raise CodecError(
                f"{kind} '{name}': {_DT_NAMES[rec.code]} data must be {expected}, got {dt}")
    try:
        PyObject_GetBuffer(data, &rec.view, PyBUF_SIMPLE)
    except (BufferError, ValueError):       # numpy: "ndarray is not C-contiguous"
        data = np.ascontiguousarray(data)   # copy: not C-contiguous
        PyObject_GetBuffer(data, &rec.view, PyBUF_SIMPLE)
    rec.has_view = True
    rec.data_kind = 1
    rec.raw_len = rec.view.len
    if rec.raw_len // _ITEMSIZE[rec.code] != count:    # (a division: count * size may overflow)
        raise CodecError(
            f"{kind} '{name}': shape has {count} elements but the data has "
            f"{rec.raw_len // _ITEMSIZE[rec.code]}")
    return 0


cdef int _plan_bytes_data(TensorRec* rec, object data, int64_t count, str kind,
                          object name) except -1:
    what = _where(kind, name)
    items = _bytes_items(data)
    if len(items) != count:
        raise CodecError(f"{what}: shape has {count} elements but the data has {len(items)}")
    Py_INCREF(items)
    rec.items = <PyObject*>items
    rec.data_kind = 2
    rec.raw_len = _bytes_items_size(items, what)
    return 0


cdef int _plan_requested(Plan* pl, OutRec* rec, object o) except -1:
    cdef Py_ssize_t body
    name = _attr(o, RequestedOutput, &_L_REQUESTED, 0, "name")
    _plan_str(&rec.name, name, "requested output", None, "name")
    _plan_params(pl, _attr(o, RequestedOutput, &_L_REQUESTED, 1, "parameters"), &rec.params_lo,
                 &rec.params_hi, &rec.params_size, "requested output", name)
    body = rec.params_size
    if rec.name.n:
        body += _ld(rec.name.n)
    rec.body_len = body
    return 0


cdef int _plan_build(Plan* pl, object msg, bint is_request) except -1:
    """Plan ``msg`` (an InferRequest or an InferResponse) and compute its exact size."""
    cdef Py_ssize_t i, size = 0
    cdef TensorRec* t
    cdef type cls = InferRequest if is_request else InferResponse
    cdef Layout* L = &_L_REQUEST if is_request else &_L_RESPONSE
    cdef str kind = "request" if is_request else "response"
    pl.is_request = is_request
    _plan_str(&pl.model_name, _attr(msg, cls, L, 0, "model_name"), kind, None, "model_name")
    _plan_str(&pl.model_version, _attr(msg, cls, L, 1, "model_version"), kind, None,
              "model_version")
    _plan_str(&pl.id, _attr(msg, cls, L, 2, "id"), kind, None, "id")
    _plan_params(pl, _attr(msg, cls, L, 3, "parameters"), &pl.params_lo, &pl.params_hi,
                 &pl.params_size, kind, None)

    tensors = _attr(msg, cls, L, 4, "inputs" if is_request else "outputs")
    if type(tensors) is not list:
        tensors = list(tensors)
    pl.n_tensors = len(tensors)
    if pl.n_tensors:
        pl.tensors = <TensorRec*>PyMem_Calloc(pl.n_tensors, sizeof(TensorRec))
        if pl.tensors == NULL:
            raise MemoryError()
    kind = _INPUT if is_request else _OUTPUT
    for i in range(pl.n_tensors):
        if len(tensors) != pl.n_tensors:    # changed by code that ran while planning
            raise CodecError(f"{kind}s changed while the {kind}s were being encoded")
        _plan_tensor(pl, &pl.tensors[i], tensors[i], kind)
    if is_request:
        outs = _attr(msg, cls, L, 5, "outputs")
        if type(outs) is not list:
            outs = list(outs)
        pl.n_outs = len(outs)
        if pl.n_outs:
            pl.outs = <OutRec*>PyMem_Calloc(pl.n_outs, sizeof(OutRec))
            if pl.outs == NULL:
                raise MemoryError()
        for i in range(pl.n_outs):
            if len(outs) != pl.n_outs:
                raise CodecError("requested outputs changed while they were being encoded")
            _plan_requested(pl, &pl.outs[i], outs[i])

    if pl.model_name.n:
        size += _ld(pl.model_name.n)
    if pl.model_version.n:
        size += _ld(pl.model_version.n)
    if pl.id.n:
        size += _ld(pl.id.n)
    size += pl.params_size
    for i in range(pl.n_tensors):
        t = &pl.tensors[i]
        size += _ld(t.body_len)
        if t.data_kind or not is_request:
            size += _ld(t.raw_len)
    for i in range(pl.n_outs):
        size += _ld(pl.outs[i].body_len)
    pl.size = size
    return 0


cdef char* _write_params(Plan* pl, char* p, Py_ssize_t lo, Py_ssize_t hi, uchar tag) noexcept:
    cdef ParamRec* recs = <ParamRec*>_vdata(&pl.params)
    cdef ParamRec* rec
    cdef Py_ssize_t i
    for i in range(lo, hi):
        rec = &recs[i]
        p = _whead(p, tag, rec.entry_len)
        p = _wbytes(p, 0x0A, rec.key.p, rec.key.n)
        p = _whead(p, 0x12, rec.value_len)
        # InferParameter tag: double is fixed64 (1), string is length-delimited (2), others varint
        p[0] = <char>((rec.field << 3) | (1 if rec.field == 4 else 2 if rec.field == 3 else 0))
        p += 1
        if rec.field == 4:
            memcpy(p, &rec.d, 8)
            p += 8
        elif rec.field == 3:
            p = _wcopy(_wvarint(p, <uint64_t>rec.s.n), rec.s.p, rec.s.n)
        else:
            p = _wvarint(p, rec.u)
    return p


cdef char* _plan_write(Plan* pl, char* p) noexcept:
    """Write the planned message at ``p`` (exactly ``pl.size`` bytes); returns its end."""
    cdef Py_ssize_t i, k
    cdef TensorRec* t
    cdef OutRec* o
    cdef int64_t* dv = <int64_t*>_vdata(&pl.dims)
    cdef uchar raw_tag = 0x3A if pl.is_request else 0x32    # raw_input_contents=7 / raw_output_contents=6
    if pl.model_name.n:
        p = _wbytes(p, 0x0A, pl.model_name.p, pl.model_name.n)
    if pl.model_version.n:
        p = _wbytes(p, 0x12, pl.model_version.p, pl.model_version.n)
    if pl.id.n:
        p = _wbytes(p, 0x1A, pl.id.p, pl.id.n)
    p = _write_params(pl, p, pl.params_lo, pl.params_hi, 0x22)
    for i in range(pl.n_tensors):
        t = &pl.tensors[i]
        p = _whead(p, 0x2A, t.body_len)
        if t.name.n:
            p = _wbytes(p, 0x0A, t.name.p, t.name.n)
        p = _wbytes(p, 0x12, _DT_C[t.code], _DT_LEN[t.code])
        if t.shape_len:
            p = _whead(p, 0x1A, t.shape_len)
            for k in range(t.dims_lo, t.dims_hi):
                p = _wvarint(p, <uint64_t>dv[k])
        p = _write_params(pl, p, t.params_lo, t.params_hi, 0x22)
    for i in range(pl.n_outs):
        o = &pl.outs[i]
        p = _whead(p, 0x32, o.body_len)
        if o.name.n:
            p = _wbytes(p, 0x0A, o.name.p, o.name.n)
        p = _write_params(pl, p, o.params_lo, o.params_hi, 0x12)
    for i in range(pl.n_tensors):
        t = &pl.tensors[i]
        if t.data_kind == 0:
            if not pl.is_request:
                p = _whead(p, raw_tag, 0)   # output in shared memory: empty entry, as Triton
            continue
        p = _whead(p, raw_tag, t.raw_len)
        if t.data_kind == 1:
            # copy: the tensor's bytes into the message (the one copy of each tensor)
            if t.raw_len >= NOGIL_COPY:
                with nogil:
                    memcpy(p, t.view.buf, t.raw_len)
            else:
                memcpy(p, t.view.buf, t.raw_len)
            p += t.raw_len
        else:
            p = _write_bytes_items(p, <list>t.items)
    return p


cdef list _bytes_items(object data):
    """The elements of a BYTES tensor as a flat list of ``bytes`` (str -> UTF-8)."""
    cdef Py_ssize_t i, n
    if not isinstance(data, _ndarray):
        data = np.asarray(data, dtype=object)
    if data.dtype.kind in "OSU":
        items = data.ravel().tolist() if data.ndim != 1 else data.tolist()
    else:
        items = list(data.flat)   # numpy scalars: str() of each, as tritonclient does
    n = len(items)
    for i in range(n):
        v = items[i]
        if PyBytes_Check(v):
            continue
        if isinstance(v, str):
            items[i] = (<str>v).encode("utf-8")      # copy: str -> UTF-8
        elif isinstance(v, (bytearray, memoryview)):
            items[i] = bytes(v)                      # copy
        else:
            items[i] = str(v).encode("utf-8")
    return items


cdef Py_ssize_t _bytes_items_size(list items, str what) except -1:
    cdef Py_ssize_t total = 0, n
    for v in items:
        n = PyBytes_GET_SIZE(v)
        if n > 0xFFFFFFFF:
            raise CodecError(f"{what}: BYTES element of {n} bytes is over 4 GiB")
        total += 4 + n
    return total


cdef char* _write_bytes_items(char* p, list items) noexcept:
    cdef uint32_t n
    for v in items:
        n = <uint32_t>PyBytes_GET_SIZE(v)
        memcpy(p, &n, 4)
        memcpy(p + 4, PyBytes_AS_STRING(v), n)      # copy: each element's bytes
        p += 4 + n
    return p


cdef bytes _encode(object msg, bint is_request, str error_message):
    """Plan, allocate ONE bytes object of the exact size, write.

    With ``error_message`` not None the message is wrapped as a
    ModelStreamInferResponse {error_message=1, infer_response=2} (``msg`` may then be None).
    """
    cdef Plan pl
    cdef StrRef err
    cdef Py_ssize_t size
    cdef char* start = NULL
    cdef char* p = NULL
    _plan_init(&pl)
    err.owner = NULL
    try:
        if error_message is None:
            _plan_build(&pl, msg, is_request)
            size = pl.size
        else:
            size = 0
            _plan_str(&err, error_message, "stream response", None, "error_message")
            if err.n:
                size += _ld(err.n)
            if msg is not None:
                _plan_build(&pl, msg, False)
                size += _ld(pl.size)
        out = PyBytes_FromStringAndSize(NULL, size)
        start = p = PyBytes_AS_STRING(out)
        if error_message is None:
            p = _plan_write(&pl, p)
        else:
            if err.n:
                p = _wbytes(p, 0x0A, err.p, err.n)
            if msg is not None:
                p = _whead(p, 0x12, pl.size)
                p = _plan_write(&pl, p)
    finally:
        _plan_free(&pl)
        _str_release(&err)
    if p - start != size:   # pragma: no cover - would be a bug in the sizing code
        raise AssertionError(f"codec wrote {p - start} bytes, planned {size}")
    return out


def encode_infer_response(response):
    """Serialize an InferResponse as ModelInferResponse wire bytes (all data in raw_output_contents)."""
    return _encode(response, False, None)


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

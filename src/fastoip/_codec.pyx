# cython: language_level=3
"""Native codec for KServe V2 / Triton gRPC messages (package ``inference``).

Reads ModelInferRequest / ModelInferResponse wire bytes directly into the
objects of :mod:`fastoip.types` and writes them back, with no protobuf objects
in between.

Invariants
----------
* Reading: every varint is at most 10 bytes and must fit in 64 bits (a 10th
  byte above 1 is rejected, which protobuf silently truncates); tags are at
  most 5 bytes and fit in 32 bits; field number 0, wire types 6/7 and groups
  (wire types 3/4, which protobuf would skip as unknown fields) raise
  CodecError.  Every length is checked against the end of the enclosing
  message before anything is read.  Strings must be valid UTF-8.
* Protobuf semantics: unknown fields and known fields with an unexpected wire
  type are skipped; the last occurrence of a scalar field wins; a repeated
  scalar field may arrive packed or unpacked; a sub-message that occurs twice
  is merged (for ``contents`` the repeated fields of all occurrences are
  concatenated, for a parameter value the last set choice wins); a later map
  entry with the same key replaces the earlier one.
* An InferParameter with no choice set is not put in the parameters dict (a
  later such entry removes an earlier value of the same key).
* Raw tensor data is never copied on decode: an input/output read from
  ``raw_*_contents`` is a read-only numpy view on the received buffer.  Typed
  ``contents`` and BYTES tensors are decoded into new arrays.
* Nothing is allocated from a declared shape before the shape has been checked
  against the bytes actually present: element counts are computed with
  overflow checks, fixed-size raw data must be exactly count * itemsize bytes,
  BYTES needs at least 4 bytes per declared element before the object array is
  created, typed contents are counted before the array is allocated.
* Writing: the exact size is computed first, then the message is written into
  ONE ``bytes`` object; fields are written in field-number order and empty
  strings/maps are skipped, as protobuf's serializer does, so the bytes equal
  ``SerializeToString()`` of the same content (with the same map order).
* All Python objects whose memory is read while writing are kept alive by the
  plan (strong references or held buffer exports) until the write is done.
* The host is little-endian (checked at import): tensor bytes on the wire are
  little-endian and are copied or viewed as they are.
"""

import sys

import numpy as np

cimport cython

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from .datatypes import NUMPY_DTYPES
from .errors import CodecError
from .types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    UInt64,
)

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    void* PyMem_Calloc(size_t nelem, size_t elsize)
    bint PyUnicode_Check(object o)
    bint PyDict_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    bint PyFloat_CheckExact(object o)
    bint PyUnicode_CheckExact(object o)
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

_DT_NAMES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
             "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES")
_DT_NAMES_B = tuple(s.encode("ascii") for s in _DT_NAMES)
_DT_CODE = {name: i for i, name in enumerate(_DT_NAMES)}
_DT_NUMPY = tuple(NUMPY_DTYPES[name] for name in _DT_NAMES)
_FIELD_NAMES = ("", "bool_contents", "int_contents", "int64_contents", "uint_contents",
                "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents")

cdef int _i
for _i in range(N_DT):
    _DT_C[_i] = _DT_NAMES_B[_i]
    _DT_LEN[_i] = len(_DT_NAMES_B[_i])
    _ITEMSIZE[_i] = 0 if _i == DT_BYTES else _DT_NUMPY[_i].itemsize
for _i, _f in enumerate((F_BOOL, F_UINT, F_UINT, F_UINT, F_UINT64, F_INT, F_INT, F_INT,
                         F_INT64, 0, F_FP32, F_FP64, 0, F_BYTES)):
    _CONTENTS_FIELD[_i] = _f

cdef object _OBJECT_DTYPE = np.dtype(object)
cdef object _ndarray = np.ndarray
cdef object _np_empty = np.empty
cdef object _np_array = np.array
cdef object _memoryview = memoryview

# Copies of at least this many bytes are done with the GIL released.
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

cdef struct Vec:
    char* heap          # NULL while the items fit in ``small``
    Py_ssize_t n
    Py_ssize_t cap
    Py_ssize_t itemsize
    char small[512]

cdef inline void _vinit(Vec* v, Py_ssize_t itemsize) noexcept nogil:
    v.heap = NULL
    v.n = 0
    v.itemsize = itemsize
    v.cap = 512 // itemsize

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
    cdef const uchar* p = r.p
    cdef int i = 0
    while p < r.end and i < 10:
        if p[0] < 0x80:
            break
        p += 1
        i += 1
    if p >= r.end:
        raise CodecError(f"truncated message: varint at byte {r.p - r.base} runs past the end")
    raise CodecError(f"malformed varint at byte {r.p - r.base}: longer than 10 bytes or over 64 bits")


cdef inline int _read_varint(Reader* r, uint64_t* out) except -1:
    cdef const uchar* q = _varint(r.p, r.end, out)
    if q == NULL:
        return _varint_error(r)
    r.p = q
    return 0


cdef inline int _read_tag(Reader* r, uint32_t* field, int* wt) except -1:
    cdef uint64_t tag
    cdef const uchar* q
    if r.p < r.end and r.p[0] < 0x80:
        tag = r.p[0]
        r.p += 1
    else:
        q = _varint(r.p, r.end, &tag)
        if q == NULL:
            return _varint_error(r)
        if q - r.p > 5 or tag > 0xFFFFFFFFu:
            raise CodecError(f"malformed tag at byte {r.p - r.base}")
        r.p = q
    field[0] = <uint32_t>(tag >> 3)
    wt[0] = <int>(tag & 7)
    if field[0] == 0:
        raise CodecError(f"invalid field number 0 at byte {r.p - r.base}")
    if wt[0] == 3 or wt[0] == 4:
        raise CodecError(
            f"protobuf groups are not supported (field {field[0]}, wire type {wt[0]}, "
            f"byte {r.p - r.base})")
    if wt[0] > 5:
        raise CodecError(f"invalid wire type {wt[0]} for field {field[0]} at byte {r.p - r.base}")
    return 0


cdef inline int _read_len(Reader* r, Reader* sub) except -1:
    """Read a length-delimited field's header; ``sub`` spans its payload, ``r`` moves past it."""
    cdef uint64_t n = 0
    _read_varint(r, &n)
    if n > <uint64_t>(r.end - r.p):
        raise CodecError(
            f"truncated message: field of {n} bytes at byte {r.p - r.base} runs past the end "
            f"({r.end - r.p} bytes left)")
    sub.base = r.base
    sub.p = r.p
    sub.end = r.p + n
    r.p = sub.end
    return 0


cdef inline int _need(Reader* r, Py_ssize_t n) except -1:
    if r.end - r.p < n:
        raise CodecError(f"truncated message: {n}-byte value at byte {r.p - r.base} runs past the end")
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


cdef inline object _str_from(const uchar* p, Py_ssize_t n, str what):
    """A str from UTF-8 bytes (copy: str objects own their text)."""
    if n == 0:
        return ""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        raise CodecError(f"{what} is not valid UTF-8") from None


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
        # the str came from valid UTF-8, so this returns its cached UTF-8 and cannot fail
        cp = PyUnicode_AsUTF8AndSize(<object>entry, &cn)
        if cn == n and memcmp(cp, p, n) == 0:
            return <object>entry
    s = _str_from(p, n, what)
    Py_INCREF(s)
    _name_cache[h] = <PyObject*>s
    if entry != NULL:
        Py_DECREF(<object>entry)
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
    cdef int64_t d, count = 1
    cdef bint negative = False, zero = False, too_big = False
    cdef Py_ssize_t i
    cdef int64_t* dv
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

    # Shape -> tuple; element count with an overflow check before each multiply.
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
            if count > INT64_MAX // d:
                too_big = True
            else:
                count *= d
    if negative:
        raise CodecError(f"{kind} '{name}': negative dimension in shape {_shape_str(shape)}")
    if too_big:
        raise CodecError(f"{kind} '{name}': shape {_shape_str(shape)} has too many elements")
    if zero:
        count = 0
    if code < 0:
        raise CodecError(f"{kind} '{name}': unknown datatype '{datatype}'")
    info.code = code
    info.count = count
    info.shm = "shared_memory_region" in params
    if cls is InferInput:
        return _make_tensor(cls, &_L_INPUT, name, datatype, shape, params)
    return _make_tensor(cls, &_L_OUTPUT, name, datatype, shape, params)


# --------------------------------------------------------------------------- #
# Tensor data                                                                  #
# --------------------------------------------------------------------------- #

cdef object _bytes_array(const uchar* p, Py_ssize_t n, int64_t count, str what):
    """BYTES framing (uint32 LE length + bytes per element) -> 1-D object array of bytes."""
    cdef const uchar* end = p + n
    cdef uint32_t ln
    cdef Py_ssize_t i
    if count < 0:
        raise CodecError(f"{what}: negative BYTES element count {count}")
    if count > n // 4:
        raise CodecError(
            f"{what}: {count} BYTES elements need at least {4 * count} bytes, got {n}")
    lst = PyList_New(<Py_ssize_t>count)
    for i in range(<Py_ssize_t>count):
        if end - p < 4:
            raise CodecError(f"{what}: BYTES element {i}: truncated length prefix")
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
        raise CodecError(f"{what}: {end - p} bytes left over after {count} BYTES elements")
    return _np_array(lst, _OBJECT_DTYPE)   # copy of the element pointers into the array


cdef object _raw_tensor(object base, const uchar* start, Span span, TensorInfo* info,
                        object tensor, str kind):
    """A tensor from its raw entry: a read-only zero-copy view (BYTES: new object array)."""
    cdef int64_t count = info.count
    cdef int isz = _ITEMSIZE[info.code]
    shape = tensor.shape
    if info.code == DT_BYTES:
        arr = _bytes_array(start + span.off, span.n, count, f"{kind} '{tensor.name}'")
        return arr.reshape(shape)
    if count > span.n // isz or count * isz != span.n:
        raise CodecError(
            f"{kind} '{tensor.name}': expected {count * isz} bytes for {_DT_NAMES[info.code]} "
            f"{_shape_str(shape)}, got {span.n}")
    # No copy: a view on the received buffer (read-only because the buffer is).
    return _ndarray(shape, _DT_NUMPY[info.code], base, span.off)


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
        return _np_array(lst, _OBJECT_DTYPE).reshape(shape)
    arr = _np_empty(<Py_ssize_t>info.count, _DT_NUMPY[info.code])
    PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE)
    try:
        idx = 0
        for i in range(info.span_lo, info.span_hi):
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
            j = 0
            for i in range(n_tensors):
                t = tensors[i]
                if info[i].shm:
                    continue
                if info[i].has_contents:
                    t.data = _typed_tensor(start, <Span*>_vdata(&spans), &info[i], t, kind)
                else:
                    t.data = _raw_tensor(base, start, span[j], &info[i], t, kind)
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
    """Response rule: one raw entry per output (empty for a shared-memory output), or none."""
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
            if raw[i].n == 0 and info[i].shm:
                continue    # written to shared memory: no data here
            t.data = _raw_tensor(base, start, raw[i], &info[i], t, "output")
    else:
        for i in range(n):
            t = outputs[i]
            if info[i].shm and not info[i].has_contents:
                continue
            t.data = _typed_tensor(start, spans, &info[i], t, "output")
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
    cdef int64_t n = count
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
    const char* p
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
    PyObject* items         # borrowed; a strong reference is in _Plan.keep
    bint has_view
    Py_buffer view

cdef struct OutRec:
    StrRef name
    Py_ssize_t params_lo, params_hi, params_size
    Py_ssize_t body_len


@cython.final
@cython.freelist(8)
cdef class _Plan:
    """Sizes and borrowed pointers for one message; written by ``write`` in one pass."""

    cdef list keep              # strong references to every object whose memory is borrowed
    cdef bint is_request
    cdef StrRef model_name, model_version, id
    cdef Py_ssize_t params_lo, params_hi, params_size
    cdef TensorRec* tensors
    cdef Py_ssize_t n_tensors
    cdef OutRec* outs
    cdef Py_ssize_t n_outs
    cdef Vec params             # ParamRec
    cdef Vec dims               # int64_t
    cdef Py_ssize_t size
    cdef str ctx_kind           # what is being planned, for error messages only
    cdef object ctx_name

    def __cinit__(self):
        self.keep = []
        _vinit(&self.params, sizeof(ParamRec))
        _vinit(&self.dims, sizeof(int64_t))

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.tensors != NULL:
            for i in range(self.n_tensors):
                if self.tensors[i].has_view:
                    PyBuffer_Release(&self.tensors[i].view)
            PyMem_Free(self.tensors)
        if self.outs != NULL:
            PyMem_Free(self.outs)
        _vfree(&self.params)
        _vfree(&self.dims)

    cdef str _where(self):
        if self.ctx_name is None:
            return self.ctx_kind
        return f"{self.ctx_kind} '{self.ctx_name}'"

    cdef int _str(self, object s, StrRef* ref, str what) except -1:
        if not PyUnicode_Check(s):
            raise CodecError(f"{self._where()}: {what} must be a str, got {type(s).__name__}")
        self.keep.append(s)
        try:
            ref.p = PyUnicode_AsUTF8AndSize(s, &ref.n)
        except UnicodeEncodeError:
            raise CodecError(f"{self._where()}: {what} cannot be encoded as UTF-8") from None
        return 0

    cdef int _params(self, object params, Py_ssize_t* lo, Py_ssize_t* hi,
                     Py_ssize_t* size) except -1:
        """Plan a parameters map; ``size`` is the total of its map-entry fields."""
        cdef ParamRec* rec
        cdef Py_ssize_t total = 0
        lo[0] = self.params.n
        if params:
            if not PyDict_CheckExact(params):
                params = dict(params)
            self.keep.append(params)
            for key, value in (<dict>params).items():
                rec = <ParamRec*>_vpush(&self.params)
                if not self._param(rec, key, value):
                    self.params.n -= 1
                    continue
                total += _ld(rec.entry_len)
        hi[0] = self.params.n
        size[0] = total
        return 0

    cdef bint _param(self, ParamRec* rec, object key, object value) except -1:
        cdef int overflow = 0
        cdef long long iv
        self._str(key, &rec.key, "parameter name")
        self.keep.append(value)
        t = type(value)
        if t is bool:
            rec.field = 1
            rec.u = 1 if value else 0
        elif t is int:
            rec.field = 2
            iv = PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                raise CodecError(f"{self._where()} parameter '{key}': {value} does not fit in int64")
            rec.u = <uint64_t>iv
        elif t is float:
            rec.field = 4
            rec.d = PyFloat_AsDouble(value)
        elif t is str:
            rec.field = 3
            self._str(value, &rec.s, "parameter value")
        elif isinstance(value, UInt64):
            rec.field = 5
            try:
                rec.u = PyLong_AsUnsignedLongLong(value)
            except OverflowError:
                raise CodecError(f"{self._where()} parameter '{key}': {value} does not fit in uint64") from None
        elif value is None:
            return False
        elif isinstance(value, (bool, np.bool_)):
            return self._param(rec, key, bool(value))
        elif isinstance(value, (int, np.integer)):
            return self._param(rec, key, int(value))
        elif isinstance(value, (float, np.floating)):
            return self._param(rec, key, float(value))
        elif isinstance(value, str):
            return self._param(rec, key, str(value))
        else:
            raise CodecError(
                f"{self._where()} parameter '{key}': unsupported value type {type(value).__name__}")
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

    cdef int _tensor(self, object t, TensorRec* rec, str kind) except -1:
        cdef int64_t d, count = 1
        cdef Py_ssize_t shape_len = 0, body
        cdef int overflow = 0
        cdef bint negative = False, too_big = False
        cdef int code
        cdef type cls = InferInput if kind is _INPUT else InferOutput
        cdef Layout* L = &_L_INPUT if kind is _INPUT else &_L_OUTPUT
        name = _attr(t, cls, L, 0, "name")
        self.ctx_kind = kind
        self.ctx_name = name
        self._str(name, &rec.name, "name")
        datatype = _attr(t, cls, L, 1, "datatype")
        code = _DT_CODE.get(datatype, -1) if PyUnicode_Check(datatype) else -1
        if code < 0:
            raise CodecError(f"{kind} '{name}': unknown datatype {datatype!r}")
        rec.code = code
        shape = _attr(t, cls, L, 2, "shape")
        self.keep.append(shape)
        rec.dims_lo = self.dims.n
        for dim in shape:
            try:
                d = PyLong_AsLongLongAndOverflow(dim, &overflow)
            except TypeError:
                raise CodecError(f"{kind} '{name}': shape {shape!r} must hold integers") from None
            if overflow:
                raise CodecError(f"{kind} '{name}': dimension {dim} does not fit in int64")
            (<int64_t*>_vpush(&self.dims))[0] = d
            shape_len += _vsize(<uint64_t>d)
            if d < 0:
                negative = True
            elif count != 0 and not too_big:
                if d == 0:
                    count = 0
                elif count > INT64_MAX // d:
                    too_big = True
                else:
                    count *= d
        rec.dims_hi = self.dims.n
        rec.shape_len = shape_len
        self._params(_attr(t, cls, L, 4, "parameters"), &rec.params_lo, &rec.params_hi, &rec.params_size)

        data = _attr(t, cls, L, 3, "data")
        if data is None:
            rec.data_kind = 0
            rec.raw_len = 0
        else:
            if negative or too_big:
                raise CodecError(f"{kind} '{name}': invalid shape {list(shape)} for tensor data")
            if code == DT_BYTES:
                self._bytes_data(data, rec, count)
            else:
                self._array_data(data, rec, count)

        body = rec.params_size
        if rec.name.n:
            body += _ld(rec.name.n)
        body += _ld(_DT_LEN[code])
        if shape_len:
            body += _ld(shape_len)
        rec.body_len = body
        return 0

    cdef int _array_data(self, object data, TensorRec* rec, int64_t count) except -1:
        expected = _DT_NUMPY[rec.code]
        if not isinstance(data, _ndarray):
            data = np.asarray(data, dtype=expected)
        dt = data.dtype
        if dt is not expected and dt != expected:
            if rec.code == DT_BF16 and dt == np.dtype("<i2"):
                pass   # raw bfloat16 bits in a signed array: same bytes
            elif dt.kind == expected.kind and dt.itemsize == expected.itemsize:
                data = data.astype(expected)   # copy: byte order swap
            else:
                raise CodecError(
                    f"{self._where()}: {_DT_NAMES[rec.code]} data must be {expected}, got {dt}")
        try:
            PyObject_GetBuffer(data, &rec.view, PyBUF_SIMPLE)
        except BufferError:
            data = np.ascontiguousarray(data)   # copy: not C-contiguous
            PyObject_GetBuffer(data, &rec.view, PyBUF_SIMPLE)
        rec.has_view = True
        rec.data_kind = 1
        rec.raw_len = rec.view.len
        if rec.raw_len != count * _ITEMSIZE[rec.code]:
            raise CodecError(
                f"{self._where()}: shape has {count} elements but the data has "
                f"{rec.raw_len // _ITEMSIZE[rec.code]}")
        return 0

    cdef int _bytes_data(self, object data, TensorRec* rec, int64_t count) except -1:
        what = self._where()
        items = _bytes_items(data, what)
        self.keep.append(items)
        if len(items) != count:
            raise CodecError(f"{what}: shape has {count} elements but the data has {len(items)}")
        rec.items = <PyObject*>items
        rec.data_kind = 2
        rec.raw_len = _bytes_items_size(items, what)
        return 0

    cdef int _requested(self, object o, OutRec* rec) except -1:
        cdef Py_ssize_t body
        name = _attr(o, RequestedOutput, &_L_REQUESTED, 0, "name")
        self.ctx_kind = "requested output"
        self.ctx_name = name
        self._str(name, &rec.name, "name")
        self._params(_attr(o, RequestedOutput, &_L_REQUESTED, 1, "parameters"), &rec.params_lo, &rec.params_hi, &rec.params_size)
        body = rec.params_size
        if rec.name.n:
            body += _ld(rec.name.n)
        rec.body_len = body
        return 0

    cdef int build(self, object msg, bint is_request) except -1:
        cdef Py_ssize_t i, size = 0
        cdef TensorRec* t
        self.is_request = is_request
        self.ctx_kind = "request" if is_request else "response"
        cdef type cls = InferRequest if is_request else InferResponse
        cdef Layout* L = &_L_REQUEST if is_request else &_L_RESPONSE
        self._str(_attr(msg, cls, L, 0, "model_name"), &self.model_name, "model_name")
        self._str(_attr(msg, cls, L, 1, "model_version"), &self.model_version, "model_version")
        self._str(_attr(msg, cls, L, 2, "id"), &self.id, "id")
        self._params(_attr(msg, cls, L, 3, "parameters"), &self.params_lo, &self.params_hi,
                     &self.params_size)
        tensors = list(_attr(msg, cls, L, 4, "inputs" if is_request else "outputs"))
        self.keep.append(tensors)
        self.n_tensors = len(tensors)
        if self.n_tensors:
            self.tensors = <TensorRec*>PyMem_Calloc(self.n_tensors, sizeof(TensorRec))
            if self.tensors == NULL:
                raise MemoryError()
        kind = _INPUT if is_request else _OUTPUT
        for i in range(self.n_tensors):
            self._tensor(tensors[i], &self.tensors[i], kind)
        if is_request:
            outs = list(_attr(msg, cls, L, 5, "outputs"))
            self.keep.append(outs)
            self.n_outs = len(outs)
            if self.n_outs:
                self.outs = <OutRec*>PyMem_Calloc(self.n_outs, sizeof(OutRec))
                if self.outs == NULL:
                    raise MemoryError()
            for i in range(self.n_outs):
                self._requested(outs[i], &self.outs[i])

        if self.model_name.n:
            size += _ld(self.model_name.n)
        if self.model_version.n:
            size += _ld(self.model_version.n)
        if self.id.n:
            size += _ld(self.id.n)
        size += self.params_size
        for i in range(self.n_tensors):
            t = &self.tensors[i]
            size += _ld(t.body_len)
            if t.data_kind or not is_request:
                size += _ld(t.raw_len)
        for i in range(self.n_outs):
            size += _ld(self.outs[i].body_len)
        self.size = size
        return 0

    cdef char* _write_params(self, char* p, Py_ssize_t lo, Py_ssize_t hi, uchar tag) noexcept:
        cdef ParamRec* recs = <ParamRec*>_vdata(&self.params)
        cdef ParamRec* rec
        cdef Py_ssize_t i
        for i in range(lo, hi):
            rec = &recs[i]
            p = _whead(p, tag, rec.entry_len)
            p = _wbytes(p, 0x0A, rec.key.p, rec.key.n)
            p = _whead(p, 0x12, rec.value_len)
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

    cdef char* write(self, char* p) noexcept:
        """Write the message at ``p`` (exactly ``self.size`` bytes); returns the end."""
        cdef Py_ssize_t i, k
        cdef TensorRec* t
        cdef OutRec* o
        cdef int64_t* dv = <int64_t*>_vdata(&self.dims)
        cdef uchar raw_tag = 0x3A if self.is_request else 0x32
        if self.model_name.n:
            p = _wbytes(p, 0x0A, self.model_name.p, self.model_name.n)
        if self.model_version.n:
            p = _wbytes(p, 0x12, self.model_version.p, self.model_version.n)
        if self.id.n:
            p = _wbytes(p, 0x1A, self.id.p, self.id.n)
        p = self._write_params(p, self.params_lo, self.params_hi, 0x22)
        for i in range(self.n_tensors):
            t = &self.tensors[i]
            p = _whead(p, 0x2A, t.body_len)
            if t.name.n:
                p = _wbytes(p, 0x0A, t.name.p, t.name.n)
            p = _wbytes(p, 0x12, _DT_C[t.code], _DT_LEN[t.code])
            if t.shape_len:
                p = _whead(p, 0x1A, t.shape_len)
                for k in range(t.dims_lo, t.dims_hi):
                    p = _wvarint(p, <uint64_t>dv[k])
            p = self._write_params(p, t.params_lo, t.params_hi, 0x22)
        for i in range(self.n_outs):
            o = &self.outs[i]
            p = _whead(p, 0x32, o.body_len)
            if o.name.n:
                p = _wbytes(p, 0x0A, o.name.p, o.name.n)
            p = self._write_params(p, o.params_lo, o.params_hi, 0x12)
        for i in range(self.n_tensors):
            t = &self.tensors[i]
            if t.data_kind == 0:
                if not self.is_request:
                    p = _whead(p, raw_tag, 0)   # shared-memory output: empty entry, as Triton
                continue
            p = _whead(p, raw_tag, t.raw_len)
            if t.data_kind == 1:
                # copy: the tensor's bytes into the message (the one copy per tensor)
                if t.raw_len >= NOGIL_COPY:
                    with nogil:
                        memcpy(p, t.view.buf, t.raw_len)
                else:
                    memcpy(p, t.view.buf, t.raw_len)
                p += t.raw_len
            else:
                p = _write_bytes_items(p, <list>t.items)
        return p


cdef list _bytes_items(object data, str what):
    """The elements of a BYTES tensor as a flat list of ``bytes`` (str -> UTF-8)."""
    if not isinstance(data, _ndarray):
        data = np.asarray(data, dtype=object)
    if data.dtype.kind in "OSU":
        items = data.ravel().tolist() if data.ndim != 1 else data.tolist()
    else:
        items = list(data.flat)   # numpy scalars: str() as tritonclient does
    cdef Py_ssize_t i, n = len(items)
    for i in range(n):
        v = items[i]
        if PyBytes_CheckExact(v):
            continue
        if isinstance(v, bytes):
            items[i] = bytes(v)
        elif isinstance(v, str):
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
        # copy: each element's bytes
        memcpy(p + 4, PyBytes_AS_STRING(v), n)
        p += 4 + n
    return p


cdef bytes _encode(object msg, bint is_request):
    cdef _Plan plan = _Plan()
    plan.build(msg, is_request)
    out = PyBytes_FromStringAndSize(NULL, plan.size)
    cdef char* start = PyBytes_AS_STRING(out)
    cdef char* end = plan.write(start)
    if end - start != plan.size:   # pragma: no cover - a bug in the sizing code
        raise AssertionError(f"codec wrote {end - start} bytes, planned {plan.size}")
    return out


def encode_infer_response(response):
    """Serialize an InferResponse as ModelInferResponse wire bytes (all data in raw_output_contents)."""
    return _encode(response, False)


def encode_infer_request(request):
    """Serialize an InferRequest as ModelInferRequest wire bytes (data in raw_input_contents)."""
    return _encode(request, True)


def encode_stream_response(response=None, error_message=""):
    """Serialize a ModelStreamInferResponse: error_message=1 and/or infer_response=2."""
    cdef _Plan plan = None
    cdef StrRef err
    cdef Py_ssize_t size = 0
    cdef char* p
    cdef char* start
    if not PyUnicode_Check(error_message):
        raise CodecError("error_message must be a str")
    try:
        err.p = PyUnicode_AsUTF8AndSize(error_message, &err.n)
    except UnicodeEncodeError:
        raise CodecError("error_message cannot be encoded as UTF-8") from None
    if err.n:
        size += _ld(err.n)
    if response is not None:
        plan = _Plan()
        plan.build(response, False)
        size += _ld(plan.size)
    out = PyBytes_FromStringAndSize(NULL, size)
    start = p = PyBytes_AS_STRING(out)
    if err.n:
        p = _wbytes(p, 0x0A, err.p, err.n)
    if plan is not None:
        p = _whead(p, 0x12, plan.size)
        p = plan.write(p)
    if p - start != size:   # pragma: no cover
        raise AssertionError(f"codec wrote {p - start} bytes, planned {size}")
    return out


def serialize_bytes_tensor(array):
    """The BYTES framing of an array: per element a uint32 LE length then its bytes."""
    items = _bytes_items(array, "BYTES tensor")
    cdef Py_ssize_t size = _bytes_items_size(items, "BYTES tensor")
    out = PyBytes_FromStringAndSize(NULL, size)
    _write_bytes_items(PyBytes_AS_STRING(out), items)
    return out

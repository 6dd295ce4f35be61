# Tensor headers: InferInputTensor / InferOutputTensor (the same field numbers) -> a tensor object without data.

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
        if field == TENSOR_NAME and wt == WT_LEN:
            name = _read_name(r, "input name" if kind is _INPUT else "output name")
        elif field == TENSOR_DATATYPE and wt == WT_LEN:
            _read_len(r, &sub)
            code = _match_dtype(sub.p, sub.end - sub.p)
            if code >= 0:
                datatype = _DT_NAMES[code]   # the interned canonical name
            else:
                datatype = _str_from(sub.p, sub.end - sub.p,
                                     "input datatype" if kind is _INPUT else "output datatype")
        elif field == TENSOR_SHAPE and wt == WT_LEN:  # packed shape
            _read_len(r, &sub)
            while sub.p < sub.end:
                _read_varint(&sub, &v)
                (<int64_t*>_vpush(dims))[0] = <int64_t>v
        elif field == TENSOR_SHAPE and wt == WT_VARINT:  # unpacked shape element
            _read_varint(r, &v)
            (<int64_t*>_vpush(dims))[0] = <int64_t>v
        elif field == TENSOR_PARAMETERS and wt == WT_LEN:
            _read_len(r, &sub)
            if params is None:
                params = {}
            _parse_param_entry(&sub, params)
        elif field == TENSOR_CONTENTS and wt == WT_LEN:
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

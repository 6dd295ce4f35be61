# Tensor data on decode: zero-copy views on raw_*_contents, new arrays from typed ``contents``.

# fastoip_bytes_view (a numpy view whose base is the received buffer) is C: _codec.h, declared in _codec.pxd.


cdef object _bytes_view(bytes base, object shape, object dtype, Py_ssize_t offset):
    """A zero-copy read-only view on ``base[offset:]`` through numpy's C API (several times
    cheaper than calling np.ndarray).  Shape and byte size are already checked."""
    cdef cnp.npy_intp dims[64]
    cdef Py_ssize_t i, nd = len(<tuple>shape)
    for i in range(nd):
        dims[i] = <cnp.npy_intp>(<object>PyTuple_GET_ITEM(shape, i))
    return fastoip_bytes_view(base, dtype, <int>nd, dims, PyBytes_AS_STRING(base) + offset)


cdef object _raw_tensor(object base, const uchar* start, Span span, TensorInfo* info,
                        object tensor, str kind, str model=""):
    """A tensor from its raw entry: a read-only zero-copy view (BYTES: new object array)."""
    cdef int64_t count = info.count
    cdef int isz = _ITEMSIZE[info.code]
    shape = _attr(tensor, InferInput if kind is _INPUT else InferOutput,
                  &_L_INPUT if kind is _INPUT else &_L_OUTPUT, 2, "shape")
    if info.code == DT_BYTES:
        arr = _bytes_array(start + span.off, span.n, count, f"{kind} '{tensor.name}'")
        return arr.reshape(shape)
    if count > span.n // isz or count * isz != span.n:
        if kind is _INPUT:
            # Triton's words first (clients match on them), then the detail.
            raise CodecError(
                f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
                f"Expected {<object>count * isz}, got {span.n} ({_DT_NAMES[info.code]} {_shape_str(shape)})")
        raise CodecError(
            f"{kind} '{tensor.name}': expected {<object>count * isz} bytes for {_DT_NAMES[info.code]} "
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
        if CONTENTS_BOOL <= field <= CONTENTS_UINT64 and wt == WT_VARINT:
            _read_varint(r, &v)
            counts[field] += 1
        elif CONTENTS_BOOL <= field <= CONTENTS_UINT64 and wt == WT_LEN:   # packed varints
            _read_len(r, &sub)
            k = 0
            while sub.p < sub.end:
                _read_varint(&sub, &v)
                k += 1
            counts[field] += k
        elif field == CONTENTS_FP32 and wt == WT_I32:
            _need(r, 4)
            r.p += 4
            counts[field] += 1
        elif field == CONTENTS_FP64 and wt == WT_I64:
            _need(r, 8)
            r.p += 8
            counts[field] += 1
        elif (field == CONTENTS_FP32 or field == CONTENTS_FP64) and wt == WT_LEN:   # packed fixed
            _read_len(r, &sub)
            n = sub.end - sub.p
            k = 4 if field == CONTENTS_FP32 else 8
            if n % k:
                raise CodecError(
                    f"malformed packed {_FIELD_NAMES[field]}: {n} bytes is not a multiple of {k}")
            counts[field] += n // k
        elif field == CONTENTS_BYTES and wt == WT_LEN:
            _read_len(r, &sub)
            counts[field] += 1
        else:
            _skip(r, wt)
    return 0


cdef inline const uchar* _skip_nogil(const uchar* p, const uchar* end, int wt) noexcept nogil:
    cdef uint64_t v = 0
    if wt == WT_VARINT:
        return _varint(p, end, &v)
    if wt == WT_I64:
        return p + 8
    if wt == WT_I32:
        return p + 4
    p = _varint(p, end, &v)     # WT_LEN
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
        if wt == WT_LEN:
            p = _varint(p, end, &ln)
            if p == NULL:
                break
            q = p
            qe = p + ln
            p = qe
            if want == CONTENTS_FP32 or want == CONTENTS_FP64:
                if idx + <Py_ssize_t>(ln // isz) > cap:
                    break
                memcpy(dst + idx * isz, q, ln)     # copy: packed floats
                idx += ln // isz
            else:
                while q != NULL and q < qe and idx < cap:
                    q = _varint(q, qe, &v)
                    if want == CONTENTS_BOOL:
                        dst[idx] = v != 0
                    else:
                        memcpy(dst + idx * isz, &v, isz)
                    idx += 1
        elif wt == WT_VARINT and want <= CONTENTS_UINT64:
            p = _varint(p, end, &v)
            if idx < cap:
                if want == CONTENTS_BOOL:
                    dst[idx] = v != 0
                else:
                    memcpy(dst + idx * isz, &v, isz)
                idx += 1
        elif (wt == WT_I32 and want == CONTENTS_FP32) or (wt == WT_I64 and want == CONTENTS_FP64):
            if idx < cap:
                memcpy(dst + idx * isz, p, isz)
                idx += 1
            p += isz
        else:
            p = _skip_nogil(p, end, wt)
    return idx


cdef object _typed_tensor(const uchar* start, Span* spans, TensorInfo* info, object tensor, str kind):
    """A new array from typed ``contents`` (all occurrences merged, as protobuf does)."""
    cdef Py_ssize_t counts[CONTENTS_FIELD_END]
    cdef Reader r
    cdef Py_ssize_t i, idx
    cdef int f, want = _CONTENTS_FIELD[info.code]
    cdef Py_buffer view
    cdef uint32_t field
    cdef int wt
    cdef uint64_t v = 0
    cdef Reader sub
    cdef int64_t spent = 0
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
    for f in range(<int>CONTENTS_BOOL, <int>CONTENTS_FIELD_END):
        if f != want and counts[f] > 0:
            raise CodecError(
                f"{kind} '{name}': datatype {dt} takes {_FIELD_NAMES[want]}, got {_FIELD_NAMES[f]}")
    if counts[want] != info.count:
        raise CodecError(
            f"{kind} '{name}': {dt} {_shape_str(tensor.shape)} needs {info.count} elements, "
            f"{_FIELD_NAMES[want]} has {counts[want]}")
    shape = tensor.shape
    if want == CONTENTS_BYTES:
        _check_bytes_count(counts[want], f"{kind} '{name}'")
        lst = PyList_New(counts[want])
        idx = 0
        for i in range(info.span_lo, info.span_hi):
            r.base = start
            r.p = start + spans[i].off
            r.end = r.p + spans[i].n
            while r.p < r.end:
                _read_tag(&r, &field, &wt)
                if field == CONTENTS_BYTES and wt == WT_LEN and idx < counts[want]:
                    _read_len(&r, &sub)
                    spent += _element_cost(sub.end - sub.p)
                    if spent > _max_bytes_memory:
                        _over_bytes_memory(spent, f"{kind} '{name}'")
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

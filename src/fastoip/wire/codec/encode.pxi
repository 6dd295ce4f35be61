# Encode InferRequest / InferResponse: plan (size everything, hold every object read), then write one bytes object.

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
    _plan_params(&pl.params, _attr(t, cls, L, 4, "parameters"), &rec.params_lo, &rec.params_hi,
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
    _plan_params(&pl.params, _attr(o, RequestedOutput, &_L_REQUESTED, 1, "parameters"), &rec.params_lo,
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
    _plan_params(&pl.params, _attr(msg, cls, L, 3, "parameters"), &pl.params_lo, &pl.params_hi,
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


cdef char* _plan_write(Plan* pl, char* p) noexcept:
    """Write the planned message at ``p`` (exactly ``pl.size`` bytes); returns its end."""
    return _plan_write_refs(pl, p, -1, NULL)


cdef char* _plan_write_refs(Plan* pl, char* p, Py_ssize_t min_ref, Py_ssize_t* cuts) noexcept:
    """``_plan_write``, except that (``min_ref`` >= 0) the raw data of a buffer tensor of at least
    ``min_ref`` bytes is not written: the position where it belongs goes to ``cuts[i]`` (the caller set
    every entry to -1 first), and the message continues right after its length prefix."""
    cdef Py_ssize_t i, k
    cdef TensorRec* t
    cdef OutRec* o
    cdef int64_t* dv = <int64_t*>_vdata(&pl.dims)
    cdef uchar raw_tag = (_len_tag(REQUEST_RAW_INPUT_CONTENTS) if pl.is_request
                          else _len_tag(RESPONSE_RAW_OUTPUT_CONTENTS))
    # Fields 1-5 have the same numbers in ModelInferRequest and ModelInferResponse (fields.pxi).
    if pl.model_name.n:
        p = _wbytes(p, _len_tag(REQUEST_MODEL_NAME), pl.model_name.p, pl.model_name.n)
    if pl.model_version.n:
        p = _wbytes(p, _len_tag(REQUEST_MODEL_VERSION), pl.model_version.p, pl.model_version.n)
    if pl.id.n:
        p = _wbytes(p, _len_tag(REQUEST_ID), pl.id.p, pl.id.n)
    p = _write_params(&pl.params, p, pl.params_lo, pl.params_hi, _len_tag(REQUEST_PARAMETERS))
    for i in range(pl.n_tensors):
        t = &pl.tensors[i]
        p = _whead(p, _len_tag(REQUEST_INPUTS), t.body_len)     # == RESPONSE_OUTPUTS
        if t.name.n:
            p = _wbytes(p, _len_tag(TENSOR_NAME), t.name.p, t.name.n)
        p = _wbytes(p, _len_tag(TENSOR_DATATYPE), _DT_C[t.code], _DT_LEN[t.code])
        if t.shape_len:
            p = _whead(p, _len_tag(TENSOR_SHAPE), t.shape_len)     # packed
            for k in range(t.dims_lo, t.dims_hi):
                p = _wvarint(p, <uint64_t>dv[k])
        p = _write_params(&pl.params, p, t.params_lo, t.params_hi, _len_tag(TENSOR_PARAMETERS))
    for i in range(pl.n_outs):
        o = &pl.outs[i]
        p = _whead(p, _len_tag(REQUEST_OUTPUTS), o.body_len)
        if o.name.n:
            p = _wbytes(p, _len_tag(REQUESTED_NAME), o.name.p, o.name.n)
        p = _write_params(&pl.params, p, o.params_lo, o.params_hi, _len_tag(REQUESTED_PARAMETERS))
    for i in range(pl.n_tensors):
        t = &pl.tensors[i]
        if t.data_kind == 0:
            if not pl.is_request:
                p = _whead(p, raw_tag, 0)   # output in shared memory: empty entry, as Triton
            continue
        p = _whead(p, raw_tag, t.raw_len)
        if t.data_kind == 1 and min_ref >= 0 and t.raw_len >= min_ref:
            cuts[i] = <Py_ssize_t>p   # the tensor's bytes go out from the array itself
            continue
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
                p = _wbytes(p, _len_tag(STREAM_ERROR_MESSAGE), err.p, err.n)
            if msg is not None:
                p = _whead(p, _len_tag(STREAM_INFER_RESPONSE), pl.size)
                p = _plan_write(&pl, p)
    finally:
        _plan_free(&pl)
        _str_release(&err)
    if p - start != size:   # pragma: no cover - would be a bug in the sizing code
        raise AssertionError(f"codec wrote {p - start} bytes, planned {size}")
    return out


cdef list _encode_parts(object msg, Py_ssize_t min_ref):
    """A response's wire bytes as parts whose concatenation is ``_encode(msg, False, None)``.

    The raw data of every fixed-size output of at least ``min_ref`` bytes is a read-only byte view of
    the output array itself (no copy: a sender writes it from there); everything else is written into
    one bytes object, whose stretches between those views are memoryview slices of it.
    """
    cdef Plan pl
    cdef Py_ssize_t i, size, referenced = 0, at = 0, cut
    cdef Py_ssize_t* cuts = NULL
    cdef char* start = NULL
    cdef char* p = NULL
    cdef list parts = []
    cdef TensorRec* t
    _plan_init(&pl)
    try:
        _plan_build(&pl, msg, False)
        if pl.n_tensors:
            cuts = <Py_ssize_t*>PyMem_Calloc(pl.n_tensors, sizeof(Py_ssize_t))
            if cuts == NULL:
                raise MemoryError()
        for i in range(pl.n_tensors):
            cuts[i] = -1   # written in full (or no data at all) unless _plan_write_refs says otherwise
            t = &pl.tensors[i]
            if t.data_kind == 1 and t.raw_len >= min_ref:
                referenced += t.raw_len
        size = pl.size - referenced
        head = PyBytes_FromStringAndSize(NULL, size)
        start = PyBytes_AS_STRING(head)
        p = _plan_write_refs(&pl, start, min_ref, cuts)
        if p - start != size:   # pragma: no cover - would be a bug in the sizing code
            raise AssertionError(f"codec wrote {p - start} bytes, planned {size}")
        whole = memoryview(head)
        for i in range(pl.n_tensors):
            if cuts[i] == -1:
                continue
            t = &pl.tensors[i]
            cut = <Py_ssize_t>(<char*>cuts[i] - start)
            if cut > at:
                parts.append(whole[at:cut])
            at = cut
            # no copy: the output array's own bytes (the buffer export's owner keeps them alive)
            parts.append(memoryview(<object>t.view.obj).cast("B"))
        if size > at or not parts:
            parts.append(whole[at:] if at else head)
    finally:
        PyMem_Free(cuts)
        _plan_free(&pl)
    return parts

# Decode ModelInferRequest / ModelInferResponse wire bytes into InferRequest / InferResponse, tensors attached.

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
            # Fields 1-5 have the same numbers in both messages (fields.pxi); every field is length-delimited.
            if wt != WT_LEN:
                _skip(&r, wt)
            elif field == REQUEST_MODEL_NAME:
                model_name = _read_name(&r, "model_name")
            elif field == REQUEST_MODEL_VERSION:
                model_version = _read_name(&r, "model_version")
            elif field == REQUEST_ID:
                request_id = _read_str(&r, "id")
            elif field == REQUEST_PARAMETERS:
                _read_len(&r, &sub)
                _parse_param_entry(&sub, params)
            elif field == REQUEST_INPUTS:     # == RESPONSE_OUTPUTS
                _read_len(&r, &sub)
                info = <TensorInfo*>_vpush(&infos)
                tensors.append(_parse_tensor(&sub, kind, tensor_cls, &spans, &dims, info))
            elif field == REQUEST_OUTPUTS and not response:
                _read_len(&r, &sub)
                requested.append(_parse_requested_output(&sub))
            elif ((field == RESPONSE_RAW_OUTPUT_CONTENTS and response)
                  or (field == REQUEST_RAW_INPUT_CONTENTS and not response)):
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
                              _raw_tensor(base, start, span[j], &info[i], t, kind, model_name))
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
        if field == REQUESTED_NAME and wt == WT_LEN:
            name = _read_name(r, "output name")
        elif field == REQUESTED_PARAMETERS and wt == WT_LEN:
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

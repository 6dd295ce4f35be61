# Parameters (map<string, InferParameter>) both ways: parsing an entry, planning and writing one.

cdef object _UNSET = object()


cdef object _parse_param_value(Reader* r, object current):
    """InferParameter: merge one occurrence into ``current`` (the last set choice wins)."""
    cdef uint32_t field
    cdef int wt
    cdef uint64_t v = 0
    while r.p < r.end:
        _read_tag(r, &field, &wt)
        if field == PARAM_BOOL and wt == WT_VARINT:
            _read_varint(r, &v)
            current = v != 0
        elif field == PARAM_INT64 and wt == WT_VARINT:
            _read_varint(r, &v)
            current = <int64_t>v
        elif field == PARAM_STRING and wt == WT_LEN:
            current = _read_str(r, "string_param")
        elif field == PARAM_DOUBLE and wt == WT_I64:
            _need(r, 8)
            current = _le_double(r.p)
            r.p += 8
        elif field == PARAM_UINT64 and wt == WT_VARINT:
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
        if field == ENTRY_KEY and wt == WT_LEN:
            key = _read_name(r, "parameter name")
        elif field == ENTRY_VALUE and wt == WT_LEN:
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


cdef struct ParamRec:
    StrRef key
    int field           # InferParameterField: which choice of the oneof is written
    uint64_t u          # varint payload (bool, int64, uint64)
    double d
    StrRef s
    Py_ssize_t value_len
    Py_ssize_t entry_len


cdef int _plan_params(Vec* records, object params, Py_ssize_t* lo, Py_ssize_t* hi, Py_ssize_t* size,
                      str kind, object name) except -1:
    """Plan a parameters map into ``records`` (ParamRec); ``size`` is the total of its map-entry fields."""
    cdef ParamRec* rec
    cdef Py_ssize_t total = 0
    lo[0] = records.n
    if params:
        if not PyDict_CheckExact(params):
            params = dict(params)
        for key, value in (<dict>params).items():
            rec = <ParamRec*>_vpush(records)
            memset(rec, 0, sizeof(ParamRec))    # _plan_free reads its owners
            if not _plan_param(rec, key, value, kind, name):
                _str_release(&rec.key)          # None: not written
                records.n -= 1
                continue
            total += _ld(rec.entry_len)
    hi[0] = records.n
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
        rec.field = PARAM_BOOL
        rec.u = 1 if value else 0
    elif t is int:
        rec.field = PARAM_INT64
        iv = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            raise CodecError(
                f"{_where(kind, name)} parameter '{key}': {value} does not fit in int64")
        rec.u = <uint64_t>iv
    elif t is float:
        rec.field = PARAM_DOUBLE
        rec.d = PyFloat_AsDouble(value)
    elif t is str:
        rec.field = PARAM_STRING
        _plan_str(&rec.s, value, kind, name, f"parameter '{key}'")
    elif isinstance(value, UInt64):
        rec.field = PARAM_UINT64
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
    if rec.field == PARAM_BOOL:
        rec.value_len = 2
    elif rec.field == PARAM_DOUBLE:
        rec.value_len = 9
    elif rec.field == PARAM_STRING:
        rec.value_len = _ld(rec.s.n)
    else:
        rec.value_len = 1 + _vsize(rec.u)
    rec.entry_len = _ld(rec.key.n) + _ld(rec.value_len)
    return True


cdef char* _write_params(Vec* records, char* p, Py_ssize_t lo, Py_ssize_t hi, uchar tag) noexcept:
    """Write ``records[lo:hi]`` as map entries of the field whose tag is ``tag``."""
    cdef ParamRec* recs = <ParamRec*>_vdata(records)
    cdef ParamRec* rec
    cdef Py_ssize_t i
    for i in range(lo, hi):
        rec = &recs[i]
        p = _whead(p, tag, rec.entry_len)
        p = _wbytes(p, _len_tag(ENTRY_KEY), rec.key.p, rec.key.n)
        p = _whead(p, _len_tag(ENTRY_VALUE), rec.value_len)
        # InferParameter tag: double is fixed64, string is length-delimited, the others varints
        p[0] = <char>((rec.field << 3) | (WT_I64 if rec.field == PARAM_DOUBLE else
                                          WT_LEN if rec.field == PARAM_STRING else WT_VARINT))
        p += 1
        if rec.field == PARAM_DOUBLE:
            memcpy(p, &rec.d, 8)
            p += 8
        elif rec.field == PARAM_STRING:
            p = _wcopy(_wvarint(p, <uint64_t>rec.s.n), rec.s.p, rec.s.n)
        else:
            p = _wvarint(p, rec.u)
    return p

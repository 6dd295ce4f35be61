# Protobuf wire primitives: a read cursor over ``const uchar*`` (like asyncpg's FRBuffer) with
# bounds-checked varints, tags and lengths, and the writers the encoder uses once sizes are known.

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


cdef inline double _le_double(const uchar* p) noexcept nogil:
    cdef double d
    memcpy(&d, p, 8)
    return d


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

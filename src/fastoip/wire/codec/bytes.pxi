# BYTES tensors: the element limit, the length-prefixed framing both ways.

#: Most BYTES elements one request (and so one tensor) may decode into (2**24: Triton's own tests send
#: 10,485,760 in one request), refused before any element is built ...
DEFAULT_MAX_BYTES_ELEMENTS = 1 << 24
cdef int64_t _max_bytes_elements = DEFAULT_MAX_BYTES_ELEMENTS
#: ... and the memory one BYTES tensor's decoded elements may take, charged while they are built: each
#: element is a Python bytes object (~50 bytes for as little as 4 bytes on the wire), so a small request
#: must not expand without bound.
DEFAULT_MAX_BYTES_MEMORY = 256 * 1024 * 1024
cdef int64_t _max_bytes_memory = DEFAULT_MAX_BYTES_MEMORY
#: Per element: its pointer in the list being built and in the numpy array made from it.
cdef int64_t _ELEMENT_POINTERS = 2 * sizeof(void*)


cdef inline int64_t _element_cost(Py_ssize_t n) noexcept:
    """Memory one decoded BYTES element of ``n`` bytes takes (CPython shares the 0- and 1-byte objects)."""
    if n <= 1:
        return _ELEMENT_POINTERS
    # PyBytesObject: a 33-byte header with the terminating NUL, in 16-byte allocator blocks.
    return _ELEMENT_POINTERS + ((33 + n + 15) // 16) * 16


cdef int _over_bytes_memory(int64_t spent, str what) except -1:
    raise CodecError(
        f"{what}: its BYTES elements take more than this server's limit of {_max_bytes_memory} bytes of memory "
        f"(--max-bytes-memory; {spent} so far)")


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
    cdef int64_t spent = 0
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
        spent += _element_cost(ln)
        if spent > _max_bytes_memory:
            _over_bytes_memory(spent, what)
        item = PyBytes_FromStringAndSize(<const char*>p, ln)   # copy: one bytes per element
        Py_INCREF(item)
        PyList_SET_ITEM(lst, i, item)
        p += ln
    if p != end:
        raise CodecError(
            f"unexpected number of string elements: {what}: {end - p} bytes left over after {count} BYTES elements")
    return _np_array(lst, _OBJECT_DTYPE)   # copy of the element pointers into the array


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

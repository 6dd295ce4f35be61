# A small growable vector with inline storage (lives on the C stack): spans, dims, records.

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

# Strings both ways: UTF-8 checked decoding, the name cache, and the str references the encoder holds.

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


cdef struct StrRef:
    PyObject* owner     # a strong reference to the str, dropped by _plan_free (NULL: none)
    const char* p       # its UTF-8
    Py_ssize_t n


cdef inline void _str_release(StrRef* ref) noexcept:
    Py_XDECREF(ref.owner)
    ref.owner = NULL


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

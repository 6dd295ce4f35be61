# Small tensors inside a Python worker's messages (fastoip.pyworker.transport): their bytes travel in the
# pickled message as a bytearray, with the dtype's name and the shape.  Both ways in C: ~0.1 us each, where
# bytearray(array) and np.frombuffer(...).reshape(...) cost ~0.26 and ~0.35 us (numpy's generic checks).

#: np.dtype by its ``dtype.str`` (the receiver's look-up); bounded: the names come from another process.
cdef dict _INLINE_DTYPES = {}
#: ``dtype.str`` by dtype (the sender's: numpy builds that string anew at every read).
cdef dict _INLINE_NAMES = {}
cdef Py_ssize_t _INLINE_CACHE_LIMIT = 256


cdef object _pack_inline(object obj, Py_ssize_t limit):
    cdef cnp.ndarray array
    cdef Py_ssize_t nbytes
    if not isinstance(obj, cnp.ndarray):
        return None
    array = <cnp.ndarray>obj
    dtype = array.dtype
    if dtype.hasobject:
        return None  # objects are pickled
    nbytes = cnp.PyArray_NBYTES(array)
    if nbytes >= limit:
        return None
    name = _INLINE_NAMES.get(dtype)
    if name is None:
        name = dtype.str
        if len(_INLINE_NAMES) < _INLINE_CACHE_LIMIT:
            _INLINE_NAMES[dtype] = name
    if cnp.PyArray_IS_C_CONTIGUOUS(array):
        data = PyByteArray_FromStringAndSize(<char *>cnp.PyArray_DATA(array), nbytes)
    else:
        data = bytearray(array)  # (the buffer protocol copies it in C order)
    return ("b", data, name, obj.shape)


cdef object _inline_dtype(str name):
    dtype = _INLINE_DTYPES.get(name)
    if dtype is None:
        dtype = np.dtype(name)
        if len(_INLINE_DTYPES) < _INLINE_CACHE_LIMIT:
            _INLINE_DTYPES[name] = dtype
    return dtype


cdef object _unpack_inline(tuple packed):
    """A writable array on the message's bytearray (a memoryview of it is the base: the bytearray cannot be
    resized under the array).  Checked: another process wrote it."""
    cdef cnp.npy_intp dims[64]
    cdef Py_ssize_t i, nd, count = 1, itemsize
    if len(packed) != 4:
        raise ValueError("an inline tensor is ('b', bytearray, dtype name, shape)")
    data, name, shape = packed[1], packed[2], packed[3]
    if type(data) is not bytearray or type(name) is not str or type(shape) is not tuple:
        raise ValueError("an inline tensor is ('b', bytearray, dtype name, shape)")
    dtype = _inline_dtype(<str>name)
    if dtype.hasobject:
        raise ValueError(f"an inline tensor cannot hold objects (dtype {name!r})")
    itemsize = (<cnp.dtype>dtype).itemsize
    nd = len(<tuple>shape)
    if nd > 64:
        raise ValueError(f"an inline tensor has at most 64 dimensions, not {nd}")
    for i in range(nd):
        dims[i] = <cnp.npy_intp>_operator_index(<object>PyTuple_GET_ITEM(shape, i))
        if dims[i] < 0 or (dims[i] and count > PY_SSIZE_T_MAX // dims[i]):
            raise ValueError(f"an inline tensor's shape {shape!r} is not a size")
        count *= dims[i]
    if itemsize == 0 or count > PY_SSIZE_T_MAX // itemsize or count * itemsize != len(<bytearray>data):
        raise ValueError(f"an inline tensor of shape {shape!r} and dtype {name!r} is not {len(<bytearray>data)} bytes")
    view = PyMemoryView_FromObject(data)
    return fastoip_array_view(view, dtype, <int>nd, dims, PyByteArray_AS_STRING(data), cnp.NPY_ARRAY_WRITEABLE)

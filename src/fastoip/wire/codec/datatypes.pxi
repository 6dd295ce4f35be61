# The V2 datatype table as C arrays: name <-> code <-> item size <-> numpy dtype <-> typed contents field.

cdef enum:
    # Datatype codes: indexes of the tables below.
    DT_BOOL = 0
    DT_UINT8 = 1
    DT_UINT16 = 2
    DT_UINT32 = 3
    DT_UINT64 = 4
    DT_INT8 = 5
    DT_INT16 = 6
    DT_INT32 = 7
    DT_INT64 = 8
    DT_FP16 = 9
    DT_FP32 = 10
    DT_FP64 = 11
    DT_BF16 = 12
    DT_BYTES = 13
    N_DT = 14


cdef const char* _DT_C[N_DT]
cdef Py_ssize_t _DT_LEN[N_DT]
cdef int _ITEMSIZE[N_DT]
cdef int _CONTENTS_FIELD[N_DT]   # 0: no typed field (FP16, BF16)

cdef tuple _DT_NAMES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
             "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES")
cdef tuple _DT_NAMES_B = tuple([s.encode("ascii") for s in _DT_NAMES])
cdef dict _DT_CODE = {name: i for i, name in enumerate(_DT_NAMES)}
cdef tuple _DT_NUMPY = tuple([NUMPY_DTYPES[name] for name in _DT_NAMES])
cdef tuple _FIELD_NAMES = ("", "bool_contents", "int_contents", "int64_contents", "uint_contents",
                "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents")

cdef int _i
for _i in range(N_DT):
    _DT_C[_i] = _DT_NAMES_B[_i]
    _DT_LEN[_i] = len(_DT_NAMES_B[_i])
    _ITEMSIZE[_i] = 0 if _i == DT_BYTES else _DT_NUMPY[_i].itemsize
for _i, _f in enumerate((CONTENTS_BOOL, CONTENTS_UINT, CONTENTS_UINT, CONTENTS_UINT, CONTENTS_UINT64,
                         CONTENTS_INT, CONTENTS_INT, CONTENTS_INT, CONTENTS_INT64, 0, CONTENTS_FP32,
                         CONTENTS_FP64, 0, CONTENTS_BYTES)):
    _CONTENTS_FIELD[_i] = _f

cdef Py_ssize_t _MAX_DIMS = 64   # numpy 2; numpy 1 allows 32
try:
    np.empty((1,) * 64, dtype=np.uint8)
except ValueError:  # pragma: no cover
    _MAX_DIMS = 32

cdef object _OBJECT_DTYPE = np.dtype(object)
cdef object _INT16_DTYPE = np.dtype("<i2")
cdef object _ndarray = np.ndarray
cdef object _np_empty = np.empty
cdef object _np_array = np.array
cdef object _np_frombuffer = np.frombuffer
cdef object _memoryview = memoryview

# Copies and typed-contents fills of at least this many bytes run with the GIL
# released (below it, releasing and re-taking the GIL costs more than it frees).
cdef enum:
    NOGIL_COPY = 1 << 18

cdef inline int _match_dtype(const uchar* p, Py_ssize_t n) noexcept nogil:
    cdef int i
    for i in range(N_DT):
        if _DT_LEN[i] == n and memcmp(p, _DT_C[i], <size_t>n) == 0:
            return i
    return -1


cdef str _shape_str(tuple shape):
    return "[" + ",".join([str(d) for d in shape]) + "]"

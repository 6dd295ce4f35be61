# C declarations of the codec (_codec.pyx and its wire/codec/*.pxi include files), in one place, as
# asyncpg's pgproto (cpythonx.pxd, hton.pxd over hton.h) and httptools (cparser.pxd) keep theirs: the
# CPython API functions and structures Cython's own cpython/*.pxd do not declare, and the C helpers of
# _codec.h.

from cpython.object cimport PyObject

cimport numpy as cnp


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    PyObject* _PyUnicode_DecodeUTF8 "PyUnicode_DecodeUTF8" (
        const char* s, Py_ssize_t size, const char* errors)
    const char* _PyUnicode_AsUTF8AndSize "PyUnicode_AsUTF8AndSize" (object s, Py_ssize_t* size)
    int PyErr_ExceptionMatches(object exc)
    void PyErr_Clear()
    void* PyMem_Calloc(size_t nelem, size_t elsize)
    bint PyUnicode_Check(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    bint PyDict_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object o) except? <unsigned long long>-1
    double PyFloat_AsDouble(object o) except? -1.0

    # the object layout the decoder reads to fill fastoip.types slots in place (objects.pxi)
    ctypedef struct _TypeObject "PyTypeObject":
        PyObject* (*tp_alloc)(_TypeObject*, Py_ssize_t)
    ctypedef struct _MemberDef "PyMemberDef":
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct _MemberDescr "PyMemberDescrObject":
        _MemberDef* d_member


cdef extern from "_codec.h":
    object fastoip_bytes_view(object base, object dtype, int nd, cnp.npy_intp* dims, char* data)
    object fastoip_array_view(object base, object dtype, int nd, cnp.npy_intp* dims, char* data, int flags)

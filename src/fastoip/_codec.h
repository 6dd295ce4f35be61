/* C helpers of the codec (_codec.pyx), declared for Cython in _codec.pxd.
 *
 * Included after numpy's arrayobject.h (the .pxd cimports numpy first), which the helpers use.
 */
#ifndef FASTOIP_CODEC_H
#define FASTOIP_CODEC_H

/* A C-contiguous array on data (inside base) whose base object is base, writable when flags say
   NPY_ARRAY_WRITEABLE (numpy sets the aligned flag from the address itself).
   PyArray_NewFromDescr steals the dtype reference, PyArray_SetBaseObject the base's. */
static PyObject* fastoip_array_view(PyObject* base, PyObject* dtype, int nd,
                                    npy_intp* dims, char* data, int flags) {
    PyObject* arr;
    Py_INCREF(dtype);
    arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)dtype, nd, dims, NULL,
                               data, NPY_ARRAY_C_CONTIGUOUS | flags, NULL);
    if (arr == NULL) return NULL;
    Py_INCREF(base);
    if (PyArray_SetBaseObject((PyArrayObject*)arr, base) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* A read-only C-contiguous array on data (inside base) whose base object is base. */
static PyObject* fastoip_bytes_view(PyObject* base, PyObject* dtype, int nd,
                                    npy_intp* dims, char* data) {
    return fastoip_array_view(base, dtype, nd, dims, data, 0);
}

#endif /* FASTOIP_CODEC_H */

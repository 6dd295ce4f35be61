# Building fastoip.types objects.
#
# The decoder makes thousands of these per second.  When the classes have the
# exact __slots__ layout checked below (verified once at import), an object is
# allocated with tp_alloc and its slots are filled in place, skipping the
# Python-level __init__ and the descriptor lookups of setattr.  Any other layout
# falls back to calling the class.

# (PyTypeObject / PyMemberDef, as far as this file reads them: declared in _codec.pxd)

cdef enum:
    _T_OBJECT_EX = 16   # structmember.h: an object slot, AttributeError when unset

cdef struct Layout:
    bint fast
    Py_ssize_t off[6]   # slot offsets, in the order of the class's __slots__

cdef Layout _L_INPUT, _L_OUTPUT, _L_REQUEST, _L_RESPONSE, _L_REQUESTED


cdef void _init_layout(Layout* L, type cls, tuple names):
    cdef _MemberDescr* md
    cdef Py_ssize_t i
    L.fast = False
    if (cls.__dict__.get("__slots__") != names or cls.__bases__ != (object,)
            or cls.__new__ is not object.__new__ or "__dict__" in cls.__dict__):
        return
    member_type = type(InferInput.__dict__["name"])
    for i, name in enumerate(names):
        d = cls.__dict__.get(name)
        if type(d) is not member_type:
            return
        md = <_MemberDescr*><PyObject*>d
        if md.d_member.type != _T_OBJECT_EX or md.d_member.flags != 0:
            return
        L.off[i] = md.d_member.offset
    L.fast = True


_init_layout(&_L_INPUT, InferInput, ("name", "datatype", "shape", "data", "parameters"))
_init_layout(&_L_OUTPUT, InferOutput, ("name", "datatype", "shape", "data", "parameters"))
_init_layout(&_L_REQUEST, InferRequest,
             ("model_name", "model_version", "id", "parameters", "inputs", "outputs"))
_init_layout(&_L_RESPONSE, InferResponse,
             ("model_name", "model_version", "id", "parameters", "outputs"))
_init_layout(&_L_REQUESTED, RequestedOutput, ("name", "parameters"))

#: True when the decoder fills slots in place (see above); for tests.
FAST_SLOTS = all(L.fast for L in (_L_INPUT, _L_OUTPUT, _L_REQUEST, _L_RESPONSE, _L_REQUESTED))


cdef inline object _alloc(type cls):
    cdef PyObject* o = (<_TypeObject*>cls).tp_alloc(<_TypeObject*>cls, 0)
    if o == NULL:
        raise MemoryError()
    obj = <object>o
    Py_DECREF(obj)   # <object> took a second reference
    return obj


cdef inline void _put(object obj, Py_ssize_t offset, object value) noexcept:
    """Store ``value`` in an empty (NULL) slot of a fresh object."""
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>obj) + offset)
    Py_INCREF(value)
    slot[0] = <PyObject*>value


cdef inline int _set_data(object tensor, type cls, Layout* L, object data) except -1:
    """``tensor.data = data`` (in place for exact instances of ``cls``, laid out as ``L``)."""
    cdef PyObject** slot
    cdef PyObject* old
    if L.fast and type(tensor) is cls:
        slot = <PyObject**>((<char*><PyObject*>tensor) + L.off[3])
        old = slot[0]
        Py_INCREF(data)
        slot[0] = <PyObject*>data
        Py_XDECREF(old)
    else:
        tensor.data = data
    return 0


cdef object _make_tensor(type cls, Layout* L, object name, object datatype, tuple shape,
                         dict params):
    if not L.fast:
        return cls(name, datatype, shape, None, params)
    obj = _alloc(cls)
    _put(obj, L.off[0], name)
    _put(obj, L.off[1], datatype)
    _put(obj, L.off[2], shape)
    _put(obj, L.off[3], None)
    _put(obj, L.off[4], params)
    return obj


cdef object _make_requested(object name, dict params):
    if not _L_REQUESTED.fast:
        return RequestedOutput(name, params)
    obj = _alloc(RequestedOutput)
    _put(obj, _L_REQUESTED.off[0], name)
    _put(obj, _L_REQUESTED.off[1], params)
    return obj


cdef object _make_message(type cls, Layout* L, object model_name, object model_version,
                          object request_id, dict params, list tensors, list requested):
    """An InferRequest (``requested`` is a list) or an InferResponse (``requested`` is None)."""
    if not L.fast:
        if requested is None:
            return cls(model_name, model_version, request_id, params, tensors)
        return cls(model_name, model_version, request_id, params, tensors, requested)
    obj = _alloc(cls)
    _put(obj, L.off[0], model_name)
    _put(obj, L.off[1], model_version)
    _put(obj, L.off[2], request_id)
    _put(obj, L.off[3], params)
    _put(obj, L.off[4], tensors)
    if requested is not None:
        _put(obj, L.off[5], requested)
    return obj


cdef inline object _attr(object obj, type cls, Layout* L, int i, str name):
    """``getattr(obj, name)``, read straight from the slot for exact instances of ``cls``."""
    cdef PyObject* v
    if L.fast and type(obj) is cls:
        v = (<PyObject**>((<char*><PyObject*>obj) + L.off[i]))[0]
        if v != NULL:
            return <object>v
    return getattr(obj, name)

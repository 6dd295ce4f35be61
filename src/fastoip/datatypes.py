"""The V2 tensor datatype table: wire name <-> numpy dtype <-> byte size.

Rules:
- BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``.
  On the wire (raw contents, HTTP binary) each element is a 4-byte
  little-endian length followed by the bytes.
- BF16 has no numpy dtype.  Inside the server a BF16 tensor is a ``uint16``
  array holding the raw bfloat16 bits (exact, zero-copy).  Clients such as
  tritonclient show BF16 as float32 and send the upper two bytes of each
  little-endian float32; :func:`bf16_bits_from_float32` and
  :func:`float32_from_bf16_bits` convert between the two.
- All multi-byte values are little-endian on the wire; the numpy dtypes here
  are explicit little-endian so that views on wire bytes are correct on any host.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgument

#: V2 datatype name -> numpy dtype used for tensors of that type inside the server.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(object),
}

#: V2 datatype name -> size of one element on the wire (0 for BYTES: variable).
ITEM_SIZES: dict[str, int] = {
    name: (0 if name == "BYTES" else dtype.itemsize) for name, dtype in NUMPY_DTYPES.items()
}

#: Triton config enum name (model_config.proto DataType) -> V2 datatype name.
CONFIG_TO_V2: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
V2_TO_CONFIG: dict[str, str] = {v2: cfg for cfg, v2 in CONFIG_TO_V2.items()}

#: ONNX TensorProto element type number -> V2 datatype name.
ONNX_TO_V2: dict[int, str] = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}

#: onnxruntime's type strings ("tensor(float)") -> V2 datatype name.
ORT_TYPE_TO_V2: dict[str, str] = {
    "tensor(float)": "FP32",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(uint16)": "UINT16",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(string)": "BYTES",
    "tensor(bool)": "BOOL",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bfloat16)": "BF16",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a V2 datatype name; InvalidArgument if unknown."""
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        raise InvalidArgument(f"unknown datatype '{datatype}'") from None


#: numpy (kind, item size) -> V2 datatype name, for the numeric kinds.
_V2_BY_KIND_SIZE = {
    ("u", 1): "UINT8", ("u", 2): "UINT16", ("u", 4): "UINT32", ("u", 8): "UINT64",
    ("i", 1): "INT8", ("i", 2): "INT16", ("i", 4): "INT32", ("i", 8): "INT64",
    ("f", 2): "FP16", ("f", 4): "FP32", ("f", 8): "FP64",
}


def v2_datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name for a numpy array (object arrays are BYTES)."""
    kind = array.dtype.kind
    if kind in ("O", "S", "U"):
        return "BYTES"
    if kind == "b":
        return "BOOL"
    name = _V2_BY_KIND_SIZE.get((kind, array.dtype.itemsize))
    if name is None:
        raise InvalidArgument(f"numpy dtype {array.dtype} has no V2 datatype")
    return name


def bf16_bits_from_float32(values: np.ndarray) -> np.ndarray:
    """Truncate float32 values to bfloat16 bits (upper half of each float32), as tritonclient does."""
    as_u32 = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    return (as_u32 >> 16).astype("<u2")


def float32_from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bits to float32 (exact)."""
    return (bits.astype("<u4") << 16).view("<f4")


def to_bytes_elements(array: np.ndarray) -> np.ndarray:
    """An object array of ``bytes`` from str/bytes arrays (str encoded as UTF-8)."""
    if array.dtype == object and all(isinstance(v, bytes) for v in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat_out = out.reshape(-1)
    for i, value in enumerate(array.flat):
        if isinstance(value, bytes):
            flat_out[i] = value
        elif isinstance(value, str):
            flat_out[i] = value.encode("utf-8")
        else:
            flat_out[i] = str(value).encode("utf-8")
    return out

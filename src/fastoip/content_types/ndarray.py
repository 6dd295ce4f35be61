"""``np``: a tensor as a numpy array of its own shape (MLServer's NumpyCodec).

Decoding returns the request's array itself (no copy; it may be read-only);
BF16 tensors become float32.  Encoding takes arrays, numpy scalars and
(nested) lists of numbers or bytes; str elements are encoded as UTF-8 BYTES.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..datatypes import float32_from_bf16_bits, v2_datatype_of
from ..errors import InferenceError
from .base import ContentType, Tensor


class NumpyContentType(ContentType):
    name = "np"

    def decode(self, tensor: Tensor) -> np.ndarray:
        if tensor.datatype == "BF16":
            return float32_from_bf16_bits(tensor.data)
        return tensor.data

    def can_encode(self, value: Any) -> bool:
        if isinstance(value, (np.ndarray, np.generic)):
            return value.dtype.kind not in "mM"
        if isinstance(value, (bool, int, float)):
            return True
        if isinstance(value, (list, tuple)) and value:
            if all(isinstance(v, (bytes, bytearray)) for v in value):
                return True
            if all(isinstance(v, str) for v in value):
                return False  # (numpy would make it a U array: text is the str codec's, told without the array)
            try:
                array = np.asarray(value)
            except (ValueError, TypeError):
                return False
            return array.dtype.kind in "biuf"
        return False

    def encode(self, name: str, value: Any) -> Tensor:
        array = to_array(value)
        kind = array.dtype.kind
        if kind in "OSU":
            return Tensor(name, "BYTES", array.shape, bytes_elements(array), {"content_type": self.name})
        if kind in "mMcV":
            raise TypeError(f"numpy dtype {array.dtype} has no V2 datatype")
        try:
            datatype = v2_datatype_of(array)
        except InferenceError as exc:
            raise TypeError(str(exc)) from None
        return Tensor(name, datatype, array.shape, array, {"content_type": self.name})


def to_array(value: Any) -> np.ndarray:
    """``value`` as an ndarray; lists of bytes stay bytes (an object array)."""
    if isinstance(value, np.ndarray):
        return value
    to_numpy = getattr(value, "to_numpy", None)
    if to_numpy is not None:  # pandas Series / Index
        return np.asarray(to_numpy())
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
        out = np.empty(len(value), dtype=object)
        out[:] = [bytes(v) for v in value]
        return out
    return np.asarray(value)


def bytes_elements(array: np.ndarray) -> np.ndarray:
    """An object array of ``bytes`` with ``array``'s shape; TypeError for other element types."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for index, element in enumerate(array.reshape(-1).tolist()):
        if isinstance(element, bytes):
            flat[index] = element
        elif isinstance(element, str):
            flat[index] = element.encode("utf-8")
        elif isinstance(element, (bytearray, memoryview)):
            flat[index] = bytes(element)
        else:
            raise TypeError(f"element {index} is a {type(element).__name__}, which BYTES cannot hold")
    return out

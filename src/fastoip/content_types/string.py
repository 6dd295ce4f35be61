"""``str``: a BYTES tensor as a flat list of UTF-8 strings (MLServer's StringCodec)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ContentType, Tensor, as_list, bytes_array, flat_elements


class StringContentType(ContentType):
    name = "str"

    def decode(self, tensor: Tensor) -> list[str]:
        out = []
        for index, element in enumerate(flat_elements(tensor, self.name)):
            if isinstance(element, str):
                out.append(element)
                continue
            try:
                out.append(bytes(element).decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"element {index} is not valid UTF-8") from None
        return out

    def can_encode(self, value: Any) -> bool:
        if isinstance(value, str):
            return True
        if isinstance(value, np.ndarray):
            return value.dtype.kind == "U" or (
                value.dtype == object and value.size > 0 and all(isinstance(v, str) for v in value.flat)
            )
        return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) for v in value)

    def encode(self, name: str, value: Any) -> Tensor:
        shape = value.shape if isinstance(value, np.ndarray) else None
        items = [value] if isinstance(value, str) else as_list(value)
        if items is None:
            raise TypeError(f"expected a str or a list of str, got {type(value).__name__}")
        encoded = []
        for index, element in enumerate(items):
            if not isinstance(element, str):
                raise TypeError(f"element {index} is a {type(element).__name__}, not a str")
            encoded.append(element.encode("utf-8"))
        data = bytes_array(encoded, shape)
        return Tensor(name, "BYTES", data.shape, data, {"content_type": self.name})

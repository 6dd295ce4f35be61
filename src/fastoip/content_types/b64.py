"""``base64``: BYTES elements holding base64 text <-> raw ``bytes`` (MLServer's Base64Codec).

Never chosen by payload inference: a model that returns ``bytes`` gets raw
BYTES (``np``) unless the output's content type says ``base64``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .base import ContentType, Tensor, as_list, bytes_array, flat_elements


class Base64ContentType(ContentType):
    name = "base64"

    def decode(self, tensor: Tensor) -> list[bytes]:
        out = []
        for index, element in enumerate(flat_elements(tensor, self.name)):
            try:
                out.append(base64.b64decode(element, validate=True))
            except (binascii.Error, ValueError, TypeError):
                raise ValueError(f"element {index} is not valid base64") from None
        return out

    def encode(self, name: str, value: Any) -> Tensor:
        items = [value] if isinstance(value, (bytes, bytearray, memoryview)) else as_list(value)
        if items is None:
            raise TypeError(f"expected bytes or a list of bytes, got {type(value).__name__}")
        encoded = []
        for index, element in enumerate(items):
            if not isinstance(element, (bytes, bytearray, memoryview)):
                raise TypeError(f"element {index} is a {type(element).__name__}, not bytes")
            encoded.append(base64.b64encode(bytes(element)))
        data = bytes_array(encoded)
        return Tensor(name, "BYTES", data.shape, data, {"content_type": self.name})

"""Content types (MLServer's codecs): how V2 tensors become the Python values a model wants.

Built in: ``np`` (numpy arrays), ``pd`` (pandas DataFrame, request level
only, needs ``fastoip[pandas]``), ``str`` (UTF-8 strings), ``base64`` and
``datetime``.  Add your own with :func:`register_content_type`.
See :mod:`.base` for the codec interface and :mod:`.request` for how a
request and a response are decoded and encoded.
"""

from __future__ import annotations

from .b64 import Base64ContentType
from .base import (
    REQUEST_KEY,
    ContentType,
    Tensor,
    _register_builtin,
    content_type_names,
    get_content_type,
    input_key,
    output_key,
    register_content_type,
    unregister_content_type,
)
from .dataframe import PandasContentType
from .dates import DatetimeContentType
from .ndarray import NumpyContentType
from .request import ModelContentTypes, decode_request, encode_output, split_response
from .string import StringContentType

# Payload inference tries them in this order (user codecs first).
_BUILT_IN: tuple[ContentType, ...] = (
    NumpyContentType(), StringContentType(), DatetimeContentType(), Base64ContentType(), PandasContentType()
)
for _codec in _BUILT_IN:
    _register_builtin(_codec)
del _codec

__all__ = [
    "REQUEST_KEY",
    "Base64ContentType",
    "ContentType",
    "DatetimeContentType",
    "ModelContentTypes",
    "NumpyContentType",
    "PandasContentType",
    "StringContentType",
    "Tensor",
    "content_type_names",
    "decode_request",
    "encode_output",
    "get_content_type",
    "input_key",
    "output_key",
    "register_content_type",
    "split_response",
    "unregister_content_type",
]

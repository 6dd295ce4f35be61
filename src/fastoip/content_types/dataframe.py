"""``pd``: a whole request as a pandas DataFrame, one column per input (MLServer's PandasCodec).

Rules:
- Request level only.  Each input is a column; its first dimension is the
  number of rows, and every column must have the same number of rows.
- Content types stack: an input with its own content type (``str``,
  ``datetime``, ...) is decoded by it first and that value becomes the column.
- An input of shape ``[N]`` or ``[N, 1]`` is a column of scalars; ``[N, k, ...]``
  is a column whose cells are the arrays of shape ``[k, ...]`` (as MLServer
  does with ``list(array)``).  BYTES inputs with no content type give
  ``bytes`` cells.
- Encoding: a DataFrame returned by a model is split into one output per
  column (see :func:`plain_value` for how a column becomes a tensor).
- pandas is optional: without it this content type raises Unsupported
  telling the user to ``pip install fastoip[pandas]``.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import Unsupported
from .base import ContentType, Tensor
from .ndarray import NumpyContentType

INSTALL_HINT = "pip install fastoip[pandas]"
_numpy = NumpyContentType()


def pandas() -> ModuleType:
    """The pandas module, or Unsupported saying how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise Unsupported(
            f"content type 'pd' needs pandas, which is not installed on the server: {INSTALL_HINT}"
        ) from None
    return pd


def is_dataframe(value: Any) -> bool:
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.DataFrame)


def is_series(value: Any) -> bool:
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.Series)


class PandasContentType(ContentType):
    name = "pd"
    input_level = False

    def decode(self, tensor: Tensor) -> Any:
        raise ValueError("content type 'pd' decodes whole requests only (set it in the request's parameters)")

    def decode_request(self, tensors: list[Tensor], decoded: dict[str, Any]) -> Any:
        pd = pandas()
        columns: dict[str, Any] = {}
        rows: int | None = None
        first_name = ""
        for tensor in tensors:
            count = int(tensor.shape[0]) if len(tensor.shape) else 1
            if rows is None:
                rows, first_name = count, tensor.name
            elif count != rows:
                raise ValueError(
                    f"input '{tensor.name}' has {count} rows but input '{first_name}' has {rows}: "
                    "every column of a DataFrame needs the same number of rows"
                )
            if tensor.name in decoded:
                columns[tensor.name] = _column(tensor.name, decoded[tensor.name], count, pd)
            else:
                columns[tensor.name] = _column(tensor.name, _numpy.decode(tensor), count, pd)
        return pd.DataFrame(columns)

    def split_response(self, value: Any) -> dict[str, Any] | None:
        if not is_dataframe(value):
            return None
        out: dict[str, Any] = {}
        for column in value.columns:
            name = str(column)
            if name in out:
                raise ValueError(f"the DataFrame has two columns named '{name}'")
            out[name] = value[column]
        return out

    def encode(self, name: str, value: Any) -> Tensor:
        raise TypeError("content type 'pd' encodes whole responses: return the DataFrame itself")


def _column(name: str, value: Any, rows: int, pd: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            value = value.reshape(1)
        if value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1):
            return value.reshape(-1)
        return pd.Series(list(value), dtype=object)
    if isinstance(value, pd.Series):
        return value.to_numpy()
    if isinstance(value, (list, tuple)):
        items = list(value)
        if len(items) == rows:
            return items
        if rows > 0 and len(items) % rows == 0:
            width = len(items) // rows
            return pd.Series([items[i * width:(i + 1) * width] for i in range(rows)], dtype=object)
        raise ValueError(f"input '{name}' decoded to {len(items)} values, which do not split into {rows} rows")
    raise ValueError(f"input '{name}' decoded to a {type(value).__name__}, which cannot be a DataFrame column")


def plain_value(series: Any) -> Any:
    """A pandas Series as what the other codecs take: an ndarray or a list.

    Numeric and bool columns -> their numpy array; datetime columns -> a list
    of Timestamps (``datetime`` subclasses); string columns -> a list of str;
    object columns whose cells are arrays or lists of equal length -> one
    stacked array ``[rows, ...]``; other object columns -> a list.
    """
    pd = pandas()
    dtype = series.dtype
    if pd.api.types.is_datetime64_any_dtype(dtype):
        if series.isna().any():
            raise TypeError("a datetime column has missing values (NaT)")
        return series.tolist()
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
        return series.to_numpy()
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype):
        if series.isna().any():
            raise TypeError(f"a {dtype} column has missing values, which V2 tensors cannot hold")
        numpy_dtype = getattr(dtype, "numpy_dtype", None)  # nullable extension dtypes (Int64, boolean, ...)
        return series.to_numpy(dtype=numpy_dtype) if numpy_dtype is not None else series.to_numpy()
    values = series.tolist()
    if values and all(isinstance(v, (np.ndarray, list, tuple)) for v in values):
        try:
            return np.stack([np.asarray(v) for v in values])
        except ValueError:
            raise TypeError("an object column holds arrays of different shapes") from None
    for index, element in enumerate(values):
        if element is None or (isinstance(element, float) and element != element):
            raise TypeError(f"row {index} is missing (None/NaN), which a V2 tensor cannot hold")
    return values

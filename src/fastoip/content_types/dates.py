"""``datetime``: BYTES elements holding ISO 8601 text <-> ``datetime.datetime`` (MLServer's DatetimeCodec)."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from .base import ContentType, Tensor, as_list, bytes_array, flat_elements


def parse_iso(text: str) -> datetime.datetime:
    """ISO 8601 date or date-time; a trailing ``Z`` means UTC (also on Python 3.10)."""
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    return datetime.datetime.fromisoformat(text)


class DatetimeContentType(ContentType):
    name = "datetime"

    def decode(self, tensor: Tensor) -> list[datetime.datetime]:
        out = []
        for index, element in enumerate(flat_elements(tensor, self.name)):
            try:
                text = element.decode("utf-8") if isinstance(element, bytes) else str(element)
                out.append(parse_iso(text))
            except (UnicodeDecodeError, ValueError):
                shown = element[:40] if isinstance(element, bytes) else element
                raise ValueError(f"element {index} ({shown!r}) is not an ISO 8601 date-time") from None
        return out

    def can_encode(self, value: Any) -> bool:
        if isinstance(value, datetime.date):
            return True
        if isinstance(value, np.ndarray):
            return value.dtype.kind == "M"
        return (
            isinstance(value, (list, tuple))
            and bool(value)
            and all(isinstance(v, datetime.date) for v in value)
        )

    def encode(self, name: str, value: Any) -> Tensor:
        if isinstance(value, datetime.date):
            items: list = [value]
        elif isinstance(value, np.ndarray) and value.dtype.kind == "M":
            items = value.astype("datetime64[us]").reshape(-1).tolist()
        else:
            found = as_list(value)
            if found is None:
                raise TypeError(f"expected a datetime or a list of datetimes, got {type(value).__name__}")
            items = found
        encoded = []
        for index, element in enumerate(items):
            if isinstance(element, np.datetime64):
                element = element.astype("datetime64[us]").item()
            if not isinstance(element, datetime.date) or element != element:  # NaT compares unequal
                raise TypeError(f"element {index} is a {type(element).__name__}, not a datetime")
            encoded.append(element.isoformat().encode("ascii"))
        data = bytes_array(encoded)
        return Tensor(name, "BYTES", data.shape, data, {"content_type": self.name})

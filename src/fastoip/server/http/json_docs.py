"""The small JSON documents of the non-infer endpoints: optional bodies, typed fields, base64 values."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ...errors import InvalidArgument
from ...wire.http import json_excerpt, parse_json_object


def optional_json_object(body: bytes | bytearray, what: str) -> dict[str, Any]:
    """An optional JSON object body ({} when empty)."""
    return parse_json_object(body, what) if body.strip() else {}


def base64_value(value: Any, what: str) -> bytes:
    """Bytes sent as a base64 JSON string, or a 400 saying which value was not."""
    try:
        if type(value) is str:
            return base64.b64decode(value, validate=True)
    except binascii.Error:
        pass
    raise InvalidArgument(f"{what} must be a base64 string, got {json_excerpt(value)}")


def integer_field(doc: dict[str, Any], field: str, what: str, minimum: int, default: int | None = None) -> int:
    """``doc[field]`` as an int >= ``minimum`` (0 or 1; absent: ``default``), or a 400 naming the field."""
    value = doc.get(field)
    if value is None:  # null is absent
        value = default
    if type(value) is not int or value < minimum:
        expected = "a non-negative integer" if minimum == 0 else "a positive integer"
        raise InvalidArgument(f"the {what} needs '{field}' as {expected}, got {json_excerpt(value)}")
    return value


def trace_settings_json(values: dict[str, list[str]]) -> dict[str, Any]:
    """Triton's HTTP form: ``trace_level`` is a list, every other setting one string."""
    return {
        key: value if key == "trace_level" else (value[0] if len(value) == 1 else value)
        for key, value in values.items()
    }


def parameters_of(doc: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = doc.get("parameters")
    if parameters is None:  # absent, or null
        return {}
    if type(parameters) is not dict:
        raise InvalidArgument(f"'parameters' of the {what} must be an object")
    return parameters


def load_parameters(body: bytes | bytearray) -> dict[str, Any]:
    """A repository load request's parameters the Core reads (``config``, ``file:<path>`` decoded from base64);
    the others are dropped here, in the JSON pool's process, so a large one is never copied back (issue 37)."""
    parameters = parameters_of(optional_json_object(body, "load request"), "load request")
    kept: dict[str, Any] = {}
    for key, value in parameters.items():
        if key.startswith("file:"):  # file contents travel base64-encoded in JSON
            kept[key] = base64_value(value, f"load request parameter '{key}'")
        elif key == "config":
            kept[key] = value
    return kept


def check_json_object(body: bytes | bytearray, what: str) -> None:
    """400 unless ``body`` is a JSON object; nothing of it is kept (parsed in the JSON pool when large)."""
    parse_json_object(body, what)

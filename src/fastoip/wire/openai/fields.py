"""Reading one request's JSON members with a precise 400 for each wrong one (the member named as ``param``)."""

from __future__ import annotations

from typing import Any

import orjson

from .errors import BadParameter


def parse_object(body: bytes, what: str) -> dict[str, Any]:
    """The body as a JSON object; 400 otherwise."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadParameter("body", f"the {what} body is not valid JSON: {exc}") from None
    if type(doc) is not dict:
        raise BadParameter("body", f"the {what} body must be a JSON object, got {type(doc).__name__}")
    return doc


def _describe(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "null"
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed getters over one JSON object; each raises :class:`BadParameter` naming the member."""

    def __init__(self, doc: dict[str, Any], prefix: str = "") -> None:
        self.doc = doc
        self.prefix = prefix

    def name(self, key: str) -> str:
        return self.prefix + key

    def bad(self, key: str, expected: str) -> BadParameter:
        return BadParameter(self.name(key), f"'{self.name(key)}' must be {expected}, got {_describe(self.doc[key])}")

    def required_str(self, key: str) -> str:
        if key not in self.doc:
            raise BadParameter(self.name(key), f"'{self.name(key)}' is required")
        value = self.doc[key]
        if type(value) is not str or not value:
            raise self.bad(key, "a non-empty string")
        return value

    def optional_str(self, key: str) -> str | None:
        value = self.doc.get(key)
        if value is not None and type(value) is not str:
            raise self.bad(key, "a string")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.doc.get(key)
        if value is None:
            return default
        if type(value) is not bool:
            raise self.bad(key, "a boolean")
        return value

    def integer(self, key: str, low: int, high: int | None = None) -> int | None:
        value = self.doc.get(key)
        if value is None:
            return None
        if type(value) is not int or value < low or (high is not None and value > high):
            span = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"
            raise self.bad(key, span)
        return value

    def number(self, key: str, low: float, high: float) -> float | None:
        value = self.doc.get(key)
        if value is None:
            return None
        if type(value) not in (int, float) or not low <= value <= high:
            raise self.bad(key, f"a number from {low:g} to {high:g}")
        return float(value)

    def optional_object(self, key: str) -> dict[str, Any] | None:
        value = self.doc.get(key)
        if value is not None and type(value) is not dict:
            raise self.bad(key, "an object")
        return value

    def optional_list(self, key: str) -> list[Any] | None:
        value = self.doc.get(key)
        if value is not None and type(value) is not list:
            raise self.bad(key, "an array")
        return value

"""Triton's ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``.

Rules:
- A request header (HTTP) or metadata entry (gRPC) whose name matches the
  pattern anywhere (a search, case-insensitive, as Triton's RE2 partial match
  with ``(?i)``) becomes an inference request parameter: its name, lower case
  as HTTP/2 and fastoip's HTTP parser give it, with its value as a string.
- A parameter the request itself carries keeps the request's value.
- Only inference requests are touched; nothing else reads the headers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class HeaderForwarder:
    """Copies matching headers into a request's parameters."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern, re.IGNORECASE)

    def apply(self, headers: Mapping[bytes, bytes] | None, parameters: dict[str, Any]) -> None:
        """Add each matching header of ``headers`` to ``parameters`` (pseudo-headers never match)."""
        if not headers:
            return
        for raw_name, raw_value in headers.items():
            if raw_name.startswith(b":"):
                continue
            name = raw_name.decode("latin-1").lower()
            if name not in parameters and self.pattern.search(name):
                parameters[name] = raw_value.decode("latin-1")


def forwarder(pattern: str | None) -> HeaderForwarder | None:
    """The forwarder for a flag's pattern, None when none was given."""
    return HeaderForwarder(pattern) if pattern else None

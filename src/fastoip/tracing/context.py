"""The caller's W3C trace context (``traceparent`` / ``tracestate``), found in gRPC metadata or HTTP headers.

Rules:
- Frontends hand the Core the request's headers as they have them, unread:
  a mapping (HTTP/2 and HTTP/1.1 header dicts, bytes or str) or a callable that
  returns (name, value) pairs (grpcio's ``context.invocation_metadata``).  They
  are read only for a request that tracing looks at, so an untraced request
  pays nothing for them.
- Names compare in lower case (HTTP/2 and gRPC send them lower case; HTTP/1.1 may not).
- Only the two W3C names are kept; whether the ``traceparent`` is valid is the
  OpenTelemetry propagator's call (:mod:`.otel`), not parsed here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Request headers as a frontend has them (see the module rules).
TraceHeaders = Mapping[Any, Any] | Callable[[], Iterable[tuple[Any, Any]]]

W3C_NAMES = ("traceparent", "tracestate")


def _text(value: Any) -> str:
    return bytes(value).decode("latin-1") if isinstance(value, bytes | bytearray | memoryview) else str(value)


def w3c_carrier(headers: TraceHeaders) -> dict[str, str]:
    """``traceparent`` and ``tracestate`` from ``headers`` (absent ones left out)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers()
    carrier: dict[str, str] = {}
    for key, value in pairs:
        name = _text(key).lower()
        if name in W3C_NAMES:
            carrier[name] = _text(value)
    return carrier

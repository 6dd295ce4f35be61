"""OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}`` with the status of the failure.

Rules (OpenAI's API reference, and what its SDK reads):
- ``detail`` carries the message again: Triton's OpenAI frontend answers its errors as FastAPI does
  (``{"detail": message}``), and its clients and tests read that.
- ``type`` is OpenAI's word for the class of failure: ``invalid_request_error`` for 4xx (400, 404, 405, 413),
  ``server_error`` for 5xx; ``code`` names the case when one is known (``model_not_found``), else null;
  ``param`` names the request member at fault, else null.
"""

from __future__ import annotations

import orjson

from ...errors import InferenceError, InvalidArgument

#: OpenAI's ``code`` for statuses that have one.
CODES = {404: "model_not_found", 429: "rate_limit_exceeded", 403: "forbidden"}


class BadParameter(InvalidArgument):
    """A request member that is missing, of the wrong type or out of range (400, ``param`` named)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": CODES.get(status)},
         "detail": message}
    )


def error_of(exc: InferenceError) -> tuple[int, bytes]:
    """The status and OpenAI body of a core error."""
    return exc.http_status, error_body(exc.http_status, exc.message, getattr(exc, "param", None))

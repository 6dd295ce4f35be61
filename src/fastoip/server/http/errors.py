"""The HTTP frontend's own errors: statuses that only HTTP has (413, 405, 403)."""

from __future__ import annotations

from ...errors import InvalidArgument


class PayloadTooLarge(InvalidArgument):
    """The request body (or its decompressed form) exceeds max_body_size."""

    http_status = 413


class Forbidden(InvalidArgument):
    """A restricted endpoint asked without the header --http-restricted-api names (Triton answers 403)."""

    http_status = 403


class MethodNotAllowed(InvalidArgument):
    """A known path asked with a method it does not serve."""

    http_status = 405

    def __init__(self, message: str, allow: list[str]) -> None:
        super().__init__(message)
        self.allow = ", ".join(allow).encode()


def too_large(what: str, limit_name: str = "--http-max-input-size") -> PayloadTooLarge:
    return PayloadTooLarge(f"{what}, over the server's limit ({limit_name})")

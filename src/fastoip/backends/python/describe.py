"""How the Python backend names an exception raised by user code in its error messages."""

from __future__ import annotations


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

"""Lifecycle hooks for Python models (BentoML's meaning) and the ``batchable`` mark.

Rules:
- ``@on_deployment``: a function in the model class that takes no arguments
  (like a staticmethod; ``@staticmethod`` underneath is fine).  It runs once
  per server process, before any model of the repository builds an instance.
- ``@on_startup``: a method; runs once per model instance, after ``load()``.
- ``@on_shutdown``: a method; runs once per instance when the model is
  unloaded or the server stops, in reverse order of definition.
- Hooks may be ``async def``; they then run on the Python backend's event loop.
- Hooks are collected from the class and its bases, base classes first, each
  in definition order.  A subclass that redefines a hook's name without the
  decorator removes that hook.
- The decorators only mark functions; they never wrap them, so a hook is
  still an ordinary method to call and to test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

F = TypeVar("F")

DEPLOYMENT = "deployment"
STARTUP = "startup"
SHUTDOWN = "shutdown"
_HOOK_ATTR = "__fastoip_hook__"
_BATCHABLE_ATTR = "__fastoip_batchable__"


def _function(obj: Any) -> Any:
    """The function inside a staticmethod/classmethod, or ``obj``."""
    return getattr(obj, "__func__", obj)


def _mark(obj: F, attr: str, value: Any) -> F:
    function = _function(obj)
    if not callable(function):
        raise TypeError(f"expected a function, got {type(obj).__name__}")
    setattr(function, attr, value)
    return obj


def on_deployment(function: F) -> F:
    """Run ``function()`` once per server, before any model instance is built."""
    return _mark(function, _HOOK_ATTR, DEPLOYMENT)


def on_startup(method: F) -> F:
    """Run ``method(self)`` once per model instance, after ``load()``."""
    return _mark(method, _HOOK_ATTR, STARTUP)


def on_shutdown(method: F) -> F:
    """Run ``method(self)`` when the instance is unloaded or the server stops (reverse order)."""
    return _mark(method, _HOOK_ATTR, SHUTDOWN)


@overload
def batchable(method: F) -> F: ...
@overload
def batchable(method: None = None) -> Callable[[F], F]: ...


def batchable(method: F | None = None) -> F | Callable[[F], F]:
    """Mark ``predict`` as taking merged batches (dynamic batcher, ``max_batch_size > 0``)."""

    def mark(target: F) -> F:
        return _mark(target, _BATCHABLE_ATTR, True)

    return mark if method is None else mark(method)


def is_batchable(function: Any) -> bool | None:
    """True/False when ``function`` was marked, None when it says nothing."""
    return getattr(_function(function), _BATCHABLE_ATTR, None)


def hook_names(cls: type, kind: str) -> list[str]:
    """Names of the ``kind`` hooks of ``cls``: bases first, definition order."""
    found: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if getattr(_function(value), _HOOK_ATTR, None) == kind:
                found.pop(name, None)
                found[name] = None
            elif name in found:
                del found[name]
    names = list(found)
    return names[::-1] if kind == SHUTDOWN else names

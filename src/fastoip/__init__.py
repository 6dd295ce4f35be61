"""fastoip: a gRPC-first Open Inference Protocol (KServe V2) server with a native tensor codec.

Public API for custom Python models (imported lazily, so ``import fastoip``
stays cheap for the CLI):

- :class:`Model`: base class of models in ``<repository>/<model>/<version>/model.py``.
- :func:`batchable`, :func:`on_deployment`, :func:`on_startup`, :func:`on_shutdown`.
- Content types: :class:`ContentType`, :class:`Tensor`,
  :func:`register_content_type`, :func:`get_content_type`,
  :func:`content_type_names`, :func:`unregister_content_type`.
- Errors a model may raise: :class:`InvalidArgument` (400 / INVALID_ARGUMENT),
  :class:`Unavailable`, :class:`InferenceError`.

Embedding and testing: :class:`Server` (a whole fastoip in this process, on free ports);
:mod:`fastoip.testing` (an in-process client on a repository, no sockets).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Model": "fastoip.model",
    "batchable": "fastoip.lifecycle",
    "on_deployment": "fastoip.lifecycle",
    "on_startup": "fastoip.lifecycle",
    "on_shutdown": "fastoip.lifecycle",
    "ContentType": "fastoip.content_types",
    "Tensor": "fastoip.content_types",
    "register_content_type": "fastoip.content_types",
    "unregister_content_type": "fastoip.content_types",
    "get_content_type": "fastoip.content_types",
    "content_type_names": "fastoip.content_types",
    "InferenceError": "fastoip.errors",
    "InvalidArgument": "fastoip.errors",
    "Unavailable": "fastoip.errors",
    "Server": "fastoip.embed",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastoip' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""The wire codecs: bytes <-> :mod:`fastoip.types`, with no I/O.

- gRPC: the Cython codec :mod:`fastoip._codec` (ModelInferRequest /
  ModelInferResponse / ModelStreamInferResponse), one extension module that
  stays at the package top so the compiled file keeps its import path;
  re-exported here as :data:`grpc`.
- HTTP/REST: :mod:`.http` (V2 JSON and Triton's binary tensor extension) and
  :mod:`.generate` (Triton's generate extension: flat JSON, Server-Sent Events).

Both are sans-I/O: frontends read and write the bytes, the codecs only translate.
"""

from .. import _codec as grpc
from . import generate, http

__all__ = ["generate", "grpc", "http"]

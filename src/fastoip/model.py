"""``fastoip.Model``: the base class of custom Python models.

Rules:
- One object per model instance (``instance_group { count }``); the server
  never calls one object from two threads at once unless the config asks
  for ``parameters { key: "max_concurrency" }`` > 1.
- ``__init__`` takes no arguments; ``name``, ``version``, ``path``,
  ``config``, ``parameters``, ``extra`` and ``instance`` are set before it runs.
- Any method may be ``async def``: it then runs on the Python backend's
  event loop (one loop thread for all Python models); plain methods run on
  the scheduler's worker threads.  Neither blocks the gRPC/HTTP frontends.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._proto import model_config_pb2 as mc


class Model:
    """Subclass this in ``<repository>/<model>/<version>/model.py``.

    ``predict(self, inputs, parameters)`` (sync or async) is required:

    - ``inputs``: with no request-level content type, a dict
      ``{input name: value}`` where value is the input decoded by its own
      content type (``str`` -> ``list[str]``, ``datetime`` ->
      ``list[datetime]``, ``base64`` -> ``list[bytes]``, or a user codec's
      type) or else the numpy array (``np``; shape as sent, may be a
      read-only view: copy before writing to it; BYTES are object arrays
      of ``bytes``).  With a request-level content type (the request's
      ``parameters.content_type``, else the model's default), the decoded
      request itself: ``pd`` -> a DataFrame with one column per input;
      ``np`` / ``str`` / ... -> the FIRST input decoded by that type.
    - ``parameters``: the request's parameters (a dict; ``predict(self,
      inputs)`` with one argument is fine too).
    - Return one of: a dict ``{output name: value}``; a DataFrame (one
      output per column); a tuple (values in the order of the model's
      outputs); or one value when the model has one output.  A value is
      encoded by the output's content type (requested output parameter,
      else the model's default), else by what it is: numpy arrays and
      lists of numbers or bytes -> ``np``, lists of str -> ``str``
      (BYTES), datetimes -> ``datetime`` (ISO 8601 BYTES).  Each output
      carries its ``content_type`` parameter; numeric outputs are cast to
      the datatype the config declares.
    - Batching: when the model batches (``max_batch_size > 0`` and
      ``@fastoip.batchable`` on predict, ``parameters { key: "batchable" }``
      or a ``dynamic_batching`` block), requests are merged along their
      first dimension, predict sees all rows at once, and must return
      outputs with the same number of rows (the server splits them back).
    - Raise ``fastoip.InvalidArgument`` for a bad request (400 /
      INVALID_ARGUMENT); any other exception is an internal error (500).

    Optional: ``load()`` (runs before the instance serves; the model is
    LOADING and not ready meanwhile), ``unload()`` (after the shutdown
    hooks), ``is_ready()`` / ``is_alive()`` (answer the V2 health endpoints),
    and hooks marked with ``@fastoip.on_deployment``, ``@fastoip.on_startup``,
    ``@fastoip.on_shutdown``.
    """

    #: Model name (the repository directory).
    name: str
    #: Version number being served.
    version: int
    #: The version directory (``<repository>/<model>/<version>``).
    path: Path
    #: The completed model configuration (a ``ModelConfig`` protobuf message).
    config: mc.ModelConfig
    #: ``parameters`` of the config (string values).
    parameters: dict[str, str]
    #: ``parameters.extra`` of model-settings.json (or the JSON in config parameter ``extra``).
    extra: dict[str, Any]
    #: 0-based index of this instance among the model's instances.
    instance: int

    def load(self) -> Any:
        """Load weights and resources; may be async.  Raising marks the model UNAVAILABLE."""
        return None

    def predict(self, inputs: Any, parameters: dict) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define predict()")

    def is_ready(self) -> Any:
        """False (or an awaitable of False) makes the model and the server not ready."""
        return True

    def is_alive(self) -> Any:
        """False makes the server not live."""
        return True

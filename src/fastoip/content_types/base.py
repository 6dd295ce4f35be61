"""Content types: codecs between V2 tensors and the Python values a model wants.

Rules (MLServer's semantics, ``docs/user-guide/content-type.md``):
- A content type has a name (``np``, ``pd``, ``str``, ``base64``,
  ``datetime``, or one a user registers) and is picked by the
  ``content_type`` parameter of a request (request level: decodes the whole
  request) or of one input (input level: decodes that input).  The model's
  metadata gives defaults; what the request says always wins.
- Codecs are stateless singletons shared by every thread: ``decode`` and
  ``encode`` must not keep per-call state on ``self``.
- A codec signals data it cannot handle by raising ``ValueError`` or
  ``TypeError`` with a message about the data; the caller names the input or
  output and turns it into InvalidArgument (a request's fault) or
  InternalError (a model's fault).
- Nothing here knows about gRPC, HTTP, the repository or the schedulers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, overload

import numpy as np

#: Config parameter holding the model's request-level default.
REQUEST_KEY = "content_type"


def input_key(name: str) -> str:
    """Config parameter holding the default content type of input ``name``."""
    return f"input.{name}.content_type"


def output_key(name: str) -> str:
    """Config parameter holding the default content type of output ``name``."""
    return f"output.{name}.content_type"


@dataclass
class Tensor:
    """One V2 tensor as codecs see it.

    ``data`` is a numpy array of shape ``shape``; BYTES tensors are ``object``
    arrays whose elements are ``bytes``.  Arrays decoded from a request may be
    read-only views on the received bytes.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def content_type(self) -> str | None:
        value = self.parameters.get("content_type")
        return value if isinstance(value, str) and value else None


class ContentType:
    """Base of every codec; subclass it and register the subclass.

    Override ``decode`` (one input -> a Python value), ``encode`` (a Python
    value -> one output tensor) and ``can_encode`` (whether a value returned
    by a model without an explicit content type should be encoded by this
    codec).  Codecs that also make sense for a whole request inherit the
    single-input behaviour of ``decode_request`` (MLServer's
    ``SingleInputRequestCodec``: the request's first input); codecs such as
    ``pd`` that build one value out of all inputs override it and set
    ``input_level = False``.
    """

    #: The name clients write in ``parameters.content_type``.
    name: ClassVar[str] = ""
    #: May be set on one input.
    input_level: ClassVar[bool] = True
    #: May be set on a whole request.
    request_level: ClassVar[bool] = True

    def decode(self, tensor: Tensor) -> Any:
        raise NotImplementedError(f"content type '{self.name}' cannot decode inputs")

    def encode(self, name: str, value: Any) -> Tensor:
        raise NotImplementedError(f"content type '{self.name}' cannot encode outputs")

    def can_encode(self, value: Any) -> bool:
        return False

    def decode_request(self, tensors: list[Tensor], decoded: dict[str, Any]) -> Any:
        """A whole request -> one value.  ``decoded``: inputs already decoded at input level."""
        if not tensors:
            raise ValueError("the request has no inputs")
        first = tensors[0]
        if first.name in decoded:
            return decoded[first.name]
        try:
            return self.decode(first)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"input '{first.name}': {exc}") from None

    def split_response(self, value: Any) -> dict[str, Any] | None:
        """A whole-response value -> {output name: value}; None when ``value`` is not one."""
        return None


# -- the registry ---------------------------------------------------------------------
_lock = threading.Lock()
_registry: dict[str, ContentType] = {}
#: Names of codecs registered by users, most recent first: tried before the built-ins.
_user_order: list[str] = []
#: Built-in codecs, in the order payload inference tries them.
_builtin_order: list[str] = []
#: The codecs in that order (user codecs, then built-ins), rebuilt when the registry changes: payload inference
#: reads it for every output of every response (a streamed model's every token).
_payload_order: tuple[ContentType, ...] = ()
#: Those of them that split whole responses (override ``split_response``), in the same order.
_splitting: tuple[ContentType, ...] = ()


def _reorder() -> None:
    """Rebuild ``_payload_order`` and ``_splitting`` (the caller holds ``_lock``)."""
    global _payload_order, _splitting
    _payload_order = tuple(_registry[n] for n in _user_order) + tuple(_registry[n] for n in _builtin_order)
    _splitting = tuple(c for c in _payload_order if type(c).split_response is not ContentType.split_response)

C = TypeVar("C", bound=ContentType | type)


@overload
def register_content_type(name: str, codec: ContentType | type, *, replace: bool = False) -> ContentType: ...
@overload
def register_content_type(name: str, *, replace: bool = False) -> Callable[[C], C]: ...
@overload
def register_content_type(name: ContentType | type, *, replace: bool = False) -> Any: ...


def register_content_type(
    name: str | ContentType | type, codec: ContentType | type | None = None, *, replace: bool = False
) -> Any:
    """Add a content type to the registry.

    Forms::

        fastoip.register_content_type("json", JsonCodec())   # name + codec (instance or class)
        fastoip.register_content_type(JsonCodec)             # class (or instance) with a ``name``

        @fastoip.register_content_type("json")                # decorator on a class
        class JsonCodec(fastoip.ContentType): ...

    A name that is taken raises ValueError unless ``replace=True`` or the
    codec taking it is the same class re-created by a model reload (same
    module and qualified name).
    """
    if codec is None:
        if isinstance(name, str):
            label = name

            def decorator(target: C) -> C:
                register_content_type(label, target, replace=replace)
                return target

            return decorator
        codec, name = name, getattr(name, "name", "")
    instance = codec() if isinstance(codec, type) else codec
    if not isinstance(instance, ContentType):
        raise TypeError(f"a content type must subclass fastoip.ContentType, got {type(instance).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError("a content type needs a non-empty name")
    if isinstance(codec, type) and not type(instance).name:
        type(instance).name = name
    with _lock:
        current = _registry.get(name)
        if current is not None and not replace and not _same_class(current, instance):
            raise ValueError(
                f"content type '{name}' is already registered ({type(current).__qualname__}); "
                "pass replace=True to replace it"
            )
        _registry[name] = instance
        if name in _builtin_order and replace:
            _builtin_order.remove(name)
        if name not in _builtin_order:
            if name in _user_order:
                _user_order.remove(name)
            _user_order.insert(0, name)
        _reorder()
    return instance


def _register_builtin(codec: ContentType) -> None:
    with _lock:
        _registry[codec.name] = codec
        _builtin_order.append(codec.name)
        _reorder()


def _same_class(a: ContentType, b: ContentType) -> bool:
    ta, tb = type(a), type(b)
    return ta is tb or (ta.__module__ == tb.__module__ and ta.__qualname__ == tb.__qualname__)


def unregister_content_type(name: str) -> None:
    """Remove a user-registered content type (built-ins stay)."""
    with _lock:
        if name in _user_order:
            _user_order.remove(name)
            del _registry[name]
            _reorder()


def get_content_type(name: str) -> ContentType | None:
    """The codec registered as ``name``, or None."""
    return _registry.get(name)


def content_type_names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_registry)


def codecs_for_payload() -> tuple[ContentType, ...]:
    """Codecs in the order payload inference tries them: user codecs, then built-ins."""
    return _payload_order  # (replaced whole under the lock, never changed in place: no lock to read it)


def codecs_that_split() -> tuple[ContentType, ...]:
    """``codecs_for_payload()`` less those that never split a whole response (the base class's answer)."""
    return _splitting


# -- helpers shared by the codecs ------------------------------------------------------------
def bytes_array(items: list[bytes], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An object array of ``bytes`` (never numpy's fixed-width ``S`` dtype)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape) if shape is not None else out


def flat_elements(tensor: Tensor, needs: str) -> list:
    """The elements of a BYTES tensor as a flat list; ValueError for other datatypes."""
    if tensor.datatype != "BYTES":
        raise ValueError(f"content type '{needs}' needs BYTES data, got {tensor.datatype}")
    return tensor.data.reshape(-1).tolist()


def as_list(value: Any) -> list | None:
    """``value`` as a flat list when it is a list, tuple, 1-D array or pandas Series; else None."""
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    to_list = getattr(value, "tolist", None)
    if to_list is not None and hasattr(value, "dtype") and hasattr(value, "index"):  # pandas Series
        return list(to_list())
    return None

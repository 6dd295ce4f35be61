"""Applying content types to one request and its response.

Rules:
- Input level first: every input whose ``parameters.content_type`` (or, when
  the request says nothing, the model's default for that input) names a
  codec is decoded by it.  Then the request level: the request's
  ``parameters.content_type`` (else the model's default) decodes the whole
  request, seeing the inputs already decoded (so ``pd`` stacks with ``str``).
- With no request-level content type the model gets ``{input name: value}``:
  the decoded value, or the numpy array itself.
- Errors name the input and the content type: a request that does not fit
  is InvalidArgument; an output the model built that does not fit is
  InternalError (InvalidArgument when the content type came from the request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InternalError, InvalidArgument
from .base import (
    REQUEST_KEY,
    ContentType,
    Tensor,
    codecs_for_payload,
    codecs_that_split,
    content_type_names,
    get_content_type,
    input_key,
    output_key,
)
from .dataframe import is_series, plain_value


@dataclass(frozen=True)
class ModelContentTypes:
    """A model's default content types (its metadata: model-settings.json or config parameters)."""

    request: str | None = None
    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_parameters(
        cls, parameters: Mapping[str, str], input_names: list[str], output_names: list[str]
    ) -> ModelContentTypes:
        return cls(
            parameters.get(REQUEST_KEY) or None,
            {n: parameters[input_key(n)] for n in input_names if parameters.get(input_key(n))},
            {n: parameters[output_key(n)] for n in output_names if parameters.get(output_key(n))},
        )

    def check(self, model: str) -> None:
        """Every default names a registered codec usable where it is set (pandas present for ``pd``)."""
        for where, name, level in (
            [("request", self.request, "request")] if self.request else []
        ) + [(f"input '{n}'", ct, "input") for n, ct in self.inputs.items()] + [
            (f"output '{n}'", ct, "output") for n, ct in self.outputs.items()
        ]:
            codec = lookup(name, f"model '{model}' {where}")
            if level == "input" and not codec.input_level:
                raise InvalidArgument(f"model '{model}' {where}: content type '{name}' works on whole requests only")
            if level == "request" and not codec.request_level:
                raise InvalidArgument(f"model '{model}' {where}: content type '{name}' cannot decode a whole request")
            if name == "pd":
                from .dataframe import pandas

                pandas()


def lookup(name: str, where: str) -> ContentType:
    codec = get_content_type(name)
    if codec is None:
        raise InvalidArgument(
            f"{where}: unknown content type '{name}' (known: {', '.join(content_type_names())})"
        )
    return codec


def decode_request(
    tensors: list[Tensor], request_content_type: str | None, defaults: ModelContentTypes
) -> Any:
    """The value a model's ``predict`` gets for these input tensors."""
    decoded: dict[str, Any] = {}
    for tensor in tensors:
        name = tensor.content_type or defaults.inputs.get(tensor.name)
        if not name:
            continue
        codec = lookup(name, f"input '{tensor.name}'")
        if not codec.input_level:
            raise InvalidArgument(
                f"input '{tensor.name}': content type '{name}' works on whole requests only "
                "(set it in the request's parameters)"
            )
        try:
            decoded[tensor.name] = codec.decode(tensor)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"input '{tensor.name}' does not fit content type '{name}': {exc}") from None
    name = request_content_type or defaults.request
    if not name:
        return {t.name: decoded[t.name] if t.name in decoded else t.data for t in tensors}
    codec = lookup(name, "request")
    if not codec.request_level:
        raise InvalidArgument(f"content type '{name}' cannot decode a whole request (set it on an input)")
    try:
        return codec.decode_request(tensors, decoded)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"the request does not fit content type '{name}': {exc}") from None


def split_response(value: Any) -> tuple[dict[str, Any], str] | None:
    """A whole-response value (a DataFrame, or a user codec's type) -> ({output: value}, content type)."""
    for codec in codecs_that_split():
        try:
            parts = codec.split_response(value)
        except (ValueError, TypeError) as exc:
            raise InternalError(f"the model's response does not fit content type '{codec.name}': {exc}") from None
        if parts is not None:
            return parts, codec.name
    return None


def encode_output(name: str, value: Any, content_type: str | None, *, from_request: bool = False) -> Tensor:
    """One output value -> a tensor, by ``content_type`` or, when None, by what the value is."""
    error = InvalidArgument if from_request else InternalError
    try:
        if is_series(value):
            value = plain_value(value)
    except TypeError as exc:
        raise InternalError(f"output '{name}': {exc}") from None
    if content_type:
        codec = lookup(content_type, f"output '{name}'")
    else:
        found = None
        for candidate in codecs_for_payload():
            if _can_encode(candidate, value):
                found = candidate
                break
        if found is None:
            raise InternalError(
                f"output '{name}': no content type can encode a {type(value).__name__} "
                "(return a numpy array, a list of str or datetimes, or a DataFrame; "
                "or set the output's content_type)"
            )
        codec = found
    try:
        return codec.encode(name, value)
    except (ValueError, TypeError) as exc:
        raise error(f"output '{name}' does not fit content type '{codec.name}': {exc}") from None
    except NotImplementedError as exc:
        raise error(f"output '{name}': {exc}") from None


def _can_encode(codec: ContentType, value: Any) -> bool:
    try:
        return bool(codec.can_encode(value))
    except Exception:  # a user codec's bug must not hide the built-ins
        return False

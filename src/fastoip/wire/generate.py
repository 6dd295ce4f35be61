"""Triton's generate extension (``/generate``, ``/generate_stream``): its JSON <-> core types, sans-I/O.

Rules (Triton's ``http_server.cc``, ``HandleGenerate`` and ``GenerateRequestClass``):
- Request: one JSON object (an empty body is ``{}``).  Each member whose name
  is a model input becomes that input; every other member becomes a request
  parameter (string, integer, boolean or number; anything else is an error).
  ``parameters`` is an object whose members are mapped the same way.  ``id``
  (a string) is also the request id.
- An input's value is a scalar or a flat list; its shape is the input's
  metadata shape with the element count distributed as Triton does: fixed
  dims divide the count, the innermost variable dim takes what is left and
  the other variable dims (the batch dim included) are 1.
- Response: one flat JSON object, keys sorted (Triton builds it from an
  ordered map): ``id`` (when the request had one), ``model_name``,
  ``model_version``, each response parameter, and each output as its JSON
  value (one element: the value itself; more: a flat list).  A name already
  taken keeps its first value.
- Stream events are Server-Sent Events: ``data: <json>`` and a blank line;
  an error is ``{"error": message}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..errors import InvalidArgument
from ..types import InferInput, InferRequest, InferResponse
from .http import TensorDescription, json_output, json_tensor, json_type, parse_json_object

#: The member whose object is mapped like the top level (Triton's nested mapping schema).
PARAMETERS = "parameters"
#: What a non-streaming generate answers when a model gave more or fewer than one response (Triton's words).
NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)


def decode_generate_request(
    model_name: str, model_version: str, body: bytes | bytearray, inputs: Sequence[TensorDescription]
) -> InferRequest:
    """The generate request ``body`` for a model whose inputs are ``inputs`` (its metadata)."""
    doc = parse_json_object(body, "generate request") if body.strip() else {}
    request_id = doc.get("id") or ""  # null is absent
    if type(request_id) is not str:
        raise InvalidArgument(f"Unable to parse 'id': it must be a string, got {json_type(request_id)}")
    by_name = {tensor.name: tensor for tensor in inputs}
    tensors: list[InferInput] = []
    parameters: dict[str, Any] = {}
    for key, value in doc.items():
        if value is None:  # null is absent (an optional member left unset)
            continue
        if key == PARAMETERS:
            if key in by_name:
                raise InvalidArgument(f"Keyword '{key}' for nested schema also given as input tensor name")
            if type(value) is not dict:
                raise InvalidArgument(f"Expected JSON object for keyword: '{key}', got {json_type(value)}")
            try:
                for nested_key, nested_value in value.items():
                    _map_member(nested_key, nested_value, by_name, tensors, parameters)
            except InvalidArgument as exc:
                raise InvalidArgument(f"Converting keyword: '{key}': {exc.message}") from None
        else:
            _map_member(key, value, by_name, tensors, parameters)
    return InferRequest(model_name, model_version, request_id, parameters, tensors, [])


def _map_member(
    key: str,
    value: Any,
    inputs: dict[str, TensorDescription],
    tensors: list[InferInput],
    parameters: dict[str, Any],
) -> None:
    spec = inputs.get(key)
    if spec is not None:
        tensors.append(_tensor(spec, value))
    elif type(value) in (str, int, bool, float):
        parameters[key] = value
    else:
        raise InvalidArgument(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
        )


def _tensor(spec: TensorDescription, value: Any) -> InferInput:
    data = value if type(value) is list else [value]
    if any(type(element) in (list, dict) for element in data):
        raise InvalidArgument(f"input '{spec.name}': a generate request gives an input as a scalar or a flat list")
    shape = _shape_for(spec, len(data))
    return InferInput(spec.name, spec.datatype, tuple(shape), json_tensor(data, spec.datatype, shape, spec.name))


def _shape_for(spec: TensorDescription, count: int) -> list[int]:
    """Triton's two passes: fixed dims divide ``count``; the innermost variable dim takes the rest, others 1."""
    shape = list(spec.shape)
    left = count
    for dim in reversed(shape):
        if dim >= 0:
            if dim == 0 or left % dim:
                raise InvalidArgument(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
            left //= dim
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] < 0:
            shape[index], left = left, 1
    if left != 1:
        raise InvalidArgument(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
    return shape


def generate_response_json(response: InferResponse) -> bytes:
    """One response as the generate extension's flat JSON object."""
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    for key, value in response.parameters.items():
        doc.setdefault(key, value)
    for output in response.outputs:
        if output.name in doc or output.data is None:
            continue
        values = json_output(output.name, output.datatype, output.data)
        count = len(values)
        doc[output.name] = (values[0].item() if hasattr(values[0], "item") else values[0]) if count == 1 else values
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def error_json(message: str) -> bytes:
    return orjson.dumps({"error": message})


def sse_event(data: bytes) -> bytes:
    """One Server-Sent Event carrying ``data`` (JSON: one line, so one ``data:`` field)."""
    return b"data: " + data + b"\n\n"

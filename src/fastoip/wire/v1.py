"""KServe's V1 protocol (``/v1/models/<m>:predict``): its JSON <-> core types, sans-I/O.

Rules (KServe's ``protocol/rest/v1_endpoints.py`` and ``utils.get_predict_input``/``get_predict_response``):
- A request is a JSON object with ``instances`` (rows) or ``inputs`` (``inputs`` wins when both are there).
  - A list of values (numbers, strings, nested lists): the rows of the model's ONE input; a model with
    several inputs needs named rows.
  - A list of objects: named rows (``{"input name": value}`` per row), stacked per input.
  - An object (``inputs`` only, TensorFlow Serving's columnar form): ``{"input name": rows}``.
- Each input is built from its JSON rows as the V2 JSON codec builds ``data`` (same datatype and range
  checks, BYTES from strings), with the datatype the model's metadata states.  The rows are the batch:
  for a model that does not batch, one row whose shape is the input's whole shape is sent without the
  row dimension, and the predictions get it back.
- The answer is ``{"predictions": ...}``: with one output, that output's rows; with several whose first
  dimensions agree, one object per row (``{"output name": value}``), else one object of whole outputs.
  BYTES outputs are UTF-8 strings.
- Errors keep KServe's statuses: 400 for a bad body, 404 for an unknown model, 503 for a model not ready,
  each ``{"error": message}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from ..errors import InvalidArgument
from ..types import InferInput, InferRequest, InferResponse
from .http import TensorDescription, json_output, json_tensor, json_type, parse_json_object

#: What the model's rows look like to :func:`encode_predictions`: whether a row dimension was added back.
RowsAdded = bool


def decode_predict_request(
    model_name: str, body: bytes | bytearray, inputs: Sequence[TensorDescription]
) -> tuple[InferRequest, RowsAdded]:
    """The V1 predict ``body`` as a V2 request for a model whose inputs are ``inputs`` (its metadata)."""
    doc = parse_json_object(body, "V1 predict request")
    key = "inputs" if "inputs" in doc else "instances" if "instances" in doc else None
    if key is None:
        raise InvalidArgument('Expected "instances" or "inputs" in the request body')
    rows = doc[key]
    by_name = {tensor.name: tensor for tensor in inputs}
    columns: dict[str, Any]
    if type(rows) is dict:
        if key == "instances":
            raise InvalidArgument('Expected "instances" to be a list')
        columns = rows
    elif type(rows) is list:
        if not rows:
            raise InvalidArgument(f'"{key}" is empty: send at least one instance')
        if all(type(row) is dict for row in rows):
            columns = {}
            for index, row in enumerate(rows):
                if index and row.keys() != columns.keys():
                    raise InvalidArgument(
                        f"instance {index} names {sorted(row)}, instance 0 named {sorted(columns)}: "
                        "every named instance gives the same inputs"
                    )
                for name, value in row.items():
                    columns.setdefault(name, []).append(value)
        elif any(type(row) is dict for row in rows):
            raise InvalidArgument(f'"{key}" mixes named instances (objects) with plain values')
        else:
            if len(inputs) != 1:
                names = ", ".join(tensor.name for tensor in inputs)
                raise InvalidArgument(
                    f"model '{model_name}' has {len(inputs)} inputs ({names}): send named instances, "
                    "one object per row with a value for each input"
                )
            columns = {inputs[0].name: rows}
    else:
        raise InvalidArgument(f'"{key}" must be a list (or, for "inputs", an object), got {json_type(rows)}')

    tensors = []
    added = False
    for name, values in columns.items():
        spec = by_name.get(name)
        if spec is None:
            raise InvalidArgument(
                f"model '{model_name}' has no input '{name}' (inputs: {', '.join(by_name) or 'none'})"
            )
        if type(values) is not list:
            values = [values]
        shape = _shape_of(values, name)
        if len(shape) == len(spec.shape) + 1 and shape[0] == 1:
            shape = shape[1:]  # one instance of a model that does not batch: its whole input
            added = True
        tensors.append(InferInput(name, spec.datatype, tuple(shape), json_tensor(values, spec.datatype, shape, name)))
    return InferRequest(model_name, inputs=tensors), added


def _shape_of(values: list, name: str) -> list[int]:
    """The shape of nested JSON lists (numpy reads it; a ragged list is a clear error)."""
    try:
        return list(np.asarray(values, dtype=object).shape) if values else [0]
    except ValueError:
        raise InvalidArgument(f"input '{name}': the instances are not a rectangular array") from None


def encode_predictions(response: InferResponse, rows_added: RowsAdded) -> bytes:
    """``{"predictions": ...}`` for a V2 response."""
    columns: dict[str, Any] = {}
    for output in response.outputs:
        if output.data is None:
            continue
        data = output.data.reshape(output.shape) if output.data.shape != tuple(output.shape) else output.data
        if rows_added:
            data = data.reshape((1, *data.shape))
        columns[output.name] = _value(output.name, output.datatype, data)
    predictions: Any
    if len(columns) == 1:
        predictions = next(iter(columns.values()))
    else:
        lengths = {len(value) if type(value) is list else -1 for value in columns.values()}
        if len(lengths) == 1 and -1 not in lengths:
            count = lengths.pop()
            predictions = [{name: value[i] for name, value in columns.items()} for i in range(count)]
        else:
            predictions = columns
    return orjson.dumps({"predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY)


def _value(name: str, datatype: str, data: np.ndarray) -> Any:
    """An output as nested JSON lists in its own shape."""
    if datatype == "BYTES":
        flat = np.empty(data.size, dtype=object)
        flat[:] = json_output(name, datatype, data)
        return flat.reshape(data.shape).tolist()
    json_output(name, datatype, data[:0])  # refuses FP16/BF16 (no JSON form) with the V2 codec's words
    return data.tolist()

"""JSON nulls for optional fields are those fields absent, on every endpoint (issue 38: MLServer's client posts
pydantic's ``.dict()``, which writes ``null`` for every unset field)."""

from __future__ import annotations

import json

import pytest

from fastoip.errors import InvalidArgument
from fastoip.server.http.json_docs import integer_field, parameters_of
from fastoip.wire import generate
from fastoip.wire import http as wire


class _Input:
    name, datatype, shape = "text_input", "BYTES", [1]


def test_infer_request_nulls() -> None:
    body = json.dumps({"id": None, "parameters": {"headers": None, "kept": 1}, "outputs": [
        {"name": "y", "parameters": None}], "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0], "parameters": None}]}).encode()
    request, _ = wire.decode_infer_request("m", "", body, None)
    assert request.id == "" and request.parameters == {"kept": 1}
    assert [o.name for o in request.outputs] == ["y"] and request.outputs[0].parameters == {}
    assert request.inputs[0].parameters == {}


def test_wrong_types_are_still_refused() -> None:
    for doc, words in (({"id": 3}, "'id' must be a string"), ({"parameters": []}, "'parameters' must be an object"),
                       ({"parameters": {"p": {"a": 1}}}, "parameter 'p' must be")):
        body = json.dumps({**doc, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
        with pytest.raises(InvalidArgument, match=words):
            wire.decode_infer_request("m", "", body.encode(), None)


def test_generate_request_null_id() -> None:
    request = generate.decode_generate_request("m", "", json.dumps({"id": None, "text_input": "hi"}).encode(),
                                               [_Input()])
    assert request.id == ""


def test_control_bodies_nulls() -> None:
    assert parameters_of({"parameters": None}, "load request") == {}
    assert integer_field({"offset": None}, "offset", "register request", minimum=0, default=0) == 0
    with pytest.raises(InvalidArgument, match="byte_size"):
        integer_field({"byte_size": None}, "byte_size", "register request", minimum=1)
    with pytest.raises(InvalidArgument, match="must be an object"):
        parameters_of({"parameters": 3}, "load request")

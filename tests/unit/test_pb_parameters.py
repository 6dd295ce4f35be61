"""A Python model's request and response parameters by python_backend's rules (issue 41; Triton's
qa/L0_backend_python/parameters reads them): a dict of str keys and bool, int or str values; a float, None, a list,
a non-str key or a non-dict raises with Triton's words (the model turns it into its INVALID_ARG error). Before,
fastoip took any JSON value and sent floats on as double parameters."""

from __future__ import annotations

from typing import Any

import pytest

from fastoip.pyworker import utils as pb
from fastoip.pyworker.runner import response_of


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ([], "Expect dict, got <class 'list'>"),
        ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"int": 2, "float": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        ({"bool": True, "null": None},
         "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"str": "", "list": ["variable"]},
         "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ],
)
def test_parameters_of_other_types_are_refused_with_tritons_words(parameters: Any, says: str) -> None:
    with pytest.raises(pb.TritonModelException) as response_error:
        pb.InferenceResponse([], parameters=parameters)
    assert says in str(response_error.value)
    with pytest.raises(pb.TritonModelException) as request_error:
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters=parameters)
    assert says in str(request_error.value)


@pytest.mark.parametrize("parameters", [None, {}, {"many_elements": False},
                                        {"a": "1", "b": "2", "c": 3, "d": False, "e": 5, "f": ""}])
def test_bool_int_and_str_parameters_are_kept(parameters: Any) -> None:
    import json

    response = pb.InferenceResponse([], parameters=parameters)
    assert json.loads(response.parameters()) == (parameters or {})


def test_a_bls_answer_keeps_the_parameters_the_called_model_gave() -> None:
    """The rule is for what a model makes: a BLS answer's parameters (a double from another backend) pass through."""
    response = response_of(([], None, {"score": 0.5, "ok": True}))
    assert response.parameters() == '{"score": 0.5, "ok": true}'

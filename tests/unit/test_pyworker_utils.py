"""pb_utils.ModelConfig, what a Python model's auto_complete_config() gets: python_backend's rules and words
(the text Triton's qa/L0_model_config autofill_noplatform/python cases read in the log)."""

from __future__ import annotations

from typing import Any

import pytest

from fastoip.pyworker.utils import ModelConfig


def _config(**fields: Any) -> ModelConfig:
    base: dict[str, Any] = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    base.update(fields)
    return ModelConfig(base)


@pytest.mark.parametrize(("call", "words"), [
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [4]}),
     "input in auto-complete-config function for model 'm' is missing 'name' property."),
    (lambda c: c.add_input({"name": "IN", "dims": [4]}),
     "input 'IN' in auto-complete-config function for model 'm' is missing 'data_type' property."),
    (lambda c: c.add_output({"name": "OUT", "data_type": "TYPE_FP32"}),
     "output 'OUT' in auto-complete-config function for model 'm' is missing 'dims' property."),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "shape": [4]}),
     "input 'IN' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type', "
     "'dims' and 'optional'."),
    (lambda c: c.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4], "optional": True}),
     "output 'OUT' in auto-complete-config function for model 'm' contains property other than 'name', "
     "'data_type' and 'dims'."),
    (lambda c: c.set_model_transaction_policy({"decoupled": True, "other": 1}),
     "model transaction property in auto-complete-config function for model 'm' contains property other than "
     "'decoupled'."),
])
def test_bad_auto_complete_calls_fail_with_python_backends_words(call: Any, words: str) -> None:
    with pytest.raises(ValueError) as info:
        call(_config())
    assert str(info.value) == words


def test_an_entry_the_config_has_must_agree() -> None:
    config = _config(input=[{"name": "IN", "data_type": "TYPE_INT32", "dims": [16]}],
                     output=[{"name": "OUT", "data_type": "TYPE_INVALID", "dims": [16]}])
    with pytest.raises(ValueError, match="^unable to load model 'm', configuration expects datatype TYPE_INT32 for "
                                         "input 'IN', model provides TYPE_FP32$"):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [16]})
    with pytest.raises(ValueError, match=r"^model 'm', tensor 'OUT': the model expects dims \[4\] but the model "
                                         r"configuration specifies dims \[16\]$"):
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [16]})  # agrees: its type is filled in
    assert config.as_dict()["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [16]}]


def test_scheduler_and_decoupled_conflicts() -> None:
    with pytest.raises(ValueError, match="^Configuration specified scheduling_choice as 'sequence_batching', but "
                                         "auto-complete-config function for model 'm' tries to set scheduling_choice "
                                         "as 'dynamic_batching'$"):
        _config(sequence_batching={}).set_dynamic_batching()
    config = _config(model_transaction_policy={"decoupled": False})
    with pytest.raises(ValueError, match="^trying to change decoupled property in auto-complete-config for model "
                                         "'m', which is already set to 'False'.$"):
        config.set_model_transaction_policy({"decoupled": True})
    config.set_model_transaction_policy({"decoupled": False})
    fresh = _config()
    fresh.set_model_transaction_policy({"decoupled": True})
    assert fresh.as_dict()["model_transaction_policy"] == {"decoupled": True}


def test_numpy_to_triton_type_maps_each_numpy_type_and_refuses_the_rest() -> None:
    """Triton's TRITONSERVER_DataType numbers (a table look-up since pyhost): both ways, and None for dtypes the
    Python backend has no number for (a big-endian float, unicode, complex)."""
    import numpy as np

    from fastoip.pyworker.utils import Tensor, numpy_to_triton_type, triton_to_numpy_type

    for number in range(1, 13):
        np_type = triton_to_numpy_type(number)
        assert numpy_to_triton_type(np_type) == number
        assert numpy_to_triton_type(np.dtype(np_type)) == number
    assert numpy_to_triton_type(np.object_) == numpy_to_triton_type("S4") == 13
    for unsupported in (">f4", "U2", np.complex64):
        assert numpy_to_triton_type(unsupported) is None
    assert Tensor("T", np.zeros(2, np.float32)).triton_dtype() == 11


# -- argument types python_backend's binding refuses (Triton's qa/L0_backend_python argument_validation) ----------
def test_bad_argument_types_are_refused_as_python_backends_binding_refuses_them() -> None:
    import numpy as np

    from fastoip.pyworker import utils as pb

    good = [pb.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]
    with pytest.raises(pb.TritonModelException):
        pb.InferenceRequest(inputs=[None], model_name="m", requested_output_names=["o"])
    for bad in ({"inputs": None}, {"model_name": None}, {"requested_output_names": [None]},
                {"requested_output_names": None}, {"correlation_id": None}, {"request_id": None},
                {"model_version": None}, {"flags": None}):
        with pytest.raises(TypeError):
            pb.InferenceRequest(**{"inputs": good, "model_name": "m", "requested_output_names": ["o"], **bad})
    assert pb.InferenceRequest(inputs=good, model_name="m", requested_output_names=["o"],
                               correlation_id="id-5").correlation_id() == "id-5"
    pb.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    with pytest.raises(pb.TritonModelException):
        pb.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb.InferenceResponse(output_tensors=None)
    assert pb.InferenceResponse().output_tensors() == []
    for name, array in ((None, np.zeros(2)), ("OUTPUT0", None), ("", None)):
        with pytest.raises(TypeError):
            pb.Tensor(name, array)
    with pytest.raises(pb.TritonModelException):
        pb.Tensor.from_dlpack("OUTPUT0", None)
    for call in (lambda: pb.Logger.log("x", None), lambda: pb.Logger.log("x", 1), lambda: pb.Logger.log_info(None),
                 lambda: pb.Logger.log_warn(None), lambda: pb.Logger.log_error(None),
                 lambda: pb.Logger.log_verbose(None)):
        with pytest.raises(TypeError):
            call()

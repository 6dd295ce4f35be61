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

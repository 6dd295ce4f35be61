"""The onnxruntime backend's checks of a config against its model file, in the words of Triton's
onnxruntime backend (the text Triton's qa/L0_model_config autofill_noplatform/onnx cases read in the log)."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto

from fastoip.core import Core
from fastoip.errors import InvalidArgument
from fastoip.model_config import read_config_file
from fastoip.repository import RepositoryOptions
from models import identity_model_bytes, write_model


def _tensor(name: str, dims: str = "4", dtype: str = "TYPE_FP32") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}'


#: model name -> (config body, batching model?, Triton's words).
CASES: dict[str, tuple[str, bool, str]] = {
    "bad_max_batch_size": ("max_batch_size: 4\n", False,
                           "autofill failed for model 'bad_max_batch_size': model does not support batching while "
                           "non-zero max_batch_size is specified"),
    "too_many_inputs": (f"max_batch_size: 4\ninput [ {_tensor('INPUT0')}, {_tensor('INPUT_EXTRA')} ]\n", True,
                        "unable to load model 'too_many_inputs', configuration expects 2 inputs, model provides 1"),
    "unknown_input": (f"max_batch_size: 4\ninput [ {_tensor('INPUT_UNKNOWN')} ]\n", True,
                      "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0"),
    "unknown_output": (f"max_batch_size: 4\noutput [ {_tensor('OUTPUT_UNKNOWN')} ]\n", True,
                       "unexpected inference output 'OUTPUT_UNKNOWN', allowed outputs are: OUTPUT0"),
    "bad_input_dims": (f"max_batch_size: 4\ninput [ {_tensor('INPUT0', '4, 1')} ]\n", True,
                       "model 'bad_input_dims', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,4]) but the "
                       "model configuration specifies 3 dimensions (an initial batch dimension because max_batch_size "
                       "> 0 followed by the explicit tensor shape, making complete shape [-1,4,1])"),
    "mismatch_datatype": (f"max_batch_size: 4\ninput [ {_tensor('INPUT0', dtype='TYPE_INT32')} ]\n", True,
                          "unable to load model 'mismatch_datatype', configuration expects datatype TYPE_INT32 for "
                          "input 'INPUT0', model provides TYPE_FP32"),
}


def test_onnx_configs_triton_refuses_fail_with_tritons_words(tmp_path: Path) -> None:
    for name, (config, batching, _) in CASES.items():
        write_model(tmp_path, name, identity_model_bytes(TensorProto.FLOAT, [4], batch=batching),
                    config='platform: "onnxruntime_onnx"\n' + config)
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        index = {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}
    finally:
        core.close()
    for name, (_, _, words) in CASES.items():
        state, reason = index[name]
        assert state == "UNAVAILABLE", name
        assert words in reason, (name, reason)


@pytest.mark.parametrize(("value", "words"), [
    ("-5", "Expected integer, got: -"),  # an unsigned field: the sign is not an integer token
    ('"invalid_value"', 'Expected integer, got: "invalid_value"'),
    ("12345678901", "Integer out of range (12345678901)"),
])
def test_integer_parse_errors_in_tritons_words(tmp_path: Path, value: str, words: str) -> None:
    """Triton's qa/L0_simple_ensemble greps its protobuf parser's words for bad max_inflight_requests values."""
    path = tmp_path / "config.pbtxt"
    path.write_text(f'name: "e"\nplatform: "ensemble"\nensemble_scheduling {{\n  max_inflight_requests: {value}\n'
                    '  step [ { model_name: "a" model_version: -1 } ]\n}\n')
    with pytest.raises(InvalidArgument) as raised:
        read_config_file(path)
    assert f"line 4, column 26: {words} (line 4 reads: 'max_inflight_requests: {value}')" in raised.value.message


def test_integer_parse_errors_of_signed_fields(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text("max_batch_size: -99999999999\n")
    with pytest.raises(InvalidArgument, match=r"Integer out of range \(99999999999\)"):
        read_config_file(path)
    path.write_text("max_batch_size: 1.5\n")
    with pytest.raises(InvalidArgument, match="Expected integer, got: 1.5"):
        read_config_file(path)

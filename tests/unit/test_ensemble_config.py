"""An ensemble's own config is checked before its steps or its version folders are looked at, with Triton's
words (the text Triton's qa/L0_model_config ensemble cases read in the log): these configs have no version
folder and name steps that do not exist, as in Triton's QA, and still fail on the config."""

from __future__ import annotations

from pathlib import Path

from fastoip.core import Core
from fastoip.repository import RepositoryOptions

IO = ('input [ { name: "data" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
      'output [ { name: "prob" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps}}}'


def _ensemble(*steps: str, extra: str = "", io: str = IO) -> str:
    return ('platform: "ensemble"\nmax_batch_size: 8\n' + io + extra
            + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }\n")


ONE = _step("model_a", {"in": "data"}, {"out": "prob"})

#: model name -> (config.pbtxt, Triton's words for it).
CASES: dict[str, tuple[str, str]] = {
    # the config's own name, as Triton's messages give it (the folder is ensemble_scheduling_no_set in Triton's QA)
    "ensemble_scheduling_no_set": ('name: "ensemble_scheduling_not_set"\nplatform: "ensemble"\nmax_batch_size: 8\n'
                                   + IO,
                                   "ensemble scheduling must be set for ensemble ensemble_scheduling_not_set whose "
                                   "platform is ensemble"),
    "has_backend": ('platform: "ensemble"\nbackend: "onnxruntime"\nmax_batch_size: 8\n' + IO,
                    "Ensemble model 'has_backend' must have platform type 'ensemble' and empty backend type"),
    "not_ensemble": (_ensemble(ONE).replace('platform: "ensemble"', 'platform: "onnxruntime_onnx"'),
                     "ensemble scheduling cannot be set for model 'not_ensemble' whose platform is not ensemble"),
    "instance_group_set": (_ensemble(ONE, extra="instance_group [ { kind: KIND_CPU } ]\n"),
                           "instance group should not be specified for ensemble 'instance_group_set'"),
    "optimization_set": (_ensemble(ONE, extra="optimization { input_pinned_memory { enable: true } }\n"),
                         "optimization should not be specified for ensemble 'optimization_set'"),
    "model_warmup_set": (_ensemble(ONE, extra='model_warmup [ { name: "w" batch_size: 1 } ]\n'),
                         "model_warmup can not be specified for ensemble 'model_warmup_set'"),
    "no_step": ('platform: "ensemble"\nmax_batch_size: 8\n' + IO + "ensemble_scheduling { }\n",
                "must specify 'step' for ensemble 'no_step'"),
    "no_model_name": (_ensemble(_step("model_a", {"in": "data"}, {"out": "t"}),
                                _step("", {"in": "t"}, {"out": "prob"})),
                      "must specify 'model_name' in step 1 of ensemble 'no_model_name'"),
    "no_input_map": (_ensemble(_step("model_a", {"in": "data"}, {"out": "t"}), _step("model_b", {}, {"out": "prob"})),
                     "must specify 'input_map' in step 1 of ensemble 'no_input_map'"),
    "no_output_map": (_ensemble(_step("model_a", {"in": "data"}, {"out": "t"}), _step("model_b", {"in": "t"}, {})),
                      "must specify 'output_map' in step 1 of ensemble 'no_output_map'"),
    "output_to_tensor_overmapped": (_ensemble(_step("model_a", {"in": "data"}, {"out": "t"}),
                                              _step("model_b", {"in": "data"}, {"out": "t"}),
                                              _step("model_c", {"in": "t"}, {"out": "prob"})),
                                    "ensemble tensor 't' can appear in an output map only once for ensemble "
                                    "'output_to_tensor_overmapped'"),
    "unreachable_input": (_ensemble(ONE, io=IO + 'input [ { name: "data_2" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'),
                          "ensemble input 'data_2' for ensemble unreachable_input' is not used"),
    "unreachable_output": (_ensemble(ONE, io=IO + 'output [ { name: "prob_2" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'),
                           "ensemble output 'prob_2' for ensemble unreachable_output' is not used"),
    "unreachable_output_3": (_ensemble(ONE, _step("model_b", {"in": "not_written_tensor"}, {"out": "prob_2"}),
                                       io=IO + 'output [ { name: "prob_2" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'),
                             "output 'prob_2' for ensemble 'unreachable_output_3' is not written: at least one of "
                             "its depending tensors, 'not_written_tensor', is not connected"),
    "redundant_tensor_as_output": (_ensemble(_step("model_a", {"in": "data"}, {"out": "prob", "out2": "spare"})),
                                   "ensemble tensor 'spare' is unused in ensemble 'redundant_tensor_as_output'"),
}


def test_ensemble_configs_triton_refuses_fail_with_tritons_words(tmp_path: Path) -> None:
    for name, (config, _) in CASES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(config)
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        index = {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}
    finally:
        core.close()
    for name, (_, words) in CASES.items():
        state, reason = index[name]
        assert state == "UNAVAILABLE", name
        assert words in reason, (name, reason)


def test_a_loaded_ensembles_config_says_it_is_not_decoupled(tmp_path: Path) -> None:
    """Triton's config API shows an ensemble's ``model_transaction_policy`` (decoupled as its steps; fastoip's
    ensembles hold no decoupled step), as Triton's qa/L0_model_config python/conflicting_scheduler_ensemble reads."""
    from onnx import TensorProto

    from models import identity_model_bytes, write_model

    write_model(tmp_path, "step", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "ensemble_scheduling { step [ " + _step("step", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}) + " ] }\n")
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        config = core.model_config("ens")
        assert config.HasField("model_transaction_policy") and not config.model_transaction_policy.decoupled
    finally:
        core.close()


def test_steps_no_repository_holds_are_named_before_any_step_loads(tmp_path: Path) -> None:
    """qa/L0_model_config ensemble/non_existing_model: Triton names the missing steps even when another step
    would fail to load (here: a step with no model file)."""
    (tmp_path / "broken_step" / "1").mkdir(parents=True)
    (tmp_path / "broken_step" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + IO)
    (tmp_path / "non_existing_model" / "1").mkdir(parents=True)
    (tmp_path / "non_existing_model" / "config.pbtxt").write_text(_ensemble(
        _step("broken_step", {"in": "data"}, {"out": "t"}), _step("nowhere", {"in": "t"}, {"out": "prob"})))
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        index = {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}
    finally:
        core.close()
    state, reason = index["non_existing_model"]
    assert state == "UNAVAILABLE"
    assert "ensemble non_existing_model contains models that are not available or ambiguous: nowhere" in reason

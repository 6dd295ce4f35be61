"""Triton's config validation runs on the config as written, before the model file is looked for, with
Triton's words (the text Triton's L0_model_config expects in its log), and whether or not a model file exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from models import identity_model_bytes, write_model

IO = (
    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)
BATCH_IO = IO + 'output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'


def _control(name: str, kind: str, values: str = "int32_false_true: [ 0, 1 ]") -> str:
    return f'control_input [ {{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }} ]\n'


#: config (after `platform: "onnxruntime_onnx"`), the text Triton's log has for it.
CASES: dict[str, tuple[str, str]] = {
    "negative_max_batch_size": ("max_batch_size: -1\n" + IO,
                                "'max_batch_size' must be non-negative value for negative_max_batch_size"),
    "zero_dim_input": ('max_batch_size: 4\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 0 ] } ]\n',
                       "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size "
                       "dimension for zero_dim_input"),
    "missing_datatype": ('max_batch_size: 4\ninput [ { name: "INPUT0" dims: [ 4 ] } ]\n',
                         "model input 'INPUT0' must specify 'data_type' for missing_datatype"),
    "reshape_count": ('max_batch_size: 4\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
                      'reshape { shape: [ 3 ] } } ]\n',
                      "model input 'INPUT0' has different size for dims and reshape for reshape_count"),
    "reshape_variable": ('max_batch_size: 4\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] '
                         'reshape { shape: [ -1, 2, -1 ] } } ]\n',
                         "model output 'OUTPUT0' has different number of variable-size dimensions for dims and "
                         "reshape for reshape_variable"),
    "reshape_zero": ('max_batch_size: 4\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
                     'reshape { shape: [ 0 ] } } ]\n',
                     "model output 'OUTPUT0' reshape dimensions must be integer >= 1, or -1 to indicate a "
                     "variable-size dimension for reshape_zero"),
    "reshape_nobatch_empty": ('max_batch_size: 0\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] '
                              'reshape { } } ]\n',
                              "model input 'INPUT0' cannot have empty reshape for non-batching model as scalar "
                              "tensors are not supported for reshape_nobatch_empty"),
    "preferred_too_big": ("max_batch_size: 4\n" + IO + "dynamic_batching { preferred_batch_size: [ 8 ] }\n",
                          "dynamic batching preferred size must be <= max batch size for preferred_too_big"),
    "default_priority": ("max_batch_size: 4\n" + IO + "dynamic_batching { priority_levels: 3 "
                         "default_priority_level: 4 }\n",
                         "default priority level must be in range [1, 3] for default_priority"),
    "queue_policy_level": ("max_batch_size: 4\n" + IO + "dynamic_batching { priority_levels: 2 "
                           "default_priority_level: 1 priority_queue_policy { key: 5 value { } } }\n",
                           "priority queue policy must have priority level in range [1, 2] for queue_policy_level"),
    "ordering_levels": ("max_batch_size: 4\n" + IO + "dynamic_batching { preserve_ordering: true priority_levels: 2 "
                        "default_priority_level: 1 }\n",
                        "Only one priority level is allowed when 'preserve_ordering' is true for ordering_levels"),
    "ordering_delay": ("max_batch_size: 4\n" + IO + "dynamic_batching { preserve_ordering: true default_queue_policy "
                       "{ timeout_action: DELAY default_timeout_microseconds: 100 } }\n",
                       "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for "
                       "ordering_delay"),
    "start_twice": ("max_batch_size: 4\n" + IO + "sequence_batching { " + _control("S1", "CONTROL_SEQUENCE_START")
                    + _control("S2", "CONTROL_SEQUENCE_START") + "}\n",
                    "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for start_twice"),
    "control_two_kinds": ("max_batch_size: 4\n" + IO + "sequence_batching { "
                          + _control("START", "CONTROL_SEQUENCE_START") + _control("START", "CONTROL_SEQUENCE_READY")
                          + "}\n",
                          "sequence batching control tensor 'START' is specified for multiple control kinds for "
                          "control_two_kinds"),
    "control_no_value": ("max_batch_size: 4\n" + IO + "sequence_batching { "
                         + _control("READY", "CONTROL_SEQUENCE_READY", "") + "}\n",
                         "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                         "'bool_false_true' for CONTROL_SEQUENCE_READY for control_no_value"),
    "cpu_with_gpus": ("max_batch_size: 4\n" + IO + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]\n",
                      "instance group cpu_with_gpus_0 of model cpu_with_gpus has kind KIND_CPU but specifies one or "
                      "more GPUs"),
    "batch_input_sources": ("max_batch_size: 4\n" + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" '
                            "data_type: TYPE_FP32 } ]\n",
                            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for "
                            "batch_input_sources"),
    "batch_input_unknown": ("max_batch_size: 4\n" + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" '
                            'data_type: TYPE_FP32 source_input: "NOPE" } ]\n',
                            "unknown source input name 'NOPE'"),
    "batch_output_twice": ("max_batch_size: 4\n" + BATCH_IO + "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
                           'target_name: [ "OUTPUT0", "OUTPUT0" ] source_input: "INPUT0" } ]\n',
                           "target output name 'OUTPUT0' can only be specified once"),
    "batch_output_unknown": ("max_batch_size: 4\n" + IO + "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
                             'target_name: "NOPE" source_input: "INPUT0" } ]\n',
                             "unknown target output name 'NOPE'"),
}


def _load(root: Path) -> dict[str, tuple[str, str]]:
    core = Core(root, RepositoryOptions(use_gpu=False, auto_complete=False))
    core.load_models()
    try:
        return {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}
    finally:
        core.close()


@pytest.mark.parametrize("with_model_file", [False, True], ids=["config-only", "with-model-file"])
def test_configs_triton_refuses_fail_with_tritons_words(tmp_path: Path, with_model_file: bool) -> None:
    for name, (config, _) in CASES.items():
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n' + config)
        if with_model_file:
            (folder / "1" / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4]))
    index = _load(tmp_path)
    for name, (_, words) in CASES.items():
        state, reason = index[name]
        assert state == "UNAVAILABLE", name
        assert words in reason, (name, reason)


def test_valid_configs_still_load(tmp_path: Path) -> None:
    write_model(tmp_path, "plain", identity_model_bytes(TensorProto.FLOAT, [4]),
                config="max_batch_size: 4\n" + IO
                + "dynamic_batching { preferred_batch_size: [ 2, 4 ] priority_levels: 2 default_priority_level: 1 }\n")
    state, reason = _load(tmp_path)["plain"]
    assert state == "READY", reason


def test_a_config_that_leaves_out_a_model_input_is_refused_at_load(tmp_path: Path) -> None:
    from onnx import helper

    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, ["N", 4])
    out = helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["SUM"])], "g", [a, b], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    write_model(tmp_path, "half_declared", model.SerializeToString(), config=(
        'max_batch_size: 4\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'))
    state, reason = _load(tmp_path)["half_declared"]
    assert state == "UNAVAILABLE"
    assert "unable to load model 'half_declared', configuration expects 1 inputs, model provides 2" in reason


def test_the_config_api_shows_tritons_defaults(tmp_path: Path) -> None:
    write_model(tmp_path, "plain", identity_model_bytes(TensorProto.FLOAT, [4]),
                config='max_batch_size: 4\ninstance_group [ { kind: KIND_CPU }, { kind: KIND_CPU count: 1 } ]\n')
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        config = core.model_config("plain")
        assert config.version_policy.WhichOneof("policy_choice") == "latest"
        assert config.version_policy.latest.num_versions == 1
        assert config.default_model_filename == "model.onnx"
        assert config.optimization.input_pinned_memory.enable and config.optimization.output_pinned_memory.enable
        assert [g.name for g in config.instance_group] == ["plain_0", "plain_1"]
    finally:
        core.close()


def test_tritons_special_cases_platform_pair_and_runtime(tmp_path: Path) -> None:
    """qa/L0_model_config special_cases: a misspelt platform beside a model.onnx, and runtime libraries that
    are missing or leave the model's folder, refused with Triton's words."""
    write_model(tmp_path, "invalid_platform", identity_model_bytes(TensorProto.FLOAT, [4]),
                config='platform: "onnxruntim"\nmax_batch_size: 4\n' + IO)
    identity = 'backend: "identity"\nmax_batch_size: 2\n' + IO + "instance_group [ { kind: KIND_CPU } ]\n"
    for name, runtime in (("invalid_runtime", "__invalid_runtime__"),
                          ("runtime_escape", "../dummy_runtime/libtriton_identity.so")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(identity + f'runtime: "{runtime}"\n')
    (tmp_path / "runtime_escape" / "dummy_runtime").mkdir()
    (tmp_path / "runtime_escape" / "dummy_runtime" / "libtriton_identity.so").write_bytes(b"")
    index = _load(tmp_path)
    expected = {
        "invalid_platform": "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime",
        "invalid_runtime": "unable to find backend library '__invalid_runtime__' for model 'invalid_runtime'",
        "runtime_escape": "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend directory",
    }
    for name, words in expected.items():
        state, reason = index[name]
        assert state == "UNAVAILABLE", name
        assert words in reason, (name, reason)


def test_a_known_backend_with_another_backends_platform_is_refused(tmp_path: Path) -> None:
    write_model(tmp_path, "mixed", identity_model_bytes(TensorProto.FLOAT, [4]),
                config='platform: "tensorrt_plan"\nbackend: "onnxruntime"\nmax_batch_size: 4\n' + IO)
    state, reason = _load(tmp_path)["mixed"]
    assert state == "UNAVAILABLE"
    assert "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime" in reason


def test_own_runtime_names_still_load(tmp_path: Path) -> None:
    write_model(tmp_path, "named", identity_model_bytes(TensorProto.FLOAT, [4]),
                config='backend: "onnxruntime"\nruntime: "libtriton_onnxruntime.so"\nmax_batch_size: 4\n' + IO)
    state, reason = _load(tmp_path)["named"]
    assert state == "READY", reason


def test_a_model_nothing_names_a_backend_for_fails_with_tritons_words(tmp_path: Path) -> None:
    """qa/L0_model_config common/no_version and custom/*: no backend, platform or model file; Triton then reads
    the backend from a ``<model>.<backend>`` name; fastoip's layout hint comes first, Triton's words after."""
    for name in ("no_version", "no_delimiter", "unknown_backend.unknown"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text("max_batch_size: 1\n" + IO)
    (tmp_path / "no_delimiter" / "1").mkdir()
    index = _load(tmp_path)
    for name in ("no_version", "no_delimiter"):
        state, reason = index[name]
        assert state == "UNAVAILABLE"
        assert (f"Invalid model name: Could not determine backend for model '{name}' with no backend in model "
                "configuration. Expected model name of the form 'model.<backend_name>'.") in reason
    assert index["no_version"][1].startswith("create the version folder no_version/1/ and put model.onnx in it")
    state, reason = index["unknown_backend.unknown"]
    assert state == "UNAVAILABLE"
    assert ("unable to find backend library for backend 'unknown', try specifying runtime on the model "
            "configuration.") in reason


def test_model_metrics_are_checked_and_their_buckets_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """qa/L0_model_config model_metrics: Triton's words for a broken ``model_metrics``; the histogram buckets a
    model sets for nv_inference_first_response_histogram_ms are its own; another family is a warning."""
    from fastoip.metrics import MetricsConfig

    broken = {
        "no_metric_identifier": ("histogram_options { buckets: [ 1, 2 ] }",
                                 "metric control must specify 'metric_identifier'"),
        "empty_metric_family": ('metric_identifier { family: "" } histogram_options { buckets: [ 1 ] }',
                                "metric identifier must specify non-empty 'family'"),
        "no_histogram_options": ('metric_identifier { family: "nv_inference_first_response_histogram_ms" }',
                                 "metric control must specify 'histogram_options'"),
        "empty_buckets": ('metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
                          "histogram_options { }", "histogram options must specify non-empty 'buckets'"),
    }
    good = {
        "custom": 'metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
                  "histogram_options { buckets: [ 1, 2, 4, 8 ] }",
        "unknown_family": 'metric_identifier { family: "nv_inference_request_success" } '
                          "histogram_options { buckets: [ 1, 2 ] }",
    }
    for name, control in {**{k: v[0] for k, v in broken.items()}, **good}.items():
        write_model(tmp_path, name, identity_model_bytes(TensorProto.FLOAT, [4]),
                    config="max_batch_size: 4\n" + IO + f"model_metrics {{ metric_control [ {{ {control} }} ] }}\n")
    core = Core(tmp_path, RepositoryOptions(use_gpu=False), metrics_config=MetricsConfig(histogram_latencies=True))
    with caplog.at_level("WARNING", logger="fastoip"):
        core.load_models()
    try:
        index = {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}
        for name, (_, words) in broken.items():
            assert index[name][0] == "UNAVAILABLE" and words in index[name][1], (name, index[name])
        assert index["custom"][0] == index["unknown_family"][0] == "READY"
        latency = core.repository.get("custom").stats.latency
        assert latency is not None and latency.config.first_response_buckets_ms == (1, 2, 4, 8)
        other = core.repository.get("unknown_family").stats.latency
        assert other is not None and other.config.first_response_buckets_ms == (100, 500, 2000, 5000)
        assert ("Metric family 'nv_inference_request_success' in 'metric_identifier' is not a customizable metric "
                "in Triton core.") in caplog.text
    finally:
        core.close()


def test_a_runtime_leading_out_of_the_model_is_refused_whether_or_not_it_exists(tmp_path: Path) -> None:
    """No probing of the server's disk through ``runtime``: the same answer for a file that exists and one that
    does not, once the name leads out of the model's folders."""
    config = 'backend: "identity"\nmax_batch_size: 2\n' + IO
    for name, runtime in (("exists", "../../exists/config.pbtxt"), ("absent", "../../nowhere/libx.so")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config + f'runtime: "{runtime}"\n')
    index = _load(tmp_path)
    for name in ("exists", "absent"):
        state, reason = index[name]
        assert state == "UNAVAILABLE"
        assert "escapes backend directory" in reason, reason

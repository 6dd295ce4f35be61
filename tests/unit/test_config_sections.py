"""Configs mean what they say: unbuilt sections refused at load, ORT optimisation settings honoured, hints logged,
and auto-complete as Triton's onnxruntime backend does it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from onnx import TensorProto

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from models import identity_model_bytes, write_model

IO = (
    'input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }\n'
    'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }\n'
)

REFUSED = {
    "decoupled": ("max_batch_size: 4\nmodel_transaction_policy { decoupled: true }\n", "decoupled"),
}


def _core(root: Path, **options: object) -> Core:
    core = Core(root, RepositoryOptions(use_gpu=False, **options))  # type: ignore[arg-type]
    core.load_models()
    return core


def test_sections_that_change_results_are_refused_with_the_reason(tmp_path: Path) -> None:
    for name, (config, _) in REFUSED.items():
        write_model(tmp_path, name, identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    write_model(tmp_path, "plain", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 4\n")
    core = _core(tmp_path)
    try:
        index = {entry.name: entry for entry in core.repository_index()}
        for name, (_, words) in REFUSED.items():
            assert index[name].state == "UNAVAILABLE", name
            assert index[name].reason.startswith(f"failed to load '{name}'"), index[name]
            assert words in index[name].reason and "not implemented" in index[name].reason
        assert index["plain"].state == "READY"
        assert not core.server_ready()  # the refused models count: strict readiness says not ready
    finally:
        core.close()


def test_optimisation_settings_reach_the_onnx_runtime_session(tmp_path: Path) -> None:
    config = (
        "max_batch_size: 4\noptimization { graph { level: 2 } }\n"
        'parameters { key: "execution_mode" value { string_value: "1" } }\n'
        # ORT runs sequentially anyway with one inter-op thread: parallel mode needs a pool
        'parameters { key: "inter_op_thread_count" value { string_value: "2" } }\n'
        'parameters { key: "enable_mem_pattern" value { string_value: "false" } }\n'
        'parameters { key: "enable_mem_arena" value { string_value: "false" } }\n'
    )
    write_model(tmp_path, "tuned", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    write_model(tmp_path, "default", identity_model_bytes(TensorProto.FLOAT, [4]))
    core = _core(tmp_path)
    try:
        import onnxruntime as ort

        tuned = core.repository.get("tuned").backends[0].session.get_session_options()
        assert tuned.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        assert tuned.execution_mode == ort.ExecutionMode.ORT_PARALLEL
        assert not tuned.enable_mem_pattern and not tuned.enable_cpu_mem_arena
        plain = core.repository.get("default").backends[0].session.get_session_options()
        assert plain.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        assert plain.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    finally:
        core.close()


def test_bad_execution_mode_is_refused_naming_it(tmp_path: Path) -> None:
    config = 'max_batch_size: 4\nparameters { key: "execution_mode" value { string_value: "2" } }\n'
    write_model(tmp_path, "bad_mode", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    core = _core(tmp_path)
    try:
        [entry] = core.repository_index()
        assert entry.state == "UNAVAILABLE" and "execution_mode are 0 or 1 but got 2" in entry.reason
    finally:
        core.close()


def _threads(core: Core, model: str) -> tuple[int, int]:
    options = core.repository.get(model).backends[0].session.get_session_options()
    return options.intra_op_num_threads, options.inter_op_num_threads


def test_onnx_runtime_threads_default_to_ort_default_as_triton(tmp_path: Path) -> None:
    """No parameter and no --ort-threads: 0, ORT's own default (one intra-op thread per physical core)."""
    write_model(tmp_path, "plain", identity_model_bytes(TensorProto.FLOAT, [4]))
    pinned = 'max_batch_size: 4\nparameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
    write_model(tmp_path, "pinned", identity_model_bytes(TensorProto.FLOAT, [4]), config=pinned)
    core = _core(tmp_path)
    try:
        assert _threads(core, "plain") == (0, 0)
        assert _threads(core, "pinned") == (1, 0)
    finally:
        core.close()


def test_thread_counts_past_the_cores_are_capped(tmp_path: Path) -> None:
    """Issue 37: intra_op_thread_count 300 built +299 threads; more threads than cores only cost."""
    import os

    config = "max_batch_size: 4\n" + 'parameters { key: "intra_op_thread_count" value { string_value: "300" } }\n'
    write_model(tmp_path, "many", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    core = _core(tmp_path)
    try:
        assert _threads(core, "many")[0] == min(300, os.cpu_count() or 1)
    finally:
        core.close()


def test_config_thread_counts_win_over_the_server_setting(tmp_path: Path) -> None:
    config = (
        "max_batch_size: 4\n"
        'parameters { key: "intra_op_thread_count" value { string_value: "0" } }\n'
        'parameters { key: "inter_op_thread_count" value { string_value: "1" } }\n'
    )
    write_model(tmp_path, "own", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    write_model(tmp_path, "server", identity_model_bytes(TensorProto.FLOAT, [4]))
    core = _core(tmp_path, intra_op_threads=2)  # what `--ort-threads 2` sets
    try:
        assert _threads(core, "own") == (0, 1)  # "0" in the config: ORT's default, not the server's 2
        assert _threads(core, "server") == (2, 0)
    finally:
        core.close()


def test_bad_thread_count_is_refused_naming_it(tmp_path: Path) -> None:
    config = 'max_batch_size: 4\nparameters { key: "intra_op_thread_count" value { string_value: "two" } }\n'
    write_model(tmp_path, "bad_threads", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    core = _core(tmp_path)
    try:
        [entry] = core.repository_index()
        assert entry.state == "UNAVAILABLE"
        assert "'intra_op_thread_count' must be an integer, got 'two'" in entry.reason
    finally:
        core.close()


def test_hints_fastoip_cannot_honour_are_logged_as_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # optimization.cuda: Triton's onnxruntime backend does not read it either.  The accelerator is honoured
    # (backends/ort_providers.py); without the OpenVINO EP here it is logged as not used, not as ignored.
    config = (
        "max_batch_size: 4\n"
        "optimization { cuda { graphs: true }\n"
        "  execution_accelerators { cpu_execution_accelerator { name: \"openvino\" } } }\n"
    )
    write_model(tmp_path, "hinted", identity_model_bytes(TensorProto.FLOAT, [4]), config=config)
    with caplog.at_level(logging.WARNING, logger="fastoip"):
        core = _core(tmp_path)
    try:
        assert core.model_ready("hinted")
        messages = [r.getMessage() for r in caplog.records]
        ignored = [m for m in messages if "is ignored" in m]
        assert any("optimization.cuda" in m for m in ignored)
        assert not any("optimization.execution_accelerators" in m for m in ignored)
        assert any("model 'hinted': the openvino execution accelerator is not used" in m for m in messages)
    finally:
        core.close()


def test_mlserver_fields_without_effect_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model_dir = tmp_path / "py"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(
        "import fastoip\n\nclass M(fastoip.Model):\n    def predict(self, inputs, parameters):\n"
        "        return {'y': inputs['x']}\n"
    )
    (model_dir / "model-settings.json").write_text(
        '{"name": "py", "parallel_workers": 2, "warm_workers": true, "parameters": {"uri": "./x"},'
        ' "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],'
        ' "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}]}'
    )
    with caplog.at_level(logging.INFO, logger="fastoip"):
        core = _core(tmp_path)
    try:
        messages = [r.getMessage() for r in caplog.records]
        # warm_workers: accepted, a no-op (deprecated in MLServer 1.7 too), said at INFO, not as a warning
        assert any("field 'warm_workers' is accepted and has no effect" in m for m in messages)
        assert not any("warm_workers" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
        # parallel_workers is the instance count; parameters.uri is the runtime's to read
        assert not any("'parallel_workers'" in m or "'uri'" in m for m in messages)
        assert sum(group.count for group in core.model_config("py").instance_group) == 2
    finally:
        core.close()


def test_auto_complete_gives_tritons_default_batch_size_and_a_dynamic_batcher(tmp_path: Path) -> None:
    write_model(tmp_path, "auto", identity_model_bytes(TensorProto.FLOAT, [4]))
    write_model(tmp_path, "explicit", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    write_model(tmp_path, "one", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 1\n")
    write_model(tmp_path, "fixed", identity_model_bytes(TensorProto.FLOAT, [4], batch=False))
    core = _core(tmp_path)
    try:
        auto = core.model_config("auto")
        assert auto.max_batch_size == 4 and auto.HasField("dynamic_batching")
        assert core.model_config("explicit").HasField("dynamic_batching")
        assert not core.model_config("one").HasField("dynamic_batching")  # Triton: only above 1
        assert core.model_config("fixed").max_batch_size == 0
        assert not core.model_config("fixed").HasField("dynamic_batching")
    finally:
        core.close()
    core = _core(tmp_path, default_max_batch_size=16)
    try:
        assert core.model_config("auto").max_batch_size == 16
    finally:
        core.close()


def test_strict_model_config_needs_a_complete_config(tmp_path: Path) -> None:
    write_model(tmp_path, "bare", identity_model_bytes(TensorProto.FLOAT, [4]))
    write_model(tmp_path, "full", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 4\n" + IO)
    core = _core(tmp_path, auto_complete=False)
    try:
        index = {entry.name: entry for entry in core.repository_index()}
        assert index["bare"].state == "UNAVAILABLE" and "auto-complete is disabled" in index["bare"].reason
        assert index["full"].state == "READY"
        assert not core.model_config("full").HasField("dynamic_batching")  # no auto-complete: no batcher added
    finally:
        core.close()


def test_a_config_listing_inputs_and_outputs_gets_no_auto_batcher(tmp_path: Path) -> None:
    """Triton's onnxruntime backend skips its auto-complete when the config lists both inputs and outputs
    (qa/L0_model_config autofill_noplatform_success/onnx/cpu_instance): no dynamic batcher is added then."""
    write_model(tmp_path, "listed", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n" + IO)
    write_model(tmp_path, "inputs_only", identity_model_bytes(TensorProto.FLOAT, [4]),
                config='max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    core = _core(tmp_path)
    try:
        assert not core.model_config("listed").HasField("dynamic_batching")
        assert core.model_config("inputs_only").HasField("dynamic_batching")
    finally:
        core.close()


def test_a_dynamic_batcher_shows_tritons_preferred_batch_size(tmp_path: Path) -> None:
    """Triton's config API writes ``preferred_batch_size: [max_batch_size]`` for a dynamic batcher that names none
    (qa/L0_model_config autofill_noplatform_success/onnx/empty_config, python/dynamic_batching)."""
    write_model(tmp_path, "auto", identity_model_bytes(TensorProto.FLOAT, [4]))
    write_model(tmp_path, "named", identity_model_bytes(TensorProto.FLOAT, [4]),
                config="max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 2 ] }\n")
    core = _core(tmp_path)
    try:
        assert list(core.model_config("auto").dynamic_batching.preferred_batch_size) == [4]
        assert list(core.model_config("named").dynamic_batching.preferred_batch_size) == [2]
    finally:
        core.close()

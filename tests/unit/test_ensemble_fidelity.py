"""Ensembles checked at load as Triton checks them, in Triton's words: steps that batch less than the ensemble,
shapes that disagree between steps, a step pinned to a version that is not loaded, ensembles that depend on each
other (an error, not a RecursionError); and a batching ensemble with a non-batching step, which Triton accepts."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from fastoip.types import InferInput, InferRequest, RequestedOutput


def _identity(width: int, batch_dim: str | int = "N") -> bytes:
    inp = helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch_dim, width])
    out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch_dim, width])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def _model(root: Path, name: str, config: str, data: bytes, versions: tuple[int, ...] = (1,)) -> None:
    for version in versions:
        (root / name / str(version)).mkdir(parents=True, exist_ok=True)
        (root / name / str(version) / "model.onnx").write_bytes(data)
    (root / name / "config.pbtxt").write_text(config)


def _ensemble(root: Path, name: str, max_batch: int, steps: list[tuple[str, int]], width: int = 4) -> None:
    """A chain IN -> step0 -> ... -> OUT of (model, version) steps with X/Y tensors."""
    wiring = []
    for index, (model, version) in enumerate(steps):
        source = "IN" if index == 0 else f"t{index}"
        target = "OUT" if index == len(steps) - 1 else f"t{index + 1}"
        wiring.append(f'{{ model_name: "{model}" model_version: {version} input_map {{ key: "X" value: "{source}" }} '
                      f'output_map {{ key: "Y" value: "{target}" }} }}')
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}" platform: "ensemble" max_batch_size: {max_batch}\n'
        f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
        f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(wiring)} ] }}\n"
    )


def _io(width: int, max_batch: int, dims: str | None = None) -> str:
    dims = dims or str(width)
    return (f"max_batch_size: {max_batch}\n"
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n')


def _core(root: Path) -> Core:
    core = Core(root, RepositoryOptions(use_gpu=False), worker_threads=2)
    core.load_models()
    return core


def _reasons(core: Core) -> dict[str, tuple[str, str]]:
    return {entry.name: (entry.state, entry.reason) for entry in core.repository_index()}


def test_ensembles_triton_refuses(tmp_path: Path) -> None:
    _model(tmp_path, "batch8", _io(4, 8), _identity(4))
    _model(tmp_path, "batch2", _io(4, 2), _identity(4))
    _model(tmp_path, "wide", _io(6, 8), _identity(6))
    _model(tmp_path, "versioned", _io(4, 8), _identity(4), versions=(1, 2))
    _ensemble(tmp_path, "too_big", 8, [("batch8", -1), ("batch2", -1)])
    _ensemble(tmp_path, "shapes", 8, [("batch8", -1), ("wide", -1)])
    _ensemble(tmp_path, "pinned", 8, [("versioned", 1)])  # the default policy loads version 2 only
    _ensemble(tmp_path, "ring_a", 8, [("ring_b", -1)])
    _ensemble(tmp_path, "ring_b", 8, [("ring_a", -1)])
    core = _core(tmp_path)
    try:
        index = _reasons(core)
        assert index["too_big"][0] == "UNAVAILABLE"
        assert ("ensemble too_big allows maximum batch size 8, but it contains model batch2 which only allows "
                "maximum batch size to be 2") in index["too_big"][1]
        assert "inconsistent shape: [-1,4] is inferred from model batch8 while [-1,6] is inferred from model wide" in (
            index["shapes"][1])
        assert "ensemble 'pinned' depends on 'versioned' whose required version 1 is not loaded." in index["pinned"][1]
        for ring in ("ring_a", "ring_b"):
            state, reason = index[ring]
            assert state == "UNAVAILABLE" and "circular dependency between ensembles" in reason, reason
        assert core.model_ready("batch8") and core.model_ready("versioned")
    finally:
        core.close()


def test_a_batching_ensemble_runs_a_non_batching_step(tmp_path: Path) -> None:
    _model(tmp_path, "batching", _io(4, 8), _identity(4))
    _model(tmp_path, "flat", _io(4, 0, "-1, 4"), _identity(4))
    _ensemble(tmp_path, "mixed", 8, [("batching", -1), ("flat", -1)])
    core = _core(tmp_path)
    try:
        state, reason = _reasons(core)["mixed"]
        assert state == "READY", reason
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        response = core.infer(InferRequest("mixed", inputs=[InferInput("IN", "FP32", data.shape, data)]))
        (out,) = response.outputs
        np.testing.assert_array_equal(out.data, data)
    finally:
        core.close()


def test_steps_no_requested_output_needs_are_not_run(tmp_path: Path) -> None:
    """Triton prunes them: a request for OUT_A runs only the branch that produces it."""
    for name in ("branch_a", "branch_b"):
        _model(tmp_path, name, _io(4, 8), _identity(4))
    (tmp_path / "fork" / "1").mkdir(parents=True)
    (tmp_path / "fork" / "config.pbtxt").write_text(
        'name: "fork" platform: "ensemble" max_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT_A" data_type: TYPE_FP32 dims: [ 4 ] },\n'
        '         { name: "OUT_B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "branch_a" model_version: -1 input_map { key: "X" value: "IN" }\n'
        '    output_map { key: "Y" value: "OUT_A" } },\n'
        '  { model_name: "branch_b" model_version: -1 input_map { key: "X" value: "IN" }\n'
        '    output_map { key: "Y" value: "OUT_B" } }\n'
        '] }\n')
    core = _core(tmp_path)
    try:
        data = np.ones((1, 4), dtype=np.float32)

        def runs(model: str) -> int:
            (stats,) = core.statistics(model)
            return int(stats.inference_stats.success.count)

        before = {name: runs(name) for name in ("branch_a", "branch_b")}
        request = InferRequest("fork", inputs=[InferInput("IN", "FP32", data.shape, data)],
                               outputs=[RequestedOutput("OUT_A")])
        assert [o.name for o in core.infer(request).outputs] == ["OUT_A"]
        assert runs("branch_a") - before["branch_a"] == 1 and runs("branch_b") == before["branch_b"]
        both = InferRequest("fork", inputs=[InferInput("IN", "FP32", data.shape, data)])
        assert sorted(o.name for o in core.infer(both).outputs) == ["OUT_A", "OUT_B"]
        assert runs("branch_b") - before["branch_b"] == 1
    finally:
        core.close()


def test_a_sequence_model_runs_as_an_ensemble_step(tmp_path: Path) -> None:
    """Triton hands each step the ensemble request's sequence id and flags (and its other parameters)."""
    from models import sequence_controls, simple_sequence_model_bytes

    _model(tmp_path, "seq", "max_batch_size: 4\n"
           'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
           'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
           f"sequence_batching {{ {sequence_controls('START', 'READY')} }}\n", simple_sequence_model_bytes())
    (tmp_path / "seq_ens" / "1").mkdir(parents=True)
    (tmp_path / "seq_ens" / "config.pbtxt").write_text(
        'name: "seq_ens" platform: "ensemble" max_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "seq" model_version: -1 input_map { key: "INPUT" value: "IN" }\n'
        '  output_map { key: "OUTPUT" value: "OUT" } } ] }\n')
    core = _core(tmp_path)
    try:
        def step(value: int, start: bool) -> int:
            data = np.array([[value]], dtype=np.int32)
            request = InferRequest("seq_ens", inputs=[InferInput("IN", "INT32", data.shape, data)],
                                   parameters={"sequence_id": 42, "sequence_start": start})
            (out,) = core.infer(request).outputs
            return int(out.data[0, 0])

        assert step(5, start=True) == 6  # (INPUT + START) * READY
        assert step(5, start=False) == 5
    finally:
        core.close()


TAGGER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
                # a value of 1 opens sequence 42, a value of 9 ends it
                parameters = {"sequence_id": 42, "sequence_start": bool(value[0, 0] == 1)}
                if value[0, 0] == 9:
                    parameters["sequence_end"] = True
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("TAGGED", value)], parameters=parameters))
            return responses
"""


def test_a_steps_sequence_parameters_reach_later_steps_and_the_response(tmp_path: Path) -> None:
    """Triton's ensemble: sequence parameters a step answers with mark its tensors; the steps that read them run
    in that sequence, and the ensemble's response echoes them for its marked outputs."""
    from models import sequence_controls, simple_sequence_model_bytes
    from python_models import write_python_model

    write_python_model(tmp_path, "tagger", TAGGER, 'backend: "python"\nmax_batch_size: 4\n'
                       'input [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                       'output [ { name: "TAGGED" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    _model(tmp_path, "seq", "max_batch_size: 4\n"
           'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
           'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
           f"sequence_batching {{ {sequence_controls('START', 'READY')} }}\n", simple_sequence_model_bytes())
    (tmp_path / "tagged_seq" / "1").mkdir(parents=True)
    (tmp_path / "tagged_seq" / "config.pbtxt").write_text(
        'name: "tagged_seq" platform: "ensemble" max_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '         { name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "tagger" model_version: -1 input_map { key: "VALUE" value: "IN" }\n'
        '    output_map { key: "TAGGED" value: "TAG" } },\n'
        '  { model_name: "seq" model_version: -1 input_map { key: "INPUT" value: "TAG" }\n'
        '    output_map { key: "OUTPUT" value: "OUT" } } ] }\n')
    core = _core(tmp_path)
    try:
        def send(value: int, outputs: tuple[str, ...] = ("OUT", "TAG")) -> tuple[dict, dict]:
            data = np.array([[value]], dtype=np.int32)
            # the ensemble request names no sequence: the tagger's response does
            request = InferRequest("tagged_seq", inputs=[InferInput("IN", "INT32", data.shape, data)],
                                   outputs=[RequestedOutput(name) for name in outputs])
            response = core.infer(request)
            return {out.name: int(out.data[0, 0]) for out in response.outputs}, response.parameters

        values, parameters = send(1)
        assert values == {"OUT": 2, "TAG": 1}  # the sequence model saw START: (INPUT + START) * READY
        assert parameters == {"sequence_id": 42, "sequence_start": True, "sequence_end": False}
        values, parameters = send(5)
        assert values == {"OUT": 5, "TAG": 5}  # same sequence, not a start
        assert parameters == {"sequence_id": 42, "sequence_start": False, "sequence_end": False}
        values, parameters = send(9)
        assert parameters["sequence_end"] is True
        # a step that sets none marks its outputs with the sequence it ran in: the tagger's, here
        values, parameters = send(1, outputs=("OUT",))
        assert values == {"OUT": 2}
        assert parameters == {"sequence_id": 42, "sequence_start": True, "sequence_end": False}
    finally:
        core.close()


def test_the_response_carries_the_sequence_flags_the_steps_ran_with(tmp_path: Path) -> None:
    """Triton's `qa/L0_simple_ensemble` (`test_ensemble_sequence_flags`): steps that are no sequence models still
    answer with the ensemble request's sequence id and flags; with no sequence, id 0 and both flags false."""
    _model(tmp_path, "plain", _io(4, 8), _identity(4))
    _ensemble(tmp_path, "chain", 8, [("plain", -1), ("plain", -1)])
    core = _core(tmp_path)
    try:
        def send(parameters: dict) -> dict:
            data = np.ones((1, 4), dtype=np.float32)
            request = InferRequest("chain", inputs=[InferInput("IN", "FP32", data.shape, data)],
                                   parameters=parameters)
            return dict(core.infer(request).parameters or {})

        assert send({"sequence_id": 7, "sequence_start": True}) == {
            "sequence_id": 7, "sequence_start": True, "sequence_end": False}
        assert send({"sequence_id": 7}) == {"sequence_id": 7, "sequence_start": False, "sequence_end": False}
        assert send({"sequence_id": 7, "sequence_end": True}) == {
            "sequence_id": 7, "sequence_start": False, "sequence_end": True}
        assert send({}) == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    finally:
        core.close()


PARTIAL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
                # SKIPPED is in the config, but this model never answers it
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + a)]))
            return responses
"""


def test_an_output_a_composing_model_left_out_is_left_out_of_the_response(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Triton's `qa/L0_simple_ensemble` (`test_ensemble_partial_add_sub`): the ensemble answers with the outputs
    it has and logs "Composing models did not output tensor OUTPUT1" at verbose level (it hung before: the
    request never ended); a step waiting on the missing tensor does not keep the request open either."""
    from python_models import write_python_model

    write_python_model(tmp_path, "partial", PARTIAL, 'backend: "python"\nmax_batch_size: 4\n'
                       'input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
                       'output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 2 ] },\n'
                       '         { name: "SKIPPED" data_type: TYPE_INT32 dims: [ 2 ] } ]\n')
    (tmp_path / "uses_skipped" / "1").mkdir(parents=True)
    (tmp_path / "uses_skipped" / "1" / "model.onnx").write_bytes(_int_identity())
    (tmp_path / "uses_skipped" / "config.pbtxt").write_text(
        "max_batch_size: 4\n"
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]\n')
    (tmp_path / "ens" / "1").mkdir(parents=True)
    (tmp_path / "ens" / "config.pbtxt").write_text(
        'name: "ens" platform: "ensemble" max_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] },\n'
        '         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 2 ] },\n'
        '         { name: "OUTPUT2" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "partial" model_version: -1 input_map { key: "A" value: "IN" }\n'
        '    output_map { key: "SUM" value: "OUTPUT0" } output_map { key: "SKIPPED" value: "OUTPUT1" } },\n'
        '  { model_name: "uses_skipped" model_version: -1 input_map { key: "X" value: "OUTPUT1" }\n'
        '    output_map { key: "Y" value: "OUTPUT2" } } ] }\n')
    core = _core(tmp_path)
    try:
        data = np.array([[1, 2]], dtype=np.int32)
        for wanted in (("OUTPUT0", "OUTPUT1"), ("OUTPUT0", "OUTPUT1", "OUTPUT2")):
            request = InferRequest("ens", inputs=[InferInput("IN", "INT32", data.shape, data)],
                                   outputs=[RequestedOutput(name) for name in wanted])
            with caplog.at_level(logging.DEBUG, logger="fastoip.scheduling"):
                with ThreadPoolExecutor(1) as pool:  # bounded: this request used to hang
                    response = pool.submit(core.infer, request).result(timeout=30.0)
            assert [out.name for out in response.outputs] == ["OUTPUT0"]
            np.testing.assert_array_equal(response.outputs[0].data, data + data)
            assert "Composing models did not output tensor OUTPUT1" in caplog.text
    finally:
        core.close()


def _int_identity() -> bytes:
    inp = helper.make_tensor_value_info("X", TensorProto.INT32, ["N", 2])
    out = helper.make_tensor_value_info("Y", TensorProto.INT32, ["N", 2])
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()

"""Ensembles end to end: pre-process -> classifier -> post-process as one model, over tritonclient.

Steps (ONNX stand-ins built here): ``pre`` UINT8 [4] -> FP32 x0.5; ``net`` FP32 [4] -> MatMul [4x2];
``post`` FP32 [2] -> ArgMax.  The ensemble also returns the intermediate scores.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from python_models import COUNTER, COUNTER_CONFIG, write_python_model
from serverproc import ServerProcess

WEIGHTS = np.array([[1.0, -1.0], [0.5, 0.25], [-2.0, 1.0], [0.0, 3.0]], dtype=np.float32)


def model(nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def io(name: str, elem: int, width: int) -> object:
    return helper.make_tensor_value_info(name, elem, ["N", width])


ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 4 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "SCORES" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "IMAGE" }
    output_map { key: "SCALED" value: "x" } },
  { model_name: "net" model_version: -1 input_map { key: "X" value: "x" } output_map { key: "Y" value: "SCORES" } },
  { model_name: "post" model_version: -1 input_map { key: "SCORES" value: "SCORES" }
    output_map { key: "LABEL" value: "LABEL" } }
] }
"""


def write_repository(root: Path) -> None:
    half = helper.make_tensor("HALF", TensorProto.FLOAT, [1], [0.5])
    models = {
        "pre": model([helper.make_node("Cast", ["RAW"], ["F"], to=TensorProto.FLOAT),
                      helper.make_node("Mul", ["F", "HALF"], ["SCALED"])],
                     [io("RAW", TensorProto.UINT8, 4)], [io("SCALED", TensorProto.FLOAT, 4)], [half]),
        "net": model([helper.make_node("MatMul", ["X", "W"], ["Y"])],
                     [io("X", TensorProto.FLOAT, 4)], [io("Y", TensorProto.FLOAT, 2)],
                     [numpy_helper.from_array(WEIGHTS, "W")]),
        "post": model([helper.make_node("ArgMax", ["SCORES"], ["LABEL"], axis=1, keepdims=1)],
                      [io("SCORES", TensorProto.FLOAT, 2)], [io("LABEL", TensorProto.INT64, 1)]),
    }
    for name, data in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(data)
        (root / name / "config.pbtxt").write_text("max_batch_size: 8\n")
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    broken = ENSEMBLE.replace('name: "pipeline"', 'name: "broken"').replace('value: "x" } }', 'value: "z" } }')
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text(broken)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ensembles")
    write_repository(root)
    with ServerProcess(root, "--strict-readiness", "false", http=True) as proc:
        yield proc


def expected(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = (images.astype(np.float32) * 0.5) @ WEIGHTS
    return scores, scores.argmax(axis=1).reshape(-1, 1)


def test_the_pipeline_answers_as_the_three_calls_would(server: ServerProcess) -> None:
    images = np.array([[1, 2, 3, 4], [9, 0, 0, 1], [0, 0, 8, 0]], dtype=np.uint8)
    scores, labels = expected(images)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("pipeline")
    inp = grpcclient.InferInput("IMAGE", list(images.shape), "UINT8")
    inp.set_data_from_numpy(images)
    result = client.infer("pipeline", [inp])
    np.testing.assert_allclose(result.as_numpy("SCORES"), scores, rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("LABEL"), labels)

    http = httpclient.InferenceServerClient(server.http_url)
    hin = httpclient.InferInput("IMAGE", list(images.shape), "UINT8")
    hin.set_data_from_numpy(images)
    only_label = http.infer("pipeline", [hin], outputs=[httpclient.InferRequestedOutput("LABEL")])
    np.testing.assert_array_equal(only_label.as_numpy("LABEL"), labels)
    assert only_label.as_numpy("SCORES") is None


def test_each_composing_model_reports_its_own_statistics(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def successes(name: str) -> int:
        stats = client.get_inference_statistics(name).model_stats
        return sum(s.inference_stats.success.count for s in stats)

    before = {name: successes(name) for name in ("pipeline", "pre", "net", "post")}
    inp = grpcclient.InferInput("IMAGE", [1, 4], "UINT8")
    inp.set_data_from_numpy(np.ones((1, 4), dtype=np.uint8))
    for _ in range(3):
        client.infer("pipeline", [inp])
    assert {name: successes(name) - count for name, count in before.items()} == {
        "pipeline": 3, "pre": 3, "net": 3, "post": 3}


def test_a_badly_wired_ensemble_is_refused_at_load_with_the_reason(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["broken"].state == "UNAVAILABLE"
    # Triton's words (its core checks the ensemble's data flow before anything loads)
    assert ("output 'LABEL' for ensemble 'broken' is not written: at least one of its depending tensors, 'x', is "
            "not connected") in index["broken"].reason
    assert not client.is_model_ready("broken")


def test_a_step_error_names_the_step(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IMAGE", [9, 4], "UINT8")  # more than max_batch_size
    inp.set_data_from_numpy(np.ones((9, 4), dtype=np.uint8))
    with pytest.raises(InferenceServerException) as err:
        client.infer("pipeline", [inp])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()


def test_loading_an_ensemble_in_explicit_mode_loads_its_models(tmp_path: Path) -> None:
    write_repository(tmp_path)
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "pipeline") as proc:
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        assert all(client.is_model_ready(name) for name in ("pipeline", "pre", "net", "post"))
        assert not client.is_model_ready("broken")
        inp = grpcclient.InferInput("IMAGE", [1, 4], "UINT8")
        images = np.array([[1, 2, 3, 4]], dtype=np.uint8)
        inp.set_data_from_numpy(images)
        np.testing.assert_array_equal(client.infer("pipeline", [inp]).as_numpy("LABEL"), expected(images)[1])


LIMITED = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ 4 ] }} ]
output [ {{ name: "SCALED" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{
  max_inflight_requests: {limit}
  step [ {{ model_name: "slow_pre" model_version: -1 input_map {{ key: "RAW" value: "IMAGE" }}
           output_map {{ key: "SCALED" value: "SCALED" }} }} ]
}}
"""


def test_max_inflight_requests_bounds_the_steps_and_bad_values_fail_the_load(tmp_path: Path) -> None:
    """Triton's ensemble back-pressure over tritonclient: with max_inflight_requests 1 the step's batcher never
    holds two of the ensemble's requests at once (8 executions for 8 concurrent requests); Triton's parser
    words for the values qa/L0_simple_ensemble tries (negative, a string, past uint32)."""
    write_repository(tmp_path)
    (tmp_path / "slow_pre").mkdir()
    (tmp_path / "slow_pre" / "1").symlink_to(tmp_path / "pre" / "1")
    (tmp_path / "slow_pre" / "config.pbtxt").write_text(
        "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n")
    bad = {"negative": ("-5", "Expected integer, got: -"),
           "string": ('"invalid_value"', 'Expected integer, got: "invalid_value"'),
           "large": ("12345678901", "Integer out of range (12345678901)")}
    for name, limit in (("limited", "1"), *((name, value) for name, (value, _) in bad.items())):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(LIMITED.format(name=name, limit=limit))
    with ServerProcess(tmp_path, "--strict-readiness", "false") as proc:
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        index = {m.name: m for m in client.get_model_repository_index().models}
        for name, (_, words) in bad.items():
            assert index[name].state == "UNAVAILABLE" and words in index[name].reason, index[name]
        inp = grpcclient.InferInput("IMAGE", [1, 4], "UINT8")
        inp.set_data_from_numpy(np.full((1, 4), 4, dtype=np.uint8))
        answers: list[object] = []
        done = threading.Semaphore(0)

        def on_answer(result: object, error: object) -> None:
            answers.append(error or result)
            done.release()

        for _ in range(8):
            client.async_infer("limited", [inp], on_answer)
        for _ in range(8):
            assert done.acquire(timeout=60)
        for answer in answers:
            assert isinstance(answer, grpcclient.InferResult), answer
            np.testing.assert_array_equal(answer.as_numpy("SCALED"), np.full((1, 4), 2.0, np.float32))
        (stats,) = client.get_inference_statistics("slow_pre").model_stats
        assert (stats.inference_count, stats.execution_count) == (8, 8)
    assert any("Ensemble model 'limited' configured with max_inflight_requests: 1" in line for line in proc.lines)


DECOUPLED_ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { max_inflight_requests: 2 step [
  { model_name: "counter" model_version: -1 input_map { key: "COUNT" value: "COUNT" }
    output_map { key: "INDEX" value: "index" } },
  { model_name: "slow_same" model_version: -1 input_map { key: "INPUT0" value: "index" }
    output_map { key: "OUTPUT0" value: "INDEX" } } ] }
"""

#: An identity that takes 0.2 s: the counter's final flag is in long before the last answer.
SLOW_SAME = """
    import time
    import fastoip

    class SlowSame(fastoip.Model):
        def predict(self, inputs, parameters):
            time.sleep(0.2)
            return {"OUTPUT0": inputs["INPUT0"]}
"""

SLOW_SAME_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def test_a_decoupled_step_streams_the_ensembles_responses(tmp_path: Path) -> None:
    """Triton's decoupled ensemble step over a tritonclient stream: a response per counter response, through the
    next step; the last, which comes after the counter's final flag, carries triton_final_response (the client
    needs no empty final response), and the ensemble refuses the one-response RPC as a decoupled model does."""
    write_python_model(tmp_path, "counter", COUNTER, COUNTER_CONFIG)
    write_python_model(tmp_path, "slow_same", SLOW_SAME, SLOW_SAME_CONFIG)
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(DECOUPLED_ENSEMBLE)
    answers: queue.Queue[object] = queue.Queue()
    with ServerProcess(tmp_path) as proc:
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
            count.set_data_from_numpy(np.array([1], np.int32))
            client.infer("pipeline", [count])
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        try:
            for n in (4, 0):
                count.set_data_from_numpy(np.array([n], np.int32))
                client.async_stream_infer("pipeline", [count], enable_empty_final_response=n == 0)
                indices, final = [], False
                while not final:
                    answer = answers.get(timeout=60)
                    assert isinstance(answer, grpcclient.InferResult), answer
                    final = answer.get_response().parameters["triton_final_response"].bool_param
                    if answer.get_response().outputs:
                        indices.append(int(answer.as_numpy("INDEX")[0]))
                assert sorted(indices) == list(range(n))
        finally:
            client.stop_stream()

"""Decoupled Python models through the Core in-process: the response sink, the final flag, refusals, warm-up,
and a decoupled model as an ensemble step.

What crosses a socket (gRPC streams, SSE) is in test_decoupled.py and test_generate.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from fastoip.core import CallContext, Core
from fastoip.errors import OneResponseCall
from fastoip.scheduling.job import Job
from fastoip.types import InferInput, InferRequest, InferResponse
from harness import core_on, success_and_failure
from models import identity_model_bytes, write_model
from python_models import COUNTER, COUNTER_CONFIG, write_python_model

WARMED = COUNTER_CONFIG + """
    model_warmup [ { name: "three" batch_size: 1 count: 2
                     inputs { key: "COUNT" value { data_type: TYPE_INT32 dims: [ 1 ] input_data_file: "three" } } } ]
"""

#: counter (decoupled) -> same (an ONNX identity over INT32 [1]), once per counter response.
ENSEMBLE = """
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] } ]
    ensemble_scheduling { %s step [ { model_name: "counter" model_version: -1
                                   input_map { key: "COUNT" value: "COUNT" }
                                   output_map { key: "INDEX" value: "index" } },
                                 { model_name: "same" model_version: -1
                                   input_map { key: "INPUT0" value: "index" }
                                   output_map { key: "OUTPUT0" value: "INDEX" } } ] }
"""


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    root = tmp_path_factory.mktemp("decoupled-core")
    write_python_model(root, "counter", COUNTER, COUNTER_CONFIG)
    warmed = write_python_model(root, "warmed", COUNTER, WARMED)
    (warmed / "warmup").mkdir()
    (warmed / "warmup" / "three").write_bytes(np.array([3], dtype=np.int32).tobytes())
    write_model(root, "same", identity_model_bytes(TensorProto.INT32, [1], "same", batch=False),
                config="max_batch_size: 0\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n")
    for name, limit in (("pipeline", ""), ("limited", "max_inflight_requests: 1")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ENSEMBLE % limit)
    with core_on(root) as opened:
        yield opened


def count_request(n: int, model: str = "counter", **parameters: object) -> InferRequest:
    data = np.array([n], dtype=np.int32)
    return InferRequest(model, parameters=dict(parameters), inputs=[InferInput("COUNT", "INT32", (1,), data)])


def run(core: Core, request: InferRequest) -> tuple[list[InferResponse], Job]:
    """Submit ``request`` with a response sink; every response, then the finished job."""
    responses: list[InferResponse] = []
    finished = threading.Event()
    done: list[Job] = []

    def on_done(job: Job) -> None:
        done.append(job)
        finished.set()

    core.start(request, CallContext(caller_runs=True), on_done, lambda job, response: responses.append(response))
    assert finished.wait(60)
    return responses, done[0]


@pytest.mark.parametrize("count", [0, 1, 25])
def test_responses_reach_the_sink_in_order_then_the_final_flag_alone(core: Core, count: int) -> None:
    before = success_and_failure(core, "counter")
    responses, job = run(core, count_request(count))
    assert [int(r.outputs[0].data[0]) for r in responses] == list(range(count))
    assert job.decoupled and job.response is None and job.error is None
    assert success_and_failure(core, "counter") == (before[0] + 1, before[1])  # one inference per request


def test_a_failure_after_some_responses_is_the_jobs_error(core: Core) -> None:
    before = success_and_failure(core, "counter")
    responses, job = run(core, count_request(5, fail_at=2))
    assert len(responses) == 2
    assert job.error is not None and "no response 2" in job.error.message and job.response is None
    assert success_and_failure(core, "counter") == (before[0], before[1] + 1)


def test_one_response_calls_are_refused_with_tritons_words(core: Core) -> None:
    with pytest.raises(OneResponseCall, match="ModelInfer RPC doesn't support models with decoupled"):
        core.infer(count_request(1))
    with pytest.raises(OneResponseCall):
        core.start(count_request(1), None, lambda job: None)


def test_warmup_runs_a_decoupled_model_before_it_is_ready(core: Core) -> None:
    assert core.model_ready("warmed")
    (stats,) = core.statistics("warmed")
    assert stats.inference_stats.success.count == 0  # warm-up is not counted as inference


@pytest.mark.parametrize("count", [0, 1, 6])
@pytest.mark.parametrize("ensemble", ["pipeline", "limited"])
def test_a_decoupled_step_runs_the_next_step_once_per_response(core: Core, ensemble: str, count: int) -> None:
    """Triton's decoupled ensemble step: each response flows to the next step, each result is one response of
    the ensemble (which is decoupled); the last one ends the call when it comes after the producer's final flag
    (it carries the flag, as Triton's ensemble marks it), else the flag comes alone, as in Triton."""
    assert core.model_config(ensemble).model_transaction_policy.decoupled
    before = success_and_failure(core, "same")
    streamed, job = run(core, count_request(count, model=ensemble))
    assert job.decoupled and job.error is None and (count > 0 or job.response is None)
    responses = streamed + ([job.response] if job.response is not None else [])
    assert sorted(int(r.outputs[0].data[0]) for r in responses) == list(range(count))
    assert all(r.model_name == ensemble and [o.name for o in r.outputs] == ["INDEX"] for r in responses)
    assert success_and_failure(core, "same") == (before[0] + count, before[1])
    with pytest.raises(OneResponseCall):
        core.infer(count_request(1, model=ensemble))


def test_a_decoupled_step_that_fails_after_some_responses_fails_the_ensemble(core: Core) -> None:
    responses, job = run(core, count_request(5, model="pipeline", fail_at=2, delay=0.05))
    assert len(responses) <= 2
    assert job.error is not None and "step 0 ('counter')" in job.error.message and "no response 2" in job.error.message


def test_decoupled_onnx_models_are_refused(tmp_path: Path) -> None:
    write_model(tmp_path, "onnx", identity_model_bytes(TensorProto.FLOAT, [4]),
                config="max_batch_size: 4\nmodel_transaction_policy { decoupled: true }\n")
    with core_on(tmp_path) as core:
        (entry,) = core.repository_index()
        assert entry.state == "UNAVAILABLE"
        assert "not implemented for onnxruntime models (Python models may be decoupled)" in entry.reason


def test_an_ensembles_own_decoupled_flag_is_set_from_its_steps(tmp_path: Path) -> None:
    """As Triton's ensemble: the flag a config writes is replaced by whether a step is decoupled."""
    write_model(tmp_path, "same", identity_model_bytes(TensorProto.INT32, [1], "same", batch=False),
                config="max_batch_size: 0\n")
    (tmp_path / "plain" / "1").mkdir(parents=True)
    (tmp_path / "plain" / "config.pbtxt").write_text(
        'platform: "ensemble" max_batch_size: 0 model_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "same" model_version: -1 input_map { key: "INPUT0" value: "IN" }'
        ' output_map { key: "OUTPUT0" value: "OUT" } } ] }\n')
    with core_on(tmp_path) as core:
        assert not core.model_config("plain").model_transaction_policy.decoupled
        data = np.array([7], dtype=np.int32)
        answer = core.infer(InferRequest("plain", inputs=[InferInput("IN", "INT32", (1,), data)]))
        assert int(answer.output("OUT").data[0]) == 7

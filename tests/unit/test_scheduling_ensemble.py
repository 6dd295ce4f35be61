"""Ensemble steps run through the one request runner: a composing model's outputs are finished (reshape back,
classification) before the next step reads them, exactly as for a direct request.

In-process Core, real ONNX Runtime; the models are identities built with the onnx helper API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from fastoip.core import CallContext, Core, FinishedCall
from fastoip.errors import DeadlineExceeded, InvalidArgument
from fastoip.scheduling.ensemble import StepLimiter, batch_reshape
from fastoip.types import InferInput, InferRequest, RequestedOutput
from harness import core_on, success_and_failure
from models import identity_model_bytes, write_model

#: ``a``: the model computes [4]; its config shows the output as [2, 2] (Triton's reshape).
RESHAPING = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
"""

#: ``b``: takes [2, 2].
SQUARE = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
"""

#: ``scores``: [4] -> [4].
FLAT = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def ensemble(name: str, steps: list[tuple[str, str, str]], out_dims: str, label_file: str = "") -> str:
    """``steps``: (model, tensor read, tensor written); the ensemble reads IN and answers OUT."""
    labels = f' label_filename: "{label_file}"' if label_file else ""
    text = ", ".join(
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: "{read}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{written}" }} }}'
        for model, read, written in steps
    )
    return (
        f'name: "{name}" platform: "ensemble" max_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {out_dims} ]{labels} }} ]\n'
        f"ensemble_scheduling {{ step [ {text} ] }}\n"
    )


def write_ensemble(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    root = tmp_path_factory.mktemp("ensembles")
    for name, config, dims in (("a", RESHAPING, [4]), ("b", SQUARE, [2, 2]), ("scores", FLAT, [4])):
        write_model(root, name, identity_model_bytes(TensorProto.FLOAT, dims, name, batch=False), config=config)
    write_ensemble(root, "a_then_b", ensemble("a_then_b", [("a", "IN", "x"), ("b", "x", "OUT")], "2, 2"))
    write_ensemble(root, "a_last", ensemble("a_last", [("a", "IN", "OUT")], "2, 2"))
    write_ensemble(
        root, "classified", ensemble("classified", [("scores", "IN", "OUT")], "4", label_file="labels.txt")
    )
    (root / "classified" / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    with core_on(root) as running:
        yield running


def request(model: str, values: np.ndarray, outputs: list[RequestedOutput] | None = None) -> InferRequest:
    return InferRequest(model, inputs=[InferInput("IN", "FP32", values.shape, values)], outputs=outputs or [])


VALUES = np.array([1.0, 4.0, 2.0, 3.0], dtype=np.float32)


def test_a_reshaping_step_hands_the_next_step_the_configs_shape(core: Core) -> None:
    # the direct call answers [2, 2]; through the ensemble, b must receive that shape too
    direct = core.infer(InferRequest("a", inputs=[InferInput("INPUT0", "FP32", (4,), VALUES)]))
    assert tuple(direct.output("OUTPUT0").shape) == (2, 2)
    before_a, before_b = success_and_failure(core, "a"), success_and_failure(core, "b")
    response = core.infer(request("a_then_b", VALUES))
    out = response.output("OUT")
    assert tuple(out.shape) == (2, 2)
    np.testing.assert_array_equal(out.data, VALUES.reshape(2, 2))
    # each composing model counted its step once, as Triton reports them
    assert success_and_failure(core, "a") == (before_a[0] + 1, before_a[1])
    assert success_and_failure(core, "b") == (before_b[0] + 1, before_b[1])


def test_a_reshaping_last_step_answers_the_ensembles_shape(core: Core) -> None:
    out = core.infer(request("a_last", VALUES)).output("OUT")
    assert tuple(out.shape) == (2, 2)
    np.testing.assert_array_equal(out.data, VALUES.reshape(2, 2))


def test_an_ensemble_output_asked_with_classification(core: Core) -> None:
    wanted = [RequestedOutput("OUT", {"classification": 2})]
    out = core.infer(request("classified", VALUES, wanted)).output("OUT")
    assert out.datatype == "BYTES" and tuple(out.shape) == (2,)
    assert [bytes(v) for v in out.data] == [b"4.000000:1:one", b"3.000000:3:three"]


def test_a_step_that_cannot_start_fails_the_ensemble_naming_the_step(core: Core) -> None:
    before = success_and_failure(core, "a_then_b")
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'IN'"):
        core.infer(request("a_then_b", np.zeros(3, dtype=np.float32)))
    assert success_and_failure(core, "a_then_b") == before  # refused before it started


def test_a_step_that_found_a_retired_composing_model_runs_on_its_successor(tmp_path: Path) -> None:
    """The runner's version handover serves ensemble steps too: a step whose lookup raced a reload of its
    composing model (it got the retired version) runs on the new one instead of failing 'is being unloaded'."""
    for name, config, dims in (("a", RESHAPING, [4]), ("b", SQUARE, [2, 2])):
        write_model(tmp_path, name, identity_model_bytes(TensorProto.FLOAT, dims, name, batch=False), config=config)
    write_ensemble(tmp_path, "a_then_b", ensemble("a_then_b", [("a", "IN", "x"), ("b", "x", "OUT")], "2, 2"))
    with core_on(tmp_path, model_control_mode="explicit", startup_models=["a_then_b"]) as core:
        old = core.repository.get("b", "")
        core.load_model("b")  # reload: the old version is retired
        new = core.repository.get("b", "")
        assert new is not old and old.retiring
        # the step's look-up of the newest "b" answers the retired version, as if it ran before the swap
        runner = core.repository.runner
        assert runner.newest["b"] is new
        runner.newest = {**runner.newest, "b": old}
        out = core.infer(request("a_then_b", VALUES)).output("OUT")
        np.testing.assert_array_equal(out.data, VALUES.reshape(2, 2))
        assert (new.in_flight, old.in_flight) == (0, 0)
        assert success_and_failure(core, "b") == (1, 0)  # counted on the new version


def test_a_blocking_callers_lazy_deadline_reaches_the_first_steps(core: Core) -> None:
    """grpcio's deadline is read lazily (``time_remaining``) for a request that waits: an ensemble's does, so
    its steps carry the deadline from the first one on (here already past: the first step refuses to run)."""
    reads: list[str] = []

    def remaining() -> float:
        reads.append("read")
        return 0.0

    before = success_and_failure(core, "a")
    with pytest.raises(DeadlineExceeded, match=r"step 0 \('a'\)"):
        core.infer(request("a_then_b", VALUES), CallContext(time_remaining=remaining))
    assert reads == ["read"]
    assert success_and_failure(core, "a") == (before[0], before[1] + 1)


def batched_step(delay_us: int, preferred: int) -> str:
    """An identity over FP32 [4] with a dynamic batcher that waits ``delay_us`` or for ``preferred`` requests."""
    return (
        "max_batch_size: 16\n"
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"dynamic_batching {{ preferred_batch_size: [ {preferred} ] max_queue_delay_microseconds: {delay_us} }}\n"
    )


def limited_ensemble(name: str, step: str, limit: int) -> str:
    limit_line = f"max_inflight_requests: {limit}" if limit else ""
    return (
        f'name: "{name}" platform: "ensemble" max_batch_size: 16\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"ensemble_scheduling {{ {limit_line} step [ {{ model_name: \"{step}\" model_version: -1 "
        'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n'
    )


def test_max_inflight_requests_bounds_a_step_across_the_ensembles_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton's ensemble back-pressure: with max_inflight_requests 1, one request at a time runs in the step, so
    its batcher never sees two (12 executions of 1); without it, the 12 requests batch together."""
    for name, delay in (("limited_step", 20_000), ("free_step", 5_000_000)):
        write_model(tmp_path, name, identity_model_bytes(TensorProto.FLOAT, [4], name, batch=True),
                    config=batched_step(delay, 12))
    write_ensemble(tmp_path, "limited", limited_ensemble("limited", "limited_step", 1))
    write_ensemble(tmp_path, "free", limited_ensemble("free", "free_step", 0))
    with caplog.at_level("INFO", logger="fastoip"), core_on(tmp_path) as core:
        assert "Ensemble model 'limited' configured with max_inflight_requests: 1" in caplog.text
        assert "Ensemble model 'free' configured" not in caplog.text
        done = threading.Semaphore(0)
        answers: list[object] = []

        def on_done(call: FinishedCall) -> None:
            answers.append(call.error or call.response)
            done.release()

        for ensemble_name in ("limited", "free"):
            for i in range(12):
                data = np.full((1, 4), i, np.float32)
                core.start(InferRequest(ensemble_name, inputs=[InferInput("IN", "FP32", (1, 4), data)],
                                        outputs=[RequestedOutput("OUT")]), None, on_done)
            for _ in range(12):
                assert done.acquire(timeout=30)
            assert all(not isinstance(answer, Exception) for answer in answers), answers
        (limited,) = core.statistics("limited_step")
        (free,) = core.statistics("free_step")
    assert (limited.inference_count, limited.execution_count) == (12, 12)
    assert (free.inference_count, free.execution_count) == (12, 1)


def test_a_step_limiter_starts_waiting_launches_in_order_and_passes_on_a_slot_not_taken() -> None:
    limiter = StepLimiter(2)
    started: list[str] = []

    def launch(name: str, takes: bool = True) -> Callable[[], bool]:
        return lambda: started.append(name) is None and takes

    for name in ("a", "b", "c"):
        limiter.acquire(launch(name))
    limiter.acquire(launch("d", takes=False))  # its request failed while it waited: it will not start
    limiter.acquire(launch("e"))
    assert started == ["a", "b"] and limiter.waiting() == 3 and limiter.in_flight == 2
    limiter.release()  # a is done: c takes its slot
    assert started == ["a", "b", "c"] and limiter.in_flight == 2
    limiter.release()  # b is done: d does not start, so e gets the slot
    assert started == ["a", "b", "c", "d", "e"] and limiter.in_flight == 2 and limiter.waiting() == 0
    limiter.release()
    limiter.release()
    assert limiter.in_flight == 0
    limiter.acquire(launch("f", takes=False))  # a launch that fails at once gives its slot straight back
    assert limiter.in_flight == 0


@pytest.mark.parametrize(("dims", "batching", "batch", "shape", "expected"), [
    ((1,), True, 0, (1,), (1, 1)),  # a non-batched tensor a batching model takes: a batch of 1
    ((4,), True, 0, (2, 4), (2, 4)),  # not the config's shape: assumed batched already
    ((1,), False, 1, (1, 1), (1,)),  # a batch of 1 a non-batching model takes without its batch dimension
    ((1, 1), False, 1, (1, 1), (1, 1)),  # already the config's shape: as it is
    ((1,), False, 2, (2, 1), (2, 1)),  # a batch of 2 cannot lose its dimension
    ((4,), True, 3, (3, 4), (3, 4)),  # batching on both sides: as it is
    (None, True, 0, (4,), (4,)),
])
def test_batch_reshape_follows_tritons_ensemble(
    dims: tuple[int, ...] | None, batching: bool, batch: int, shape: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert batch_reshape(dims, batching, batch, shape) == expected


def test_a_non_batching_ensemble_feeds_a_batching_step_a_batch_of_one(tmp_path: Path) -> None:
    """Triton's ensemble reshape: IN [4] of a max_batch_size 0 ensemble reaches a batching step as [1, 4], and
    the step's [1, 4] answer is the ensemble's OUT [4] again."""
    write_model(tmp_path, "batched", identity_model_bytes(TensorProto.FLOAT, [4], "batched", batch=True),
                config=batched_step(1000, 1))
    (tmp_path / "plain" / "1").mkdir(parents=True)
    (tmp_path / "plain" / "config.pbtxt").write_text(
        limited_ensemble("plain", "batched", 0).replace("max_batch_size: 16", "max_batch_size: 0"))
    with core_on(tmp_path) as core:
        out = core.infer(request("plain", VALUES)).output("OUT")
    assert out.shape == (4,)
    np.testing.assert_array_equal(out.data, VALUES)

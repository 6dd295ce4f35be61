"""The scheduling contract holds for the real backends and the layering stays as drawn (in-process)."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fastoip.scheduling
from fastoip.core import Core
from fastoip.demo import write_repository
from fastoip.repository.loaded import LoadedModel
from fastoip.scheduling.contract import Backend, ExecutionContext, TensorModel
from fastoip.scheduling.execute import TensorBackend
from fastoip.types import InferInput, InferRequest, RequestedOutput


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    core = Core(write_repository(tmp_path_factory.mktemp("repo") / "models", ["simple"]))
    core.load_models()
    yield core
    core.close()


def test_scheduling_imports_nothing_from_repository() -> None:
    """Schedulers get an ExecutionContext; no module under scheduling/ may reach up into repository/."""
    package = Path(fastoip.scheduling.__file__).parent
    offenders = []
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "repository" in node.module.split("."):
                offenders.append(f"{source.name}: from {'.' * node.level}{node.module}")
            elif isinstance(node, ast.Import) and any("repository" in a.name.split(".") for a in node.names):
                offenders.append(f"{source.name}: import {', '.join(a.name for a in node.names)}")
    assert offenders == []


def test_onnx_instances_are_tensor_models_behind_the_adapter(core: Core) -> None:
    model = core.repository.get("simple")
    assert all(isinstance(b, TensorModel) for b in model.backends)
    assert all(isinstance(i, TensorBackend) and isinstance(i, Backend) for i in model.instances)
    assert isinstance(model.context, ExecutionContext)
    assert model.context.output_datatypes == {"OUTPUT0": "INT32", "OUTPUT1": "INT32"}
    assert model.is_ready() and model.is_alive()


def test_two_jobs_asking_for_different_outputs_run_as_one_batch(core: Core) -> None:
    """Through the real ONNX model: one execution of batch 2 computes both outputs; each job gets its own."""
    model = core.repository.get("simple")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)

    def request(output: str) -> InferRequest:
        inputs = [InferInput("INPUT0", "INT32", (1, 16), a), InferInput("INPUT1", "INT32", (1, 16), b)]
        return InferRequest("simple", inputs=inputs, outputs=[RequestedOutput(output)])

    add, sub = model.prepare(request("OUTPUT0")), model.prepare(request("OUTPUT1"))
    before = model.stats.execution_count
    results, executions = model.instances[0].execute([add, sub])
    assert [e[:2] for e in executions] == [(2, 2)] and model.stats.execution_count == before
    add_response, sub_response = results
    assert not isinstance(add_response, BaseException) and not isinstance(sub_response, BaseException)
    assert [o.name for o in add_response.outputs] == ["OUTPUT0"]
    assert [o.name for o in sub_response.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(add_response.outputs[0].data, a + b)
    np.testing.assert_array_equal(sub_response.outputs[0].data, a - b)


def test_in_flight_count_is_exact_under_threads(core: Core) -> None:
    model: LoadedModel = core.repository.get("simple")
    start = threading.Barrier(8)

    def churn() -> None:
        start.wait()
        for _ in range(5_000):
            model.enter()
            model.leave()

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    model.enter()
    for thread in threads:
        thread.join()
    assert model.in_flight == 1
    model.leave()
    assert model.in_flight == 0 and model.wait_idle(0.0)

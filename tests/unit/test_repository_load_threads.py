"""Triton's --model-load-thread-count: the models of one load operation load side by side on that many threads,
and a model's versions side by side; one load operation at a time (the load lock), ensembles after their steps.

Each model's ``__init__`` takes two seconds and writes when it started and ended, so overlap is visible."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from fastoip.types import InferInput, InferRequest
from python_models import write_python_model

SLOW = """
    import os
    import time
    import fastoip

    class Slow(fastoip.Model):
        def __init__(self):
            started = time.time()
            time.sleep(2.0)
            with open(self.parameters["log"], "a") as log:
                log.write(f"{self.name} {self.version} {started} {time.time()}\\n")

        def predict(self, inputs, parameters):
            return {"Y": inputs["X"]}
"""


def _config(log: Path, versions: str = "") -> str:
    return (
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'parameters {{ key: "log" value {{ string_value: "{log}" }} }}\n' + versions
    )


def _repository(root: Path, log: Path) -> None:
    for name in ("a", "b", "c"):
        write_python_model(root, name, SLOW, _config(log))
    both = 'version_policy { all { } }\n'
    for version in (1, 2):
        write_python_model(root, "versions", SLOW, _config(log, both), version=version)
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "X" value: "IN" }\n'
        '  output_map { key: "Y" value: "OUT" } } ] }\n')


def _intervals(log: Path) -> dict[tuple[str, str], tuple[float, float]]:
    found = {}
    for line in log.read_text().splitlines():
        name, version, start, end = line.split()
        found[name, version] = (float(start), float(end))
    return found


def _load(root: Path, threads: int) -> tuple[Core, float]:
    core = Core(root, RepositoryOptions(use_gpu=False, load_threads=threads), worker_threads=2)
    started = time.monotonic()
    core.load_models()
    return core, time.monotonic() - started


def test_models_and_versions_load_side_by_side(tmp_path: Path) -> None:
    log = tmp_path / "loads.txt"
    _repository(tmp_path / "repo", log)
    core, _ = _load(tmp_path / "repo", threads=4)
    try:
        assert {entry.name: entry.state for entry in core.repository_index()} == {
            "a": "READY", "b": "READY", "c": "READY", "pipeline": "READY", "versions": "READY"}
        data = np.array([2.0], dtype=np.float32)
        response = core.infer(InferRequest("pipeline", inputs=[InferInput("IN", "FP32", (1,), data)]))
        np.testing.assert_array_equal(response.outputs[0].data, data)  # the ensemble found its step loaded
    finally:
        core.close()
    loads = _intervals(log)
    models = [loads["a", "1"], loads["b", "1"], loads["c", "1"], loads["versions", "1"]]
    # four models on four threads: every load began before any ended
    assert max(start for start, _ in models) < min(end for _, end in models), loads
    # a model's two versions, side by side
    (start1, end1), (start2, end2) = loads["versions", "1"], loads["versions", "2"]
    assert start1 < end2 and start2 < end1, loads


def test_one_load_thread_loads_one_model_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "loads.txt"
    _repository(tmp_path / "repo", log)
    core, _ = _load(tmp_path / "repo", threads=1)
    try:
        assert all(entry.state == "READY" for entry in core.repository_index())
    finally:
        core.close()
    ordered = sorted(_intervals(log).values())
    for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False):
        assert start >= end - 0.05, ordered  # each began after the one before it ended

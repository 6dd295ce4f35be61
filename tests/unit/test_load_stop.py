"""A load stops at its next step when its client goes away (issue 37): before it takes the load lock's work,
between the ONNX instances it builds, between warmup runs (the e2e tests: tests/e2e/test_load_cost_bounds.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from onnx import TensorProto

from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.onnx import KIND
from fastoip.errors import Cancelled
from fastoip.repository import ModelRepository, RepositoryOptions
from models import identity_model_bytes, write_model


def test_onnx_instances_stop_being_built_when_the_load_must(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m", identity_model_bytes(TensorProto.FLOAT, [4]))
    checks: list[int] = []

    def check_stop() -> None:
        checks.append(1)
        if len(checks) == 3:
            raise Cancelled("the load's client went away")

    config = mc.ModelConfig(max_batch_size=8)
    config.instance_group.add(count=16, kind=mc.ModelInstanceGroup.KIND_CPU)
    with pytest.raises(Cancelled):
        KIND.load("m", 1, model_dir / "1" / "model.onnx", config, RepositoryOptions(use_gpu=False,
                                                                                    check_stop=check_stop))
    assert len(checks) == 3  # three sessions were made, not sixteen


def test_a_load_whose_client_left_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    write_model(tmp_path, "m", identity_model_bytes(TensorProto.FLOAT, [4]))
    with ThreadPoolExecutor(2) as executor:
        repository = ModelRepository(tmp_path, executor, RepositoryOptions(use_gpu=False))
        gone = threading.Event()
        gone.set()  # it left while the load waited for the load lock
        with pytest.raises(Cancelled, match="client went away"):
            repository.load("m", from_client=True, client_gone=gone)
        record = repository.record("m")
        assert record is None or not record.versions
        repository.load("m", from_client=True, client_gone=threading.Event())  # the next one loads
        assert repository.record("m").versions  # type: ignore[union-attr]
        repository.close()

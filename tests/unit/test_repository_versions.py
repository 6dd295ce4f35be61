"""Version directories (issue 27): a number past int64 (10^20) is not a version; the others still load."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from onnx import TensorProto

from fastoip.repository.repository import ModelRepository
from models import identity_model_bytes, write_model


def test_a_version_past_int64_is_skipped(tmp_path: Path) -> None:
    model = identity_model_bytes(TensorProto.FLOAT, [4])
    write_model(tmp_path, "m", model, version=1)
    write_model(tmp_path, "m", model, version=10**20)
    write_model(tmp_path, "m", model, version=2**63 - 1)
    with ThreadPoolExecutor(2) as executor:
        repository = ModelRepository(tmp_path, executor)
        try:
            repository.load("m")
            record = repository.record("m")
            assert record is not None
            assert sorted(record.versions) == [2**63 - 1]  # the newest valid one, by the default policy
        finally:
            repository.close()

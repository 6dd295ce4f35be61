"""The Core's typed answers in-process: metadata, statistics, readiness and its reason, settings, regions."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import orjson
import pytest

from fastoip import __version__  # noqa: E402
from fastoip.core import (  # noqa: E402
    CUDA,
    Core,
    ModelMetadata,
    RepositoryIndexEntry,
    ServerMetadata,
    SystemRegionStatus,
    TensorMetadata,
    config_to_json,
)
from fastoip.demo import write_repository  # noqa: E402
from fastoip.errors import InvalidArgument, NotFound, Unavailable  # noqa: E402
from fastoip.shared_memory import cuda_unavailable  # noqa: E402
from harness import core_on, simple_request  # noqa: E402


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("repo"), ["simple", "identity_fp32"])
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an ONNX model")
    return root


@pytest.fixture(scope="module")
def core(repo: Path) -> Iterator[Core]:
    with core_on(repo) as running:
        yield running


def test_server_metadata(core: Core) -> None:
    meta = core.server_metadata()
    assert isinstance(meta, ServerMetadata)
    assert meta.name == "fastoip" and meta.version == __version__
    assert {"model_repository", "statistics", "binary_tensor_data", "system_shared_memory"} <= set(meta.extensions)
    assert meta.extensions == core.extensions  # one list, owned by the Core
    assert orjson.loads(orjson.dumps(meta))["extensions"] == list(meta.extensions)  # frontends write it as is


def test_model_metadata(core: Core) -> None:
    meta = core.model_metadata("simple")
    assert meta == ModelMetadata(
        name="simple",
        versions=("1",),
        platform="onnxruntime_onnx",
        inputs=(TensorMetadata("INPUT0", "INT32", (-1, 16)), TensorMetadata("INPUT1", "INT32", (-1, 16))),
        outputs=(TensorMetadata("OUTPUT0", "INT32", (-1, 16)), TensorMetadata("OUTPUT1", "INT32", (-1, 16))),
    )
    assert core.model_metadata("simple", "1") == meta
    with pytest.raises(NotFound):
        core.model_metadata("no_such_model")
    with pytest.raises(Unavailable, match="broken"):
        core.model_metadata("broken")


def test_model_config_and_its_json(core: Core) -> None:
    config = core.model_config("simple")
    doc = config_to_json(config)
    assert doc["name"] == "simple" and doc["max_batch_size"] == config.max_batch_size > 0
    assert [t["name"] for t in doc["input"]] == ["INPUT0", "INPUT1"]
    assert doc["input"][0]["dims"] == [16]  # 64-bit ints as numbers, as Triton writes them


def test_statistics_are_typed_and_count_one_request(core: Core) -> None:
    (before,) = core.statistics("identity_fp32")
    assert before.inference_stats.success.count == 0 and before.batch_stats == ()
    core.infer(simple_request())
    (stats,) = core.statistics("simple", "1")
    assert stats.name == "simple" and stats.version == "1"
    assert stats.inference_stats.success.count >= 1 and stats.inference_stats.success.ns > 0
    assert stats.execution_count >= 1 and stats.last_inference > 0
    assert [b.batch_size for b in stats.batch_stats] == [1]
    assert stats.batch_stats[0].compute_infer.count >= 1
    everything = {(s.name, s.version) for s in core.statistics()}
    assert {("simple", "1"), ("identity_fp32", "1")} <= everything
    with pytest.raises(NotFound):
        core.statistics("no_such_model")
    assert "nv_inference_request_success{model=\"simple\",version=\"1\"}" in core.prometheus_metrics()


def test_repository_index(core: Core) -> None:
    index = core.repository_index()
    assert index == sorted(index, key=lambda e: (e.name, e.version))
    by_name = {entry.name: entry for entry in index}
    assert by_name["simple"] == RepositoryIndexEntry("simple", "1", "READY", "")
    assert by_name["broken"].state == "UNAVAILABLE" and by_name["broken"].version == ""
    assert by_name["broken"].reason  # says why the load failed
    assert {e.name for e in core.repository_index(ready_only=True)} == {"simple", "identity_fp32"}


def test_not_ready_reason_names_the_failed_model(core: Core) -> None:
    assert not core.server_ready()  # strict readiness, and "broken" did not load
    reason = core.not_ready_reason()
    assert reason.startswith("the server is not ready: 'broken' is UNAVAILABLE (")
    assert "simple" not in reason
    assert core.model_ready("simple") and core.model_not_ready_reason("simple") == ""
    assert not core.model_ready("broken") and "broken" in core.model_not_ready_reason("broken")
    assert "not found" in core.model_not_ready_reason("no_such_model")
    assert core.model_known("broken") and not core.model_known("no_such_model")


def test_ready_and_then_shutting_down(tmp_path: Path) -> None:
    with core_on(write_repository(tmp_path, ["identity_fp32"])) as core:
        assert core.server_ready() and core.not_ready_reason() == ""
        core.begin_shutdown()
        assert not core.server_ready() and core.not_ready_reason() == "the server is not ready: it is shutting down"
        assert core.model_not_ready_reason("identity_fp32") == (
            "model 'identity_fp32' is not ready: the server is shutting down"
        )
        core.stop_accepting()
        with pytest.raises(Unavailable, match="shutting down"):
            core.infer(simple_request(model="identity_fp32"))


def test_trace_and_log_settings(core: Core) -> None:
    assert core.trace_settings()["trace_level"] == ["OFF"]
    assert core.trace_settings("simple")["trace_level"] == ["OFF"]
    with pytest.raises(InvalidArgument, match="Request for unknown model : no_such_model"):  # Triton's answer
        core.trace_settings("no_such_model")
    with pytest.raises(InvalidArgument, match="Request for unknown model"):
        core.update_trace_settings({"trace_level": ["TIMESTAMPS"]}, "no_such_model")
    assert isinstance(core.log_settings()["log_info"], bool)


def test_shared_memory_status(core: Core) -> None:
    memory = shared_memory.SharedMemory(create=True, size=32)
    try:
        core.register_system_shared_memory("status-region", memory.name, 8, 16)
        assert core.shared_memory_status("status-region") == [
            SystemRegionStatus("status-region", memory.name, 8, 16)
        ]
        assert SystemRegionStatus("status-region", memory.name, 8, 16) in core.shared_memory_status()
        core.unregister_shared_memory("status-region")
        with pytest.raises(NotFound):
            core.shared_memory_status("status-region")
    finally:
        memory.close()
        memory.unlink()


def test_cuda_status_without_cuda(core: Core) -> None:
    if "cuda_shared_memory" in core.extensions:
        pytest.skip("this machine has a CUDA runtime")
    assert core.shared_memory_status("", CUDA) == []  # as Triton: no GPU, simply no CUDA regions
    with pytest.raises(Unavailable, match=cuda_unavailable().message):
        core.register_cuda_shared_memory("gpu-region", b"\0" * 64, 0, 16)

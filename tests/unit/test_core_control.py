"""Model control through the Core in-process: what each control mode allows, load, reload, unload."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastoip.core import RepositoryIndexEntry  # noqa: E402
from fastoip.demo import write_repository  # noqa: E402
from fastoip.errors import InvalidArgument, NotFound, Unavailable  # noqa: E402
from harness import core_on, fp32_request  # noqa: E402


def test_none_mode_refuses_load_and_unload(tmp_path: Path) -> None:
    with core_on(write_repository(tmp_path, ["identity_fp32"])) as core:
        with pytest.raises(Unavailable, match="model control mode 'none'"):
            core.load_model("identity_fp32")
        with pytest.raises(Unavailable, match="model control mode 'none'"):
            core.unload_model("identity_fp32")


def test_unknown_control_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="none, poll or explicit"):
        with core_on(tmp_path, model_control_mode="sometimes"):
            pass


def test_explicit_mode_loads_what_it_is_told(tmp_path: Path) -> None:
    root = write_repository(tmp_path, ["identity_fp32", "simple"])
    with core_on(root, model_control_mode="explicit", startup_models=["identity_fp32"]) as core:
        assert core.repository_index() == [
            RepositoryIndexEntry("identity_fp32", "1", "READY", ""),
            RepositoryIndexEntry("simple", "", "", ""),  # in the repository, never loaded
        ]
        core.load_model("simple")
        assert core.model_ready("simple")
        core.unload_model("identity_fp32")
        assert not core.model_ready("identity_fp32")
        with pytest.raises((NotFound, Unavailable)):
            core.infer(fp32_request("identity_fp32"))
        core.load_model("identity_fp32")  # load again after an unload
        assert core.infer(fp32_request("identity_fp32")).output("OUTPUT0").data is not None


def test_load_parameters_are_checked(tmp_path: Path) -> None:
    with core_on(write_repository(tmp_path, ["identity_fp32"]), model_control_mode="explicit") as core:
        with pytest.raises(InvalidArgument, match="need a 'config'"):
            core.load_model("uploaded", {"file:1/model.onnx": b"bytes"})
        with pytest.raises(InvalidArgument, match="must carry the file's bytes"):
            core.load_model("uploaded", {"file:1/model.onnx": "not bytes", "config": "{}"})
        with pytest.raises(InvalidArgument, match="'config' parameter"):
            core.load_model("identity_fp32", {"config": "{not json"})


def test_load_model_with_a_config_override(tmp_path: Path) -> None:
    with core_on(write_repository(tmp_path, ["identity_fp32"]), model_control_mode="explicit") as core:
        core.load_model("identity_fp32", {"config": '{"max_batch_size": 4}'})
        assert core.model_config("identity_fp32").max_batch_size == 4


def test_failed_initialization_answers_as_triton(tmp_path: Path) -> None:
    """Triton's SERVER_FAILED_TO_INITIALIZE: not live, not ready; server metadata, settings and metrics answer;
    every model, repository and inference request is Unavailable "Server not ready"."""
    root = write_repository(tmp_path, ["identity_fp32"])
    with core_on(root, load=False, strict_readiness=False) as core:
        core.fail_initialization(f"failed to stat file {tmp_path / 'xyzx'}")
        assert not core.server_live() and not core.server_ready()
        assert "failed to initialize (failed to stat file" in core.not_ready_reason()
        assert core.server_metadata().name == "fastoip"
        assert core.log_settings()["log_info"] in (True, False)
        assert core.shared_memory_status() == []
        assert "nv_inference_request_success" in core.prometheus_metrics()
        for verb in (
            lambda: core.model_ready("identity_fp32"),
            lambda: core.model_not_ready_reason("identity_fp32"),
            lambda: core.model_metadata("identity_fp32"),
            lambda: core.model_config("identity_fp32"),
            lambda: core.statistics(),
            lambda: core.repository_index(),
            lambda: core.load_model("identity_fp32"),
            lambda: core.unload_model("identity_fp32"),
            lambda: core.infer(fp32_request("identity_fp32")),
            lambda: core.start(fp32_request("identity_fp32"), None, lambda call: None),
        ):
            with pytest.raises(Unavailable, match="^Server not ready$"):
                verb()
        assert core.repository.records() == []  # nothing was loaded

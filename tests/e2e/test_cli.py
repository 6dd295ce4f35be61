"""Triton's command line on ``fastoip serve``: parse-level checks in-process, and real starts (KServe's arguments)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto

from fastoip.cli import serve_options
from fastoip.triton_flags import FlagError
from models import identity_model_bytes, write_model
from serverproc import ServerProcess


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_model(root, "identity", identity_model_bytes(TensorProto.FLOAT, [4]))
    return root


def test_model_store_in_both_forms(repo: Path) -> None:
    assert serve_options([f"--model-store={repo}"]).model_repository == repo
    assert serve_options(["--model-store", str(repo)]).model_repository == repo
    assert serve_options([f"--model-repository={repo}"]).model_repository == repo


def test_missing_repository_fails_to_stat(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match="failed to stat file"):
        serve_options([f"--model-repository={tmp_path / 'nope'}"])


def test_several_repositories_are_taken_as_triton_takes_them(repo: Path, tmp_path: Path) -> None:
    options = serve_options([f"--model-store={repo}", f"--model-repository={tmp_path}", f"--model-repository={repo}"])
    assert options.model_repository == repo and options.more_repositories == (tmp_path,)
    with pytest.raises(FlagError, match="failed to stat file"):
        serve_options([f"--model-store={repo}", f"--model-repository={tmp_path / 'missing'}"])


@pytest.mark.parametrize(("value", "enabled"), [("true", True), ("ON", True), ("1", True), ("false", False),
                                                ("Off", False), ("0", False)])
def test_booleans_parse_as_triton_parses_them(repo: Path, value: str, enabled: bool) -> None:
    options = serve_options([f"--model-store={repo}", f"--allow-http={value}", "--allow-metrics", value,
                             f"--allow-grpc={value}"])
    assert (options.http_port >= 0) is enabled
    assert (options.metrics_port >= 0) is enabled
    assert options.grpc_enabled is enabled


def test_bad_boolean_names_the_value(repo: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        serve_options([f"--model-store={repo}", "--allow-http=maybe"])
    assert "invalid value for bool option: maybe" in capsys.readouterr().err


def test_addresses_exit_timeout_and_id(repo: Path) -> None:
    options = serve_options([f"--model-store={repo}", "--grpc-address=0.0.0.0", "--http-address", "127.0.0.2",
                             "--metrics-address=127.0.0.3", "--exit-timeout-secs=7", "--id=triton"])
    assert (options.host, options.http_host, options.metrics_host) == ("0.0.0.0", "127.0.0.2", "127.0.0.3")
    assert options.exit_timeout == 7.0
    assert options.server_id == "triton"
    assert serve_options([f"--model-store={repo}"]).server_id == "fastoip"


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        (["--log-verbose=1"], "DEBUG"),
        (["--log-info=false"], "WARNING"),
        (["--log-info=false", "--log-warning=false"], "ERROR"),
        (["--log-info=false", "--log-warning=false", "--log-error=false"], "CRITICAL"),
        ([], "INFO"),
    ],
)
def test_log_flags(repo: Path, flags: list[str], level: str) -> None:
    assert serve_options([f"--model-store={repo}", *flags]).log_level == level


def test_log_format_and_file(repo: Path, tmp_path: Path) -> None:
    options = serve_options([f"--model-store={repo}", "--log-format=ISO8601", f"--log-file={tmp_path / 'log'}"])
    assert (options.log_format, options.log_file) == ("ISO8601", str(tmp_path / "log"))


def test_auto_complete_switches(repo: Path) -> None:
    assert serve_options([f"--model-store={repo}"]).repository.auto_complete
    assert not serve_options([f"--model-store={repo}", "--strict-model-config=true"]).repository.auto_complete
    assert not serve_options([f"--model-store={repo}", "--disable-auto-complete-config"]).repository.auto_complete


def test_default_max_batch_size_is_tritons_and_backend_config_sets_it(repo: Path) -> None:
    assert serve_options([f"--model-store={repo}"]).repository.default_max_batch_size == 4
    options = serve_options([f"--model-store={repo}", "--backend-config=default-max-batch-size=16"])
    assert options.repository.default_max_batch_size == 16
    options = serve_options([f"--model-store={repo}", "--backend-config", "onnxruntime,default-max-batch-size=2"])
    assert options.repository.default_max_batch_size == 2


def test_python_backend_settings_tritons_qa_passes_are_accepted_with_no_effect(repo: Path) -> None:
    # Triton's qa/L0_backend_python starts every server with shm-default-byte-size (and some with the others).
    options = serve_options([f"--model-store={repo}", "--backend-config=python,shm-default-byte-size=5242880",
                             "--backend-config=python,shm-growth-byte-size=1048576",
                             "--backend-config=python,stub-timeout-seconds=60",
                             "--backend-config=shm-region-prefix-name=prefix0"])
    assert options.repository.default_max_batch_size == 4
    said = "\n".join(options.no_effect_flags)
    for setting in ("shm-default-byte-size", "shm-growth-byte-size", "stub-timeout-seconds", "shm-region-prefix-name"):
        assert f"{setting}=" in said and "has no effect in fastoip" in said


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("onnxruntime,enable-global-threadpool=1", "setting 'enable-global-threadpool' is not supported"),
        ("tensorrt,default-max-batch-size=2", "backend 'tensorrt'"),
        (",default-max-batch-size=2", "no backend specified"),
        ("default-max-batch-size", "option format"),
        ("python,shm-growth-byte-size=0", "invalid value '0' for shm-growth-byte-size"),
        ("python,stub-timeout-seconds=soon", "invalid value 'soon' for stub-timeout-seconds"),
        ("onnxruntime,shm-default-byte-size=5242880", "setting 'shm-default-byte-size' is not supported"),
    ],
)
def test_backend_config_refusals_name_the_setting(repo: Path, value: str, words: str) -> None:
    with pytest.raises(FlagError, match=words):
        serve_options([f"--model-store={repo}", f"--backend-config={value}"])


@pytest.mark.parametrize(("flag", "words"), [("--model-config-name=h100", "--model-config-name is not supported"),
                                             ("--no-such-flag", "unrecognized flag --no-such-flag")])
def test_flags_fastoip_cannot_honour_are_refused_by_name(repo: Path, capsys: pytest.CaptureFixture,
                                                         flag: str, words: str) -> None:
    with pytest.raises(SystemExit):
        serve_options([f"--model-store={repo}", flag])
    assert words in capsys.readouterr().err


# -- real processes ------------------------------------------------------------------
def test_kserve_triton_serving_runtime_arguments_start_fastoip(repo: Path) -> None:
    # KServe's Triton ServingRuntime passes exactly these flag forms (its ports are 9000 and 8080; ephemeral here).
    kserve = [f"--model-store={repo}", "--grpc-port=0", "--http-port=0", "--allow-grpc=true", "--allow-http=true"]
    with ServerProcess(None, *kserve, "--id=triton", http=True) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_ready() and grpc.is_model_ready("identity")
        assert grpc.get_server_metadata().name == "triton"
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.get_server_metadata()["name"] == "triton"
        assert http.get_model_config("identity")["max_batch_size"] == 4
        assert "dynamic_batching" in http.get_model_config("identity")  # Triton's auto-complete


def test_missing_repository_is_a_start_time_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "fastoip.cli", "serve", f"--model-repository={missing}", "--grpc-port=0",
         "--http-port=-1", "--metrics-port=-1"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1
    assert f"failed to stat file {missing}" in done.stderr


def test_http_only_server_logging_to_a_file_in_iso8601(repo: Path, tmp_path: Path) -> None:
    log_file = tmp_path / "fastoip.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastoip.cli", "serve", f"--model-store={repo}", "--allow-grpc=false",
         "--http-port=0", "--allow-metrics=false", "--log-format=ISO8601", f"--log-file={log_file}", "--log-info=true",
         "--shutdown-grace=0"],  # no 5 s of readiness-false on terminate: nothing here reads it
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first line is the HTTP listener: there is no gRPC one
        assert line.startswith("fastoip: http listening on 127.0.0.1:"), line
        client = httpclient.InferenceServerClient(f"127.0.0.1:{int(line.rsplit(':', 1)[1])}")
        assert client.is_server_ready() and client.is_model_ready("identity")
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert "grpc listening" not in output
    logged = log_file.read_text()
    assert "model 'identity' ready" in logged
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO ", logged, re.MULTILINE)

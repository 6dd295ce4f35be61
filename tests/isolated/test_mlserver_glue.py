"""The glue between MLServer users' folders and fastoip (issue 38), without a server.

- ``fastoip mlserver start``'s settings: MLServer's own ``Settings`` class, its names and precedence
  (settings.json over ``MLSERVER_*`` over defaults), as ``fastoip serve`` flags;
- discovery of model-settings.json below ``.`` and other relative roots;
- version labels; JSON nulls for optional fields; BYTES as ``str`` for MLServer runtimes over REST.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastoip import cli
from fastoip._proto import model_config_pb2 as mc
from fastoip.model_config import MODEL_SETTINGS_PARAMETER, version_name
from fastoip.model_settings import find_model_settings
from fastoip.pyworker.mlserver_runner import tensor_values
from fastoip.types import JsonInferRequest, text_inputs
from fastoip.wire import http as wire

pytest.importorskip("mlserver")

from fastoip import mlserver_start  # noqa: E402


@pytest.fixture(autouse=True)
def _no_mlserver_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("MLSERVER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # MLServer also reads a .env file in the working directory


def _flags(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs, and ``--switch`` alone as "on"."""
    flags: dict[str, str] = {}
    for index, item in enumerate(argv):
        if item.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else "--"
            flags[item] = "on" if following.startswith("--") else following
    return flags


# -- fastoip mlserver start ---------------------------------------------------------------------
def test_mlservers_defaults_are_its_ports_on_every_interface(tmp_path: Path) -> None:
    flags = _flags(mlserver_start.serve_arguments(mlserver_start.mlserver_settings(str(tmp_path))))
    assert flags["--http-port"] == "8080" and flags["--grpc-port"] == "8081" and flags["--metrics-port"] == "8082"
    assert flags["--host"] == "0.0.0.0" and flags["--model-repository"] == str(tmp_path)
    assert flags["--log-level"] == "DEBUG"  # MLServer's debug defaults to true
    assert flags["--id"] == "mlserver"
    assert flags["--mlserver-grpc-stream"] == "on"  # MLServer's streaming stub reads ModelStreamInfer


def test_settings_json_wins_over_mlserver_variables_which_win_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"http_port": 9000, "debug": "false"}))
    monkeypatch.setenv("MLSERVER_HTTP_PORT", "9100")
    monkeypatch.setenv("MLSERVER_GRPC_PORT", "9101")
    monkeypatch.setenv("MLSERVER_METRICS_ENDPOINT", "")  # no metrics endpoint: metrics off
    monkeypatch.setenv("MLSERVER_LOAD_MODELS_AT_STARTUP", "false")
    monkeypatch.setenv("MLSERVER_MODEL_REPOSITORY_ROOT", "/elsewhere")  # the folder given wins, as in MLServer
    flags = _flags(mlserver_start.serve_arguments(mlserver_start.mlserver_settings(str(tmp_path))))
    assert flags["--http-port"] == "9000" and flags["--grpc-port"] == "9101" and flags["--metrics-port"] == "-1"
    assert flags["--log-level"] == "INFO" and flags["--model-control-mode"] == "explicit"
    assert flags["--model-repository"] == str(tmp_path)


def test_settings_fastoip_does_not_act_on_are_said(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"gzip_enabled": False, "root_path": "/x",
                                                        "metrics_endpoint": "/prom", "debug": False}))
    lines = mlserver_start.unused_settings(mlserver_start.mlserver_settings(str(tmp_path)))
    text = "\n".join(lines)
    assert "'gzip_enabled' is not used" in text and "'root_path' is not used" in text and "/prom" in text
    assert "debug" not in text and len(lines) == 3


def test_the_command_refuses_what_it_cannot_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mlserver", "start", str(tmp_path / "missing")]) == 1
    assert "is not a folder" in capsys.readouterr().err
    assert cli.main(["mlserver", "serve", "."]) == 2
    (tmp_path / "settings.json").write_text(json.dumps({"http_port": "not a port"}))
    assert cli.main(["mlserver", "start", str(tmp_path)]) == 1
    assert "settings are not valid" in capsys.readouterr().err


def test_the_command_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "mlserver start FOLDER" in capsys.readouterr().out


# -- discovery ----------------------------------------------------------------------------------
@pytest.mark.parametrize("root", [".", "./", "sub/.."])
def test_a_settings_file_at_a_relative_root_is_found_and_named_by_its_folder(tmp_path: Path, root: str) -> None:
    folder = tmp_path / "my-model"
    (folder / "sub").mkdir(parents=True)
    (folder / "model-settings.json").write_text(json.dumps({"implementation": "m.M"}))
    import os

    os.chdir(folder)
    found = find_model_settings(Path(root))
    assert list(found) == ["my-model"]  # MLServer: a file without a name is named after its folder
    assert found["my-model"].resolve() == folder.resolve()


def test_models_below_a_relative_root_keep_their_layout(tmp_path: Path) -> None:
    import os

    for name in ("a", "b"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "model-settings.json").write_text(json.dumps({"name": name}))
    os.chdir(tmp_path)
    found = find_model_settings(Path("."))
    assert {name: str(path) for name, path in found.items()} == {"a": "models/a", "b": "models/b"}


# -- versions, nulls, BYTES -----------------------------------------------------------------------
def test_version_name_is_an_mlserver_models_label_else_the_number() -> None:
    config = mc.ModelConfig(name="m")
    config.parameters["version"].string_value = "v0.1.0"
    assert version_name(config, 1) == "1"  # not from a model-settings.json: Triton's number
    config.parameters[MODEL_SETTINGS_PARAMETER].string_value = "{}"
    assert version_name(config, 1) == "v0.1.0"
    config.parameters["version"].string_value = ""
    assert version_name(config, 3) == "3"


def test_json_nulls_are_absent_fields() -> None:
    body = json.dumps({
        "id": None, "parameters": None, "outputs": None,
        "inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["hé"],
                    "parameters": {"content_type": "str", "headers": None}}],
    }).encode()
    request, _ = wire.decode_infer_request("m", "", body, None)
    assert request.id == "" and request.parameters == {} and request.outputs == []
    assert request.inputs[0].parameters == {"content_type": "str"}


def test_bytes_from_json_strings_are_str_for_mlserver_runtimes_only_where_they_came_as_json() -> None:
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["hé", "b"]},
                      {"name": "n", "datatype": "INT32", "shape": [1], "data": [1]}]}
    request, _ = wire.decode_infer_request("m", "", json.dumps(doc).encode(), None)
    assert isinstance(request, JsonInferRequest) and text_inputs(request) == {"text"}
    array = request.inputs[0].data
    assert array.tolist() == [b"h\xc3\xa9", b"b"]  # every other model sees bytes, as before
    assert tensor_values(array, True) == ["hé", "b"] and tensor_values(array) == [b"h\xc3\xa9", b"b"]
    # binary BYTES (Triton's extension) are not text
    element = b"\x02\x00\x00\x00hi"
    header = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": len(element)}}]}).encode()
    request, _ = wire.decode_infer_request("m", "", header + element, len(header))
    assert text_inputs(request) == frozenset()
    assert tensor_values(np.array([1, 2]), True) == [1, 2]


def test_a_folder_under_the_root_whose_settings_name_another_model_is_that_model(tmp_path: Path) -> None:
    """MLServer names a model by its file's ``name`` wherever the file is; a folder directly under the root
    whose file names no other model (or that has a config.pbtxt) keeps Triton's meaning."""
    import mlserver_examples as examples
    from fastoip.testing import InProcessClient

    renamed = tmp_path / "sklearn-folder"
    renamed.mkdir()
    case = examples.write_sklearn(renamed)
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "model-settings.json").write_text(json.dumps({"name": "same"}))
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "model-settings.json").write_text(json.dumps({"name": "other"}))
    (tmp_path / "triton" / "config.pbtxt").write_text('backend: "python"')
    assert find_model_settings(tmp_path) == {"mnist-svm": renamed}
    with InProcessClient(tmp_path, models=["mnist-svm"]) as client:
        assert [(e.name, e.version, e.state) for e in client.repository_index() if e.state] == [
            ("mnist-svm", "v0.1.0", "READY")]
        assert "sklearn-folder" not in [e.name for e in client.repository_index()]
        outputs = client.infer("mnist-svm", {"predict": case["x"]}, version="v0.1.0")
        assert outputs["predict"].reshape(-1).tolist() == case["expected"].tolist()

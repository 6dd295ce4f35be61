"""Model control does what the operator allows and nothing more (explicit mode, tritonclient gRPC and HTTP).

Names are names, every path a client's config or upload builds stays inside the model's directory,
Python code a client brings loads through the API only with --model-control-allow-code, and file-system failures of
a load answer INTERNAL without the server's paths.  Each case ends with a good request.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip.cli import main as cli_main
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

ONNX_CONFIG = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}
PYTHON_SOURCE = textwrap.dedent(
    """
    import fastoip

    class Doubler(fastoip.Model):
        def predict(self, inputs, parameters):
            return {"OUTPUT0": inputs["INPUT0"] * 2}
    """
)
PYTHON_CONFIG = {**ONNX_CONFIG, "backend": "python"}


def _repository(root: Path) -> Path:
    write_model(root, "good", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    py = root / "pymodel" / "1"
    py.mkdir(parents=True)
    (py / "model.py").write_text(PYTHON_SOURCE)
    (root / "pymodel" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    # A model directory whose file is a link to a file outside the repository.
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir()
    (outside / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4]))
    linked = root / "linked" / "1"
    linked.mkdir(parents=True)
    (linked / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4]))
    os.symlink(outside / "model.onnx", linked / "escape.onnx")
    # A Python model outside the repository that leaves a mark when its code runs.
    evil = _code_dir(root) / "evil" / "1"
    evil.mkdir(parents=True)
    (evil / "model.py").write_text(f"open({str(_mark(root))!r}, 'w').close()\n" + PYTHON_SOURCE)
    (evil.parent / "config.pbtxt").write_text((py.parent / "config.pbtxt").read_text())
    # An ensemble of the repository whose step is the repository's Python model.
    ens = root / "py_ensemble" / "1"
    ens.mkdir(parents=True)
    (ens.parent / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "pymodel" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'
    )
    return root


def _code_dir(root: Path) -> Path:
    return root.parent / f"{root.name}-code"


def _mark(root: Path) -> Path:
    return root.parent / f"{root.name}-code-ran"


def _ensemble_config(step_model: str) -> str:
    return json.dumps({
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": ONNX_CONFIG["input"],
        "output": ONNX_CONFIG["output"],
        "ensemble_scheduling": {"step": [{
            "model_name": step_model, "model_version": -1,
            "input_map": {"INPUT0": "INPUT0"}, "output_map": {"OUTPUT0": "OUTPUT0"},
        }]},
    })


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = _repository(tmp_path_factory.mktemp("control-repo"))
    with ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "good", http=True) as proc:
        yield proc


def _client(server: ServerProcess, protocol: str) -> tg.InferenceServerClient | th.InferenceServerClient:
    if protocol == "grpc":
        return tg.InferenceServerClient(server.grpc_url)
    return th.InferenceServerClient(server.http_url)


def _infer(client: tg.InferenceServerClient | th.InferenceServerClient, model: str) -> np.ndarray:
    module = tg if isinstance(client, tg.InferenceServerClient) else th
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = module.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def _good_request(client: tg.InferenceServerClient | th.InferenceServerClient) -> None:
    np.testing.assert_array_equal(_infer(client, "good"), np.arange(4, dtype=np.float32).reshape(1, 4))


def _refused(protocol: str, status: str = "invalid") -> str:
    return {
        ("grpc", "invalid"): "StatusCode.INVALID_ARGUMENT",
        ("http", "invalid"): "400",
        ("grpc", "internal"): "StatusCode.INTERNAL",
        ("http", "internal"): "500",
    }[protocol, status]


def _load_error(
    client: tg.InferenceServerClient | th.InferenceServerClient, name: str, **kwargs: object
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name, **kwargs)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_model_names_are_names(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    names = ["../outside", "/etc", "a/b", "a\\b", "..", "nul\0name", "x" * 300]
    if protocol == "http":
        names = [n for n in names if "/" not in n and n != ".."]  # a '/' is a different URL, not a name
    for name in names:
        error = _load_error(client, name)
        assert error.status() == _refused(protocol), (name, error)
        assert "invalid model name" in error.message(), (name, error)
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_config_file_names_stay_in_the_model(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    for filename in ("../../../../etc/passwd", "/etc/passwd", "sub/model.onnx"):
        config = json.dumps({**ONNX_CONFIG, "default_model_filename": filename})
        error = _load_error(client, "good", config=config)
        assert error.status() == _refused(protocol), (filename, error)
        assert "default_model_filename" in error.message(), error
    # A link inside the model's directory that leads out of it.
    config = json.dumps({**ONNX_CONFIG, "default_model_filename": "escape.onnx"})
    error = _load_error(client, "linked", config=config)
    assert error.status() == _refused(protocol), error
    assert "leads outside the model's directory" in error.message(), error
    assert str(server.args[-1]) not in error.message()
    client.load_model("linked", config=json.dumps(ONNX_CONFIG))  # its own file is fine
    np.testing.assert_array_equal(_infer(client, "linked"), np.arange(4, dtype=np.float32).reshape(1, 4))
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_uploaded_file_names_are_checked(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    model = identity_model_bytes(TensorProto.FLOAT, [4])
    config = json.dumps(ONNX_CONFIG)
    cases = {
        "file:1/nul\0.onnx": "NUL",
        "file:1/" + "y" * 300: "longer than 255 bytes",
        "file:../1/model.onnx": "inside the model directory",
        "file:/1/model.onnx": "inside the model directory",
    }
    for key, words in cases.items():
        error = _load_error(client, "uploaded", config=config, files={key: model, "file:1/model.onnx": model})
        # A name too long for the file system fails Triton's write: INTERNAL, as Triton (L0_http).
        expected = _refused(protocol, "internal") if "longer than" in words else _refused(protocol)
        assert error.status() == expected, (key, error)
        assert words in error.message(), (key, error)
        assert "/tmp" not in error.message() and "fastoip-upload" not in error.message(), error
    # A file system failure (here: a file where a directory must go) is the server's: INTERNAL, no paths.
    clash = {"file:1/model.onnx": model, "file:1/model.onnx/inner": model}
    error = _load_error(client, "uploaded", config=config, files=clash)
    assert error.status() == _refused(protocol, "internal"), error
    assert "failed to load 'uploaded'" in error.message(), error
    assert "/tmp" not in error.message() and "fastoip-upload" not in error.message(), error
    # A model file the backend cannot read: ONNX Runtime's message names the file's path (issue 27).
    error = _load_error(client, "uploaded", config=config, files={"file:1/model.onnx": b"not an onnx model"})
    assert "failed to load 'uploaded'" in error.message(), error
    assert "/tmp" not in error.message() and "fastoip-upload" not in error.message(), error
    client.load_model("uploaded", config=config, files={"file:1/model.onnx": model})
    np.testing.assert_array_equal(_infer(client, "uploaded"), np.arange(4, dtype=np.float32).reshape(1, 4))
    client.unload_model("uploaded")
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_code_a_client_brings_does_not_load_through_the_api_by_default(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    # Uploaded Python code, in any backend's model.
    files = {"file:1/model.py": PYTHON_SOURCE.encode()}
    error = _load_error(client, "uploaded_code", config=json.dumps(PYTHON_CONFIG), files=files)
    assert error.status() == _refused(protocol), error
    assert "--model-control-allow-code" in error.message(), error
    assert "failed to load 'uploaded_code'" in error.message(), error  # Triton's words first (its model_control QA)
    # Code under another name, made the model's file by the load's config: refused as python_backend refuses a
    # model file that is not a .py file (and as uploaded code without the flag).
    renamed = {"file:1/model.txt": PYTHON_SOURCE.encode()}
    config = json.dumps({**PYTHON_CONFIG, "default_model_filename": "model.txt"})
    error = _load_error(client, "uploaded_code", config=config, files=renamed)
    assert error.status() == _refused(protocol), error
    assert "Model name must end with '.py'" in error.message(), error
    # An ONNX model of the repository turned into a Python one by a config: no Python file of the operator's runs.
    config = json.dumps({**PYTHON_CONFIG, "default_model_filename": "model.onnx"})
    error = _load_error(client, "good", config=config)
    assert "Model name must end with '.py'" in error.message(), error
    assert not client.is_model_ready("uploaded_code")
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_python_model_of_the_repository_loads_through_the_api_as_triton_loads_it(
    server: ServerProcess, protocol: str
) -> None:
    """Its code is the operator's (put in the repository), not the client's: loading it is not an upload (issue 41;
    Triton's QA loads its Python models so, and COMPATIBILITY.md says why)."""
    client = _client(server, protocol)
    client.load_model("pymodel")
    np.testing.assert_array_equal(_infer(client, "pymodel"), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))
    client.unload_model("pymodel")
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ensemble_steps_are_names_not_paths(server: ServerProcess, protocol: str) -> None:
    """An ensemble step (here through a config override of an existing model) never names a directory
    outside the repository: '../x' and absolute paths are refused before anything is read or run."""
    client = _client(server, protocol)
    root = Path(server.args[server.args.index("--model-repository") + 1])
    for step in (f"../{_code_dir(root).name}/evil", str(_code_dir(root) / "evil"), "a/b", ".."):
        error = _load_error(client, "good", config=_ensemble_config(step))
        assert error.status() == _refused(protocol), (step, error)
        assert "invalid model name" in error.message() and "step 0" in error.message(), (step, error)
    assert not _mark(root).exists(), "the ensemble step's Python code ran"
    _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ensemble_steps_load_as_a_direct_load_would(server: ServerProcess, protocol: str) -> None:
    """A client's load of an ensemble loads its steps as a direct load would: the repository's Python step loads
    (the operator's code), and only by name (the step names test above)."""
    client = _client(server, protocol)
    client.load_model("py_ensemble")
    assert client.is_model_ready("pymodel")
    client.unload_model("py_ensemble")
    client.unload_model("pymodel")
    assert not _mark(Path(server.args[server.args.index("--model-repository") + 1])).exists()
    _good_request(client)


def test_the_operator_can_allow_code(tmp_path: Path) -> None:
    root = _repository(tmp_path / "repo")
    with ServerProcess(root, "--model-control-mode", "explicit", "--model-control-allow-code", http=True) as proc:
        for client in (tg.InferenceServerClient(proc.grpc_url), th.InferenceServerClient(proc.http_url)):
            client.load_model("pymodel")
            np.testing.assert_array_equal(_infer(client, "pymodel"), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))
            files = {"file:1/model.py": PYTHON_SOURCE.encode()}
            client.load_model("uploaded_code", config=json.dumps(PYTHON_CONFIG), files=files)
            np.testing.assert_array_equal(
                _infer(client, "uploaded_code"), 2 * np.arange(4, dtype=np.float32).reshape(1, 4)
            )
            client.unload_model("uploaded_code")


def test_help_says_what_allowing_code_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model-control-allow-code" in text
    assert "run code inside the server" in text


def test_control_is_off_by_default(tmp_path: Path) -> None:
    root = _repository(tmp_path / "repo")
    with ServerProcess(root) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("good")
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert "model control mode 'none'" in info.value.message()
        _good_request(client)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_load_cannot_ask_for_a_hundred_instances(server: ServerProcess, protocol: str) -> None:
    """Issue 27: 100 instances in one load request cost 526 MB and 100 threads; the API allows 32."""
    client = _client(server, protocol)
    config = json.dumps({**ONNX_CONFIG, "instance_group": [{"count": 100, "kind": "KIND_CPU"}]})
    error = _load_error(client, "good", config=config)
    assert error.status() == _refused(protocol), error
    assert "100 instances" in error.message() and "at most 32" in error.message(), error
    _good_request(client)

"""Model control as Triton does it: a specific version policy serves the versions that exist, unloading an unknown
model is a no-op, and ``unload_dependents`` unloads an ensemble's composing models with it (over HTTP and gRPC)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

IDENTITY = identity_model_bytes(TensorProto.FLOAT, [4])


def test_specific_versions_that_exist_are_served(tmp_path: Path) -> None:
    write_model(tmp_path, "some", IDENTITY, version=2)
    write_model(tmp_path, "some", IDENTITY, version=3,
                config="max_batch_size: 4\nversion_policy { specific { versions: [ 1, 3 ] } }\n")
    write_model(tmp_path, "none", IDENTITY, version=2,
                config="max_batch_size: 4\nversion_policy { specific { versions: [ 1 ] } }\n")
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        index = {(e.name, e.version): e for e in core.repository_index()}
        assert index[("some", "3")].state == "READY"
        assert ("some", "1") not in index and ("some", "2") not in index
        assert core.model_ready("some", "3") and not core.model_ready("some", "2")
        (entry,) = [e for e in core.repository_index() if e.name == "none"]
        assert entry.state == "UNAVAILABLE"
        assert "at least one version must be available under the version policy of model 'none'" in entry.reason
    finally:
        core.close()


ENSEMBLE = """
name: "chain" platform: "ensemble" max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "INPUT0" value: "IN" }
    output_map { key: "OUTPUT0" value: "t" } },
  { model_name: "second" model_version: -1 input_map { key: "INPUT0" value: "t" }
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""


@pytest.fixture()
def server(tmp_path: Path) -> ServerProcess:
    for name in ("first", "second", "alone"):
        write_model(tmp_path, name, IDENTITY, config="max_batch_size: 4\n")
    (tmp_path / "chain" / "1").mkdir(parents=True)
    (tmp_path / "chain" / "config.pbtxt").write_text(ENSEMBLE)
    return ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "*", http=True)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unload_with_dependents_unloads_an_ensembles_steps(server: ServerProcess, protocol: str) -> None:
    with server:
        client: tg.InferenceServerClient | th.InferenceServerClient = (
            tg.InferenceServerClient(server.grpc_url) if protocol == "grpc"
            else th.InferenceServerClient(server.http_url)
        )
        assert all(client.is_model_ready(name) for name in ("chain", "first", "second", "alone"))
        client.unload_model("chain", unload_dependents=True)
        assert not any(client.is_model_ready(name) for name in ("chain", "first", "second"))
        assert client.is_model_ready("alone")
        client.load_model("chain")  # loads its steps again
        assert all(client.is_model_ready(name) for name in ("chain", "first", "second"))
        client.unload_model("chain")  # without dependents: the steps stay
        assert client.is_model_ready("first") and client.is_model_ready("second")
        # An unknown model: nothing to do, success (Triton).
        client.unload_model("no_such_model")
        assert client.is_server_live()


def test_several_model_repositories_are_served_together(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "a", IDENTITY, config="max_batch_size: 4\n")
    write_model(second, "b", IDENTITY, config="max_batch_size: 4\n")
    write_model(second, "a", IDENTITY, version=7, config="max_batch_size: 4\n")  # the first repository's 'a' wins
    with ServerProcess(first, "--model-repository", str(second)) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        assert client.is_model_ready("a") and client.is_model_ready("b")
        assert client.get_model_metadata("a").versions == ["1"]
        names = {m.name for m in client.get_model_repository_index().models}
        assert names == {"a", "b"}


PY_IDENTITY = """import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def _raw_load(port: int, name: str, files: bool) -> tuple[int, str]:
    """POST a load with the name unencoded in the path, as Triton's model_control test does with curl."""
    import base64
    import http.client
    import json

    config = {"name": name, "backend": "python", "max_batch_size": 4,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
    parameters = {"config": json.dumps(config)}
    if files:
        parameters["file:/1/model.py"] = base64.b64encode(PY_IDENTITY.encode()).decode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest("POST", f"/v2/repository/models/{name}/load", skip_accept_encoding=True)
        body = json.dumps({"parameters": parameters}).encode()
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize("files", [True, False])
def test_a_python_model_name_python_backend_cannot_launch_is_refused_with_tritons_words(tmp_path: Path,
                                                                                        files: bool) -> None:
    """python_backend refuses a stub name with a shell character (pb_utils.h INVALID_CHARS): Triton's
    model_control test reads "Invalid stub name: contains invalid characters" (before: fastoip's upload refusal or
    its path-separator words answered first). With or without uploaded code, before the code guard."""
    with ServerProcess(tmp_path, "--model-control-mode=explicit", http=True) as server:
        for name in ("model;test", "model|test", "model&test", "model$test", "model`test`", "model(test)",
                     "model\\test", 'model"test"', "model'test'", "model*test", "model~test", "model!test"):
            status, text = _raw_load(server.http_port, name, files)
            assert status == 400, (name, status, text)
            assert "Invalid stub name: contains invalid characters" in text, (name, text)
        # a plain name goes on to the other rules: the code guard for uploaded code, the repository otherwise
        status, text = _raw_load(server.http_port, "model-with-hyphens", files)
        assert "Invalid stub name" not in text and status != 200

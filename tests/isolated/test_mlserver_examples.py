"""MLServer's own examples served unchanged, the way MLServer users start them (issue 38).

Each test writes an example's layout (``mlserver_examples``: equivalents of ``docs-gb/examples/`` of MLServer 1.7,
models trained here), starts ``fastoip mlserver start .`` from inside the folder (a real server process; the
ports come from ``MLSERVER_*`` variables, as an MLServer user would set them) and sends the README's requests,
as its README sends them (``requests``, MLServer's own types and codecs).  The answers expected are MLServer
1.7.1's on the same folders (recorded beside these tests by running ``mlserver start .``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from fastoip.launcher import ChildProcess

pytest.importorskip("mlserver")
pytest.importorskip("mlserver_sklearn")
pytest.importorskip("mlserver_xgboost")
pytest.importorskip("mlserver_lightgbm")

import mlserver_examples as examples  # noqa: E402  (tests/helpers; after the skips: it needs the runtimes)

#: MLServer's variables that put every listener on a free loopback port (the machine runs other servers).
LOOPBACK = {"MLSERVER_HOST": "127.0.0.1", "MLSERVER_HTTP_PORT": "0", "MLSERVER_GRPC_PORT": "0",
            "MLSERVER_METRICS_PORT": "-1"}


class Started:
    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.http = f"http://127.0.0.1:{child.ports['http']}"
        self.grpc = f"127.0.0.1:{child.ports['grpc']}"

    def output(self) -> str:
        return "".join(self.child.lines)

    def post(self, path: str, body: Any) -> requests.Response:
        return requests.post(self.http + path, json=body, timeout=60)


@contextmanager
def start_in(folder: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Started]:
    """``fastoip mlserver start .`` run from inside ``folder``."""
    child = ChildProcess(
        [sys.executable, "-m", "fastoip.cli", "mlserver", "start", ".", "--shutdown-grace", "0", *extra],
        want=("grpc", "http"), env={**os.environ, **LOOPBACK, **(env or {})}, cwd=folder,
    )
    try:
        child.start(120)
    except BaseException:
        print("".join(child.lines))
        child.stop()
        raise
    try:
        yield Started(child)
    finally:
        child.stop()


def readme_request(name: str, x_0: np.ndarray) -> dict[str, Any]:
    """The prebuilt runtimes' README request: ``x_0.shape``, FP32, ``x_0.tolist()``."""
    return {"inputs": [{"name": name, "shape": list(x_0.shape), "datatype": "FP32", "data": x_0.tolist()}]}


# -- prebuilt runtimes: sklearn, xgboost, lightgbm, mms ---------------------------------------------
@pytest.fixture(scope="module")
def sklearn_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Started, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("sklearn")
    case = examples.write_sklearn(folder)
    with start_in(folder) as server:
        yield server, case


def test_sklearn_example_answers_its_readme_request_at_the_labelled_version(
    sklearn_example: tuple[Started, dict[str, Any]],
) -> None:
    server, case = sklearn_example
    response = server.post("/v2/models/mnist-svm/versions/v0.1.0/infer", readme_request("predict", case["x"]))
    assert response.status_code == 200, response.text
    doc = response.json()
    # MLServer 1.7.1 on the same folder: model_version "v0.1.0", output predict INT64 [1, 1], content_type np
    assert doc["model_name"] == "mnist-svm" and doc["model_version"] == "v0.1.0"
    assert len(doc["id"]) == 36  # MLServer names a request that has no id (a UUID) and answers with it
    (output,) = doc["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("predict", "INT64", [1, 1])
    assert output["parameters"] == {"content_type": "np"}
    assert output["data"] == case["expected"].tolist()


def test_a_version_label_names_the_version_everywhere(sklearn_example: tuple[Started, dict[str, Any]]) -> None:
    server, case = sklearn_example
    assert requests.get(server.http + "/v2/models/mnist-svm/versions/v0.1.0/ready", timeout=10).status_code == 200
    assert requests.get(server.http + "/v2/models/mnist-svm", timeout=10).json()["versions"] == ["v0.1.0"]
    index = requests.post(server.http + "/v2/repository/index", json={}, timeout=10).json()
    assert [(e["name"], e["version"], e["state"]) for e in index] == [("mnist-svm", "v0.1.0", "READY")]
    # an unknown label is an unknown version (404, as MLServer), not a malformed one
    missing = server.post("/v2/models/mnist-svm/versions/v9/infer", readme_request("predict", case["x"]))
    assert missing.status_code == 404 and "v9" in missing.json()["error"]
    # inference-request.json of the example carries an id: the answer carries it back
    named = server.post("/v2/models/mnist-svm/versions/v0.1.0/infer",
                        {"id": "request-0", **readme_request("predict", case["x"])})
    assert named.json()["id"] == "request-0"
    # the URL without a version, and Triton's clients' number (COMPATIBILITY.md), reach the same version
    for path in ("/v2/models/mnist-svm/infer", "/v2/models/mnist-svm/versions/1/infer"):
        doc = server.post(path, readme_request("predict", case["x"])).json()
        assert doc["model_version"] == "v0.1.0" and doc["outputs"][0]["data"] == case["expected"].tolist()


def test_the_version_label_over_grpc_with_mlservers_stub(sklearn_example: tuple[Started, dict[str, Any]]) -> None:
    """MLServer's own gRPC client (its generated stub and converters; tritonclient's protos cannot share this
    process with MLServer's: both define package ``inference``)."""
    import grpc
    import mlserver.grpc.converters as converters
    import mlserver.grpc.dataplane_pb2 as pb
    import mlserver.grpc.dataplane_pb2_grpc as dataplane
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest

    server, case = sklearn_example
    with grpc.insecure_channel(server.grpc) as channel:
        stub = dataplane.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name="mnist-svm", version="v0.1.0"), timeout=30).ready
        request = converters.ModelInferRequestConverter.from_types(
            InferenceRequest(inputs=[NumpyCodec.encode_input("predict", case["x"])]),
            model_name="mnist-svm", model_version="v0.1.0",
        )
        response = converters.ModelInferResponseConverter.to_types(stub.ModelInfer(request, timeout=30))
    assert response.model_version == "v0.1.0"
    assert NumpyCodec.decode_output(response.outputs[0]).reshape(-1).tolist() == case["expected"].tolist()


def test_mlserver_clients_nulls_for_unset_fields_are_accepted(sklearn_example: tuple[Started, dict[str, Any]]) -> None:
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest

    server, case = sklearn_example
    request = InferenceRequest(inputs=[NumpyCodec.encode_input("predict", case["x"])])
    body = request.dict()  # what MLServer's examples post: "id": null, "parameters": null, "outputs": null, ...
    assert body["id"] is None and body["parameters"] is None and body["outputs"] is None
    response = server.post("/v2/models/mnist-svm/versions/v0.1.0/infer", body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == case["expected"].tolist()
    # a null parameter is an absent one; a parameter of another type is still refused, naming it
    nulls = {"id": None, "parameters": {"headers": None},
             "inputs": [{**readme_request("predict", case["x"])["inputs"][0], "parameters": {"content_type": None}}],
             "outputs": [{"name": "predict", "parameters": None}]}
    assert server.post("/v2/models/mnist-svm/infer", nulls).status_code == 200
    wrong = server.post("/v2/models/mnist-svm/infer", {**nulls, "parameters": {"headers": [1]}})
    assert wrong.status_code == 400 and "headers" in wrong.json()["error"]
    wrong_id = server.post("/v2/models/mnist-svm/infer", {**nulls, "id": 7})
    assert wrong_id.status_code == 400 and "'id' must be a string" in wrong_id.json()["error"]
    # other endpoints' optional fields
    index = requests.post(server.http + "/v2/repository/index", json={"ready": None}, timeout=10)
    assert index.status_code == 200 and index.json()[0]["name"] == "mnist-svm"


@pytest.mark.parametrize("write", [examples.write_xgboost, examples.write_lightgbm], ids=["xgboost", "lightgbm"])
def test_xgboost_and_lightgbm_examples_answer_their_readme_request(
    tmp_path: Path, write: Any
) -> None:
    case = write(tmp_path)
    with start_in(tmp_path) as server:
        response = server.post(f"/v2/models/{case['model']}/versions/v0.1.0/infer",
                               readme_request(case["input"], case["x"]))
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["model_name"] == case["model"] and doc["model_version"] == "v0.1.0"
        (output,) = doc["outputs"]
        datatype = {"float32": "FP32", "float64": "FP64"}[case["expected"].dtype.name]  # as the model answers
        assert output["datatype"] == datatype and output["parameters"] == {"content_type": "np"}
        np.testing.assert_allclose(np.asarray(output["data"]).reshape(-1), case["expected"].reshape(-1), rtol=1e-6)


def test_mms_example_serves_both_models_from_their_default_uri(tmp_path: Path) -> None:
    cases = examples.write_mms(tmp_path)
    with start_in(tmp_path) as server:
        for case in cases:
            response = server.post(f"/v2/models/{case['model']}/versions/v0.1.0/infer",
                                   readme_request("predict", case["x"]))
            assert response.status_code == 200, response.text
            data = np.asarray(response.json()["outputs"][0]["data"]).reshape(-1)
            np.testing.assert_allclose(data, case["expected"].reshape(-1), rtol=1e-6)


# -- custom runtimes: custom-json, content-type, streaming ---------------------------------------
def test_custom_json_example_answers_its_readme_request(tmp_path: Path) -> None:
    from mlserver.codecs.string import StringRequestCodec
    from mlserver.types import InferenceResponse

    examples.write_custom_json(tmp_path)
    inputs_string = json.dumps({"name": "Foo Bar", "message": "Hello from Client (REST)!"})
    request = {"inputs": [{"name": "echo_request", "shape": [len(inputs_string)], "datatype": "BYTES",
                           "data": [inputs_string]}]}
    with start_in(tmp_path) as server:
        response = server.post("/v2/models/json-hello-world/infer", request)
        assert response.status_code == 200, response.text
        raw_json = StringRequestCodec.decode_response(InferenceResponse.parse_raw(response.text))
        assert json.loads(raw_json[0]) == {
            "request": {"echo_request": {"name": "Foo Bar", "message": "Hello from Client (REST)!"}},
            "server_response": "Got your request. Hello from the server.",
        }


def test_content_type_example_gets_str_for_bytes_over_rest(tmp_path: Path) -> None:
    """The example's runtime serialises ``request_input.dict()`` with ``json.dumps``: it works only when BYTES
    reach it as ``str``, as MLServer gives them over REST (it failed 3 of 3 with 500 before)."""
    from mlserver.codecs import NumpyCodec, StringCodec
    from mlserver.types import InferenceRequest, InferenceResponse

    examples.write_content_type(tmp_path)
    by_hand = {"inputs": [
        {"name": "parameters-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4],
         "parameters": {"content_type": "np"}},
        {"name": "parameters-str", "datatype": "BYTES", "shape": [1], "data": "hello world 😁",
         "parameters": {"content_type": "str"}},
    ]}
    with_codecs = InferenceRequest(inputs=[
        NumpyCodec.encode_input("parameters-np", np.array([[1, 2], [3, 4]])),
        StringCodec.encode_input("parameters-str", ["hello world 😁"], use_bytes=False),
    ])
    with start_in(tmp_path) as server:
        response = server.post("/v2/models/content-type-example/infer", by_hand)
        assert response.status_code == 200, response.text
        first, second = response.json()["outputs"]
        assert (first["datatype"], first["shape"], first["data"]) == ("INT32", [2, 2], [1, 2, 3, 4])
        # MLServer 1.7.1 echoes the bare string as it came ("data": "hello world 😁"); fastoip as its one element
        assert (second["datatype"], second["shape"], second["data"]) == ("BYTES", [1], ["hello world 😁"])
        response = server.post("/v2/models/content-type-example/infer", with_codecs.model_dump())
        assert response.status_code == 200, response.text
        payload = InferenceResponse.parse_raw(response.text)
        assert NumpyCodec.decode_output(payload.outputs[0]).tolist() == [[1, 2], [3, 4]]
        assert StringCodec.decode_output(payload.outputs[1]) == ["hello world 😁"]
        assert "Traceback" not in server.output()


def test_streaming_example_over_rest_with_mlservers_client(tmp_path: Path) -> None:
    import httpx
    from httpx_sse import connect_sse
    from mlserver import types
    from mlserver.codecs import StringCodec

    examples.write_streaming(tmp_path)
    with start_in(tmp_path) as server:
        inference_request = types.InferenceRequest.parse_file(str(tmp_path / "generate-request.json"))
        words = []
        with httpx.Client(timeout=60) as client, connect_sse(
            client, "POST", f"{server.http}/v2/models/text-model/generate_stream", json=inference_request.dict()
        ) as event_source:
            for sse in event_source.iter_sse():
                response = types.InferenceResponse.parse_raw(sse.data)
                words.append(StringCodec.decode_output(response.outputs[0])[0])
        assert "".join(words) == "What is the capital of France?"
        assert len(words) == 6


# -- where the folder is, and what is in it -----------------------------------------------------
def test_serve_dot_from_inside_the_folder_finds_the_model(tmp_path: Path) -> None:
    """``fastoip serve --model-repository .`` (what ``mlserver start .`` users type) loaded 0 models."""
    examples.write_custom_json(tmp_path)
    child = ChildProcess(
        [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", ".", "--host", "127.0.0.1",
         "--grpc-port", "0", "--http-port", "0", "--metrics-port", "-1", "--shutdown-grace", "0"],
        want=("grpc", "http"), cwd=tmp_path,
    )
    child.start(120)
    try:
        index = requests.post(f"http://127.0.0.1:{child.ports['http']}/v2/repository/index", json={}, timeout=10)
        assert [(e["name"], e["state"]) for e in index.json()] == [("json-hello-world", "READY")]
        # the folder's settings.json is MLServer's: `serve` says who reads it instead of ignoring it in silence
        assert "is read by `fastoip mlserver start" in "".join(child.lines)
    finally:
        child.stop()


def test_an_empty_folder_is_a_loud_error_not_a_silent_ready(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no model here")
    with start_in(tmp_path) as server:
        index = requests.post(server.http + "/v2/repository/index", json={}, timeout=10).json()
        assert index == []
        assert "holds no model" in server.output() and str(tmp_path) in server.output()


def test_settings_json_and_mlserver_variables_choose_the_server(tmp_path: Path) -> None:
    """settings.json wins over MLSERVER_* (MLServer's precedence): its server_name reaches the metadata, its
    http_port of 0 wins over the variable's port; a setting fastoip does not act on is said, not dropped."""
    examples.write_custom_json(tmp_path)
    (tmp_path / "settings.json").write_text(json.dumps(
        {"server_name": "from-settings", "http_port": 0, "cors_settings": {"allow_origins": ["*"]}}
    ))
    with start_in(tmp_path, env={"MLSERVER_HTTP_PORT": "1", "MLSERVER_SERVER_NAME": "from-env"}) as server:
        assert requests.get(server.http + "/v2", timeout=10).json()["name"] == "from-settings"
        assert "'cors_settings' is not used by fastoip" in server.output()
        assert "is read by `fastoip mlserver start" not in server.output()


@pytest.mark.parametrize("frontend", ["native", "grpcio"])
def test_streaming_example_over_grpc_with_mlservers_stub(tmp_path: Path, frontend: str) -> None:
    """The README's gRPC client: MLServer's generated stub reads ModelStreamInfer's messages as bare
    ModelInferResponses (``fastoip mlserver start`` serves MLServer models so); a Triton model beside it keeps
    Triton's ModelStreamInferResponse on the same method; an MLServer model's error ends the stream."""
    import asyncio

    import grpc
    import mlserver.grpc.converters as converters
    import mlserver.grpc.dataplane_pb2 as pb
    import mlserver.grpc.dataplane_pb2_grpc as dataplane
    from mlserver import types
    from mlserver.codecs import StringCodec
    from mlserver.grpc.converters import ModelInferResponseConverter
    from onnx import TensorProto

    from fastoip._proto import grpc_service_pb2 as triton_pb
    from models import identity_model_bytes, write_model

    examples.write_streaming(tmp_path)
    write_model(tmp_path, "identity", identity_model_bytes(TensorProto.FLOAT, [2]))
    inference_request = types.InferenceRequest.parse_file(str(tmp_path / "generate-request.json"))
    inference_request.inputs[0] = StringCodec.encode_input("prompt", inference_request.inputs[0].data.root)
    inference_request_g = converters.ModelInferRequestConverter.from_types(
        inference_request, model_name="text-model", model_version=None
    )

    async def readme_client(url: str) -> list[str]:
        async def get_inference_request_stream(request: Any) -> Any:
            yield request

        words: list[str] = []
        async with grpc.aio.insecure_channel(url) as grpc_channel:
            grpc_stub = dataplane.GRPCInferenceServiceStub(grpc_channel)
            async for response in grpc_stub.ModelStreamInfer(get_inference_request_stream(inference_request_g)):
                response = ModelInferResponseConverter.to_types(response)
                words.extend(StringCodec.decode_output(response.outputs[0]))
        return words

    with start_in(tmp_path, "--grpc-frontend", frontend) as server:
        assert "".join(asyncio.run(readme_client(server.grpc))) == "What is the capital of France?"
        with grpc.insecure_channel(server.grpc) as channel:
            triton_stream = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=triton_pb.ModelInferRequest.SerializeToString,
                response_deserializer=triton_pb.ModelStreamInferResponse.FromString,
            )
            request = triton_pb.ModelInferRequest(model_name="identity", raw_input_contents=[
                np.array([1.5, 2.5], dtype=np.float32).tobytes()])
            request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
            (answer,) = list(triton_stream(iter([request]), timeout=30))
            assert not answer.error_message and answer.infer_response.model_name == "identity"
            assert np.frombuffer(answer.infer_response.raw_output_contents[0], dtype=np.float32).tolist() == [1.5, 2.5]
            # an MLServer model's failure ends the stream with a status, as MLServer's servicer aborts
            bad = pb.ModelInferRequest(model_name="text-model", inputs=[pb.ModelInferRequest.InferInputTensor(
                name="prompt", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"\xff"]))])
            stub = dataplane.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as failed:
                list(stub.ModelStreamInfer(iter([bad]), timeout=30))
            assert failed.value.code() != grpc.StatusCode.OK


def test_content_type_example_with_model_metadata(tmp_path: Path) -> None:
    """The README's second model-settings.json: the inputs' content types come from the model's metadata and the
    request carries no parameters (MLServer 1.7.1 answers 200, echoing both inputs)."""
    examples.write_content_type(tmp_path, with_metadata=True)
    payload = {"inputs": [
        {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "data": "hello world 😁"},
    ]}
    with start_in(tmp_path) as server:
        response = server.post("/v2/models/content-type-example/infer", payload)
        assert response.status_code == 200, response.text
        first, second = response.json()["outputs"]
        assert (first["name"], first["data"]) == ("metadata-np", [1, 2, 3, 4])
        # MLServer echoes shape [11] and the bare string; fastoip the string as its one element (COMPATIBILITY.md)
        assert (second["name"], second["data"]) == ("metadata-str", ["hello world 😁"])
        assert "Traceback" not in server.output()

"""Requests as Triton treats them: duplicate requested outputs refused; a raw binary BYTES body is the element."""

from __future__ import annotations

import http.client
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, write_model
from serverproc import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root: Path = tmp_path_factory.mktemp("requests")
    write_model(root, "identity", identity_model_bytes(TensorProto.FLOAT, [4]))
    write_model(
        root,
        "text",
        identity_model_bytes(TensorProto.STRING, [1]),
        config='max_batch_size: 4\ninput { name: "INPUT0" data_type: TYPE_STRING dims: [1] }\n',
    )
    with ServerProcess(root, http=True) as proc:
        yield proc


def _input(module, data: np.ndarray):  # type: ignore[no-untyped-def]
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_duplicate_requested_outputs_are_refused(server: ServerProcess, protocol: str) -> None:
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    data = np.ones((1, 4), np.float32)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT0")]  # type: ignore[attr-defined]
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [_input(module, data)], outputs=outputs)
    assert "output 'OUTPUT0' already exists in request" in err.value.message()
    assert err.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")
    result = client.infer("identity", [_input(module, data)])  # the server is fine
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def _raw_post(server: ServerProcess, model: str, body: bytes) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request(
            "POST", f"/v2/models/{model}/infer", body,
            {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"},
        )
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_raw_binary_bytes_body_is_the_one_element(server: ServerProcess) -> None:
    text = b"hello \x00 raw \xff bytes"
    status, headers, payload = _raw_post(server, "text", text)
    assert status == 200, payload
    header_length = int(headers["inference-header-content-length"])
    header = json.loads(payload[:header_length])
    [output] = header["outputs"]
    assert output["datatype"] == "BYTES" and output["shape"] == [1, 1]
    binary = payload[header_length:]
    (length,) = struct.unpack("<I", binary[:4])
    assert binary[4 : 4 + length] == text  # the server added the length prefix; the element came back whole


def test_raw_binary_needs_a_bytes_input_of_shape_one(server: ServerProcess) -> None:
    status, _, payload = _raw_post(server, "identity", b"\x00" * 15)
    assert status == 400 and b"needs 16 bytes" in payload


def test_too_deep_json_uses_tritons_words(server: ServerProcess) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        body = b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}"
        connection.request("POST", "/v2/models/identity/infer", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 400
    assert payload["error"].startswith("JSON nesting depth exceeds maximum allowed limit")


def test_json_data_that_does_not_fill_the_shape_uses_tritons_words(server: ServerProcess) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        request = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0]}]}
        headers = {"Content-Type": "application/json"}
        connection.request("POST", "/v2/models/identity/infer", json.dumps(request), headers)
        response = connection.getresponse()
        payload = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 400
    assert payload["error"].startswith("Unable to parse 'data': Shape does not match true shape of 'data' field")
    assert "needs 4 elements" in payload["error"]


def test_grpc_wildcard_dimension_in_a_request_uses_tritons_words(server: ServerProcess) -> None:
    import grpc

    from fastoip._proto import grpc_service_pb2 as pb
    from fastoip._proto import grpc_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="identity")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 4])
        request.raw_input_contents.append(b"\x00" * 16)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "All input dimensions should be specified for input 'INPUT0'" in err.value.details()


def test_missing_input_is_worded_as_triton_words_it(tmp_path: Path) -> None:
    from fastoip.core import Core
    from fastoip.errors import InvalidArgument
    from fastoip.repository import RepositoryOptions
    from fastoip.types import InferRequest

    write_model(tmp_path, "identity", identity_model_bytes(TensorProto.FLOAT, [4]))
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        with pytest.raises(InvalidArgument) as err:
            core.infer(InferRequest("identity"))
        assert str(err.value) == (
            "expected 1 inputs but got 0 inputs for model 'identity'. Got input(s) [], "
            "but missing required input(s) ['INPUT0']. Please provide all required input(s)."
        )
    finally:
        core.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_request_errors_name_the_request_id_as_triton_does(server: ServerProcess, protocol: str) -> None:
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    wrong = module.InferInput("INPUT0", [1, 3], "FP32")  # type: ignore[attr-defined]
    wrong.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [wrong], request_id="req-42")
    assert err.value.message().startswith("[request id: req-42] "), err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [wrong])
    assert not err.value.message().startswith("[request id"), err.value.message()

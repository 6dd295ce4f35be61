"""KServe's own SDK (``kserve.InferenceRESTClient`` and ``InferenceGRPCClient``) against a real fastoip server.

kserve 0.21 cannot be installed beside mlserver 1.7 (kserve needs starlette>=1.3.1, mlserver's fastapi<0.116
pins starlette<0.47), and mlserver is the one in the test extra; ``make test-kserve`` runs them in a venv of
their own (``.venv-kserve``, kserve 0.21.0, no mlserver); elsewhere they skip.
KServe's client has no metadata call; metadata is checked with tritonclient in tests/test_http.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

import fastoip
from fastoip.demo import write_repository
from models import identity_model_bytes, write_model

kserve = pytest.importorskip("kserve")
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = write_repository(tmp_path_factory.mktemp("kserve") / "repository", ["simple"])
    write_model(root, "text", identity_model_bytes(TensorProto.STRING, [1]))
    with fastoip.Server(root) as server:
        yield server


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


def simple_request(binary: bool) -> tuple[InferRequest, np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return InferRequest(model_name="simple", infer_inputs=inputs, request_id="r1"), a, b


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rest_client_v2(server: fastoip.Server, binary: bool) -> None:
    async def go() -> None:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=10))
        base = f"http://{server.http_url}"
        try:
            assert await client.is_server_live(base) is True
            assert await client.is_server_ready(base) is True
            assert await client.is_model_ready(base, "simple") is True
            assert await client.is_model_ready(base, "nope") is False
            request, a, b = simple_request(binary)
            response = await client.infer(base, request, model_name="simple")
            outputs = {output.name: output.as_numpy() for output in response.outputs}
            np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
            np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
        finally:
            await client.close()

    run(go())


def test_rest_client_v2_bytes(server: fastoip.Server) -> None:
    async def go() -> None:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=10))
        try:
            words = np.array([["héllo"], ["world"]], dtype=object)
            tensor = InferInput("INPUT0", [2, 1], "BYTES")
            tensor.set_data_from_numpy(words, binary_data=False)
            response = await client.infer(
                f"http://{server.http_url}", InferRequest(model_name="text", infer_inputs=[tensor]), model_name="text"
            )
            got = response.outputs[0].as_numpy()
            assert [x.decode() if isinstance(x, bytes) else x for x in got.reshape(-1)] == ["héllo", "world"]
        finally:
            await client.close()

    run(go())


def test_rest_client_v1(server: fastoip.Server) -> None:
    async def go() -> None:
        client = InferenceRESTClient(RESTConfig(protocol="v1", timeout=10))
        base = f"http://{server.http_url}"
        try:
            assert await client.is_server_live(base) is True
            assert await client.is_model_ready(base, "simple") is True
            rows = [{"INPUT0": [1] * 16, "INPUT1": [2] * 16}]
            answer = await client.infer(base, {"instances": rows}, model_name="simple")
            assert answer == {"predictions": [{"OUTPUT0": [3] * 16, "OUTPUT1": [-1] * 16}]}
        finally:
            await client.close()

    run(go())


def test_grpc_client(server: fastoip.Server) -> None:
    async def go() -> None:
        client = InferenceGRPCClient(server.grpc_url, timeout=10)
        try:
            assert await client.is_server_live() is True
            assert await client.is_server_ready() is True
            assert await client.is_model_ready("simple") is True
            request, a, b = simple_request(binary=True)
            response = await client.infer(request)
            outputs = {output.name: output.as_numpy() for output in response.outputs}
            np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
            words = np.array([[b"h\xc3\xa9llo"], [b"world"]], dtype=object)
            tensor = InferInput("INPUT0", [2, 1], "BYTES")
            tensor.set_data_from_numpy(words)
            response = await client.infer(InferRequest(model_name="text", infer_inputs=[tensor]))
            assert response.outputs[0].as_numpy().reshape(-1).tolist() == [b"h\xc3\xa9llo", b"world"]
        finally:
            await client.close()

    run(go())

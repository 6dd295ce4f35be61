"""Triton's HTTP body semantics for binary tensor data (issue 41, `test_growth_error`): with the binary extension
(Inference-Header-Content-Length) --http-max-input-size bounds the JSON part, --http-max-binary-input-size the
binary data after it, and every body larger than --http-max-input-size draws from one server-wide budget
(--http-max-body-bytes-in-flight): 503 with Retry-After while others hold it, 413 when it could never fit.
Real server processes, real sockets, tritonclient.http for the served requests."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(300)
MIB = 1024 * 1024
JSON_LIMIT = 64 * 1024
BINARY_LIMIT = 16 * MIB
BUDGET = 8 * MIB
CONFIG = """name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""


def write_identity(root: Path) -> Path:
    write_model(root, "identity", identity_model_bytes(TensorProto.UINT8, ["n"], batch=False), config=CONFIG)
    return root


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_identity(tmp_path_factory.mktemp("binbody-repo"))
    with ServerProcess(root, "--http-max-input-size", str(JSON_LIMIT), "--http-max-binary-input-size",
                       str(BINARY_LIMIT), "--http-max-body-bytes-in-flight", str(BUDGET), http=True) as proc:
        yield proc


def infer_with_tritonclient(port: int, size: int) -> None:
    data = (np.arange(size) % 251).astype(np.uint8)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120, connection_timeout=120)
    try:
        tensor = httpclient.InferInput("INPUT0", [size], "UINT8")
        tensor.set_data_from_numpy(data, binary_data=True)
        result = client.infer("identity", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def binary_request(size: int, json_padding: int = 0) -> tuple[bytes, bytes]:
    """(JSON part, JSON part + ``size`` binary bytes) of an identity request with the binary extension."""
    document = {"inputs": [{"name": "INPUT0", "shape": [size], "datatype": "UINT8",
                            "parameters": {"binary_data_size": size}}],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    header = json.dumps(document).encode() + b" " * json_padding
    return header, header + bytes(size)


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v2/models/identity/infer", body, headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def post_binary(port: int, size: int, json_padding: int = 0) -> tuple[int, dict[str, str], bytes]:
    header, body = binary_request(size, json_padding)
    return post(port, body, {"Inference-Header-Content-Length": str(len(header))})


def error_of(payload: bytes) -> str:
    return str(json.loads(payload)["error"])


def test_a_binary_body_past_the_default_input_size_is_served(tmp_path: Path) -> None:
    """Triton reads the binary data after the JSON part whatever --http-max-input-size (64 MB) says."""
    size = 80 * MIB
    with ServerProcess(write_identity(tmp_path), http=True) as server:
        infer_with_tritonclient(server.http_port, size)
        infer_with_tritonclient(server.http_port, 1024)


def test_binary_data_is_bounded_by_its_own_limit_not_the_json_one(small_server: ServerProcess) -> None:
    infer_with_tritonclient(small_server.http_port, 4 * MIB)  # 64 times --http-max-input-size
    status, _, payload = post_binary(small_server.http_port, BINARY_LIMIT + MIB)
    assert status == 413 and "--http-max-binary-input-size" in error_of(payload)
    infer_with_tritonclient(small_server.http_port, 1024)


def test_the_json_part_over_the_input_size_is_413(small_server: ServerProcess) -> None:
    status, _, payload = post_binary(small_server.http_port, 1024, json_padding=JSON_LIMIT)
    message = error_of(payload)
    assert status == 413 and "JSON part" in message and "--http-max-input-size" in message
    # A raw body (header length 0) and a body without the extension stay bounded as a whole, as in Triton.
    status, _, payload = post(small_server.http_port, bytes(JSON_LIMIT + 1024),
                              {"Inference-Header-Content-Length": "0"})
    assert status == 413 and "--http-max-input-size" in error_of(payload)
    # A compressed body stays bounded by the limit once inflated (and by the inflation budget).
    header, body = binary_request(4 * MIB)
    status, _, payload = post(small_server.http_port, gzip.compress(body),
                              {"Inference-Header-Content-Length": str(len(header)), "Content-Encoding": "gzip"})
    assert status == 413 and "decompressed" in error_of(payload)
    infer_with_tritonclient(small_server.http_port, 1024)


def test_a_body_larger_than_the_whole_budget_is_413(small_server: ServerProcess) -> None:
    status, _, payload = post_binary(small_server.http_port, BUDGET + MIB)  # within the binary limit
    assert status == 413 and "--http-max-body-bytes-in-flight" in error_of(payload)
    infer_with_tritonclient(small_server.http_port, 1024)


def test_bodies_past_the_budget_in_flight_are_503_and_the_server_serves_after(small_server: ServerProcess) -> None:
    """A client that declares a large body and sends it slowly holds its share; the next large body that would
    pass the budget is answered at once (503, Retry-After); small bodies are still served; once the holder goes,
    the large body is served."""
    port = small_server.http_port
    size = 5 * MIB  # two of them pass the 8 MiB budget
    header, body = binary_request(size)
    holder = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        holder.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(header), len(body))
                       + body[: len(header) + 1024])
        deadline = time.monotonic() + 30
        while True:  # the holder's headers are read by the server in a moment
            status, headers, payload = post_binary(port, size)
            if status == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 503, payload
        assert headers.get("retry-after") == "1"
        assert "--http-max-body-bytes-in-flight" in error_of(payload)
        infer_with_tritonclient(port, 1024)  # within --http-max-input-size: draws nothing from the budget
        infer_with_tritonclient(port, 2 * MIB)  # fits beside the holder
    finally:
        holder.close()
    deadline = time.monotonic() + 30
    while True:  # the holder's share is given back when its connection is gone
        status, _, payload = post_binary(port, size)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200, payload
    infer_with_tritonclient(port, size)


def test_a_large_body_whose_json_is_parsed_in_a_worker_holds_its_copies(tmp_path: Path) -> None:
    """A JSON part of 2 MiB or more is parsed in a worker process, the whole body copied there and back: such a
    body holds three times its size of the budget, so those copies are bounded too."""
    root = write_identity(tmp_path)
    with ServerProcess(root, "--http-max-input-size", str(3 * MIB), "--http-max-body-bytes-in-flight",
                       str(16 * MIB), http=True) as server:
        padding = 2 * MIB + 1024
        status, _, payload = post_binary(server.http_port, 2 * MIB, json_padding=padding)  # 3 x 4 MiB fits
        assert status == 200, payload
        status, _, payload = post_binary(server.http_port, 4 * MIB, json_padding=padding)  # 3 x 6 MiB does not
        assert status == 413 and "--http-max-body-bytes-in-flight" in error_of(payload)
        status, _, payload = post_binary(server.http_port, 8 * MIB)  # the same data with a small JSON part
        assert status == 200, payload
        infer_with_tritonclient(server.http_port, 1024)

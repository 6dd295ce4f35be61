"""The HTTP/REST frontend end to end: endpoints, JSON inference, the binary extension, every error path.

Real ``fastoip serve`` processes on loopback; requests are written by hand
with ``http.client`` so status codes, headers and bodies are checked exactly.
Error tests send the bad request and then a correct infer on the *same*
keep-alive connection: the server must answer the error and keep serving.
"""

from __future__ import annotations

import gzip
import http.client
import json
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from serverproc import ServerProcess
from simple_model import SIMPLE_METADATA

pytestmark = pytest.mark.timeout(120)

Body = bytes | str | dict | list | None


class Client:
    """One keep-alive HTTP/1.1 connection to the server under test."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(
        self,
        method: str,
        path: str,
        body: Body = None,
        headers: dict | None = None,
        chunked: bool = False,
    ) -> tuple[int, dict, bytes]:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if chunked:
            data = body or b""
            body = iter([data[i : i + 1024] for i in range(0, len(data), 1024)])  # type: ignore[assignment]
        self.conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        response = self.conn.getresponse()
        payload = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, payload

    def json(self, method: str, path: str, body: Body = None, headers: dict | None = None) -> tuple[int, object]:
        status, response_headers, payload = self.call(method, path, body, headers)
        if status != 200 or payload:
            assert response_headers["content-type"] == "application/json", (status, payload)
        return status, json.loads(payload) if payload else None

    def close(self) -> None:
        self.conn.close()


def error_of(status_and_body: tuple[int, object]) -> tuple[int, str]:
    status, body = status_and_body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    return status, body["error"]


def simple_request(values: Iterable[int] | None = None, request_id: str = "") -> dict:
    data = list(values if values is not None else range(16))
    request: dict = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": data},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    if request_id:
        request["id"] = request_id
    return request


def assert_simple_works(client: Client) -> None:
    """A correct infer on ``client``'s connection: the server is still serving."""
    status, body = client.json("POST", "/v2/models/simple/infer", simple_request())
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}  # type: ignore[index]
    assert outputs["OUTPUT0"]["data"] == [v + 1 for v in range(16)]
    assert outputs["OUTPUT1"]["data"] == [v - 1 for v in range(16)]


def binary_body(header: dict, *tensors: bytes) -> tuple[bytes, dict]:
    """A binary-extension body and its Inference-Header-Content-Length header."""
    json_part = json.dumps(header).encode()
    return json_part + b"".join(tensors), {"Inference-Header-Content-Length": str(len(json_part))}


def split_binary_response(headers: dict, payload: bytes) -> tuple[dict, dict[str, bytes]]:
    """The JSON header and each binary output's bytes from a binary-extension response."""
    length = int(headers["inference-header-content-length"])
    doc = json.loads(payload[:length])
    blobs, offset = {}, length
    for out in doc["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blobs[out["name"]] = payload[offset : offset + size]
            offset += size
    assert offset == len(payload)
    return doc, blobs


def frame_bytes(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


# --------------------------------------------------------------------------- #
# Servers                                                                     #
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def server(demo_repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, http=True) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess):  # type: ignore[no-untyped-def]
    c = Client(server.http_port)
    yield c
    c.close()


SMALL_LIMIT = 4096


@pytest.fixture(scope="module")
def small_server(demo_repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--http-max-input-size", str(SMALL_LIMIT), http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """simple + a model whose model.onnx is junk: the server starts, but is not ready."""
    from fastoip.demo import write_repository

    root = write_repository(tmp_path_factory.mktemp("broken-repo"), names=["simple"])
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    with ServerProcess(root, http=True) as proc:
        yield proc


def _private_server(root: Path):  # type: ignore[no-untyped-def]
    from fastoip.demo import write_repository

    repo = write_repository(root, names=["simple", "identity_fp32"])
    with ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*", http=True) as proc:
        yield proc


@pytest.fixture
def repo_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A private server for the test that unloads and reloads models (readiness must be exact)."""
    yield from _private_server(tmp_path / "repo")


@pytest.fixture(scope="module")
def control_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A server whose models may be reloaded with other configs (not the shared one)."""
    yield from _private_server(tmp_path_factory.mktemp("control-repo"))


# --------------------------------------------------------------------------- #
# Health, metadata, config, statistics                                        #
# --------------------------------------------------------------------------- #


def test_health_live_and_ready(client: Client) -> None:
    # KServe's server health bodies (its REST client parses them); the model's V2 readiness is empty (the spec)
    assert client.json("GET", "/v2/health/live") == (200, {"live": True})
    assert client.json("GET", "/v2/health/ready") == (200, {"ready": True})
    for path in ("/v2/models/simple/ready", "/v2/models/simple/versions/1/ready"):
        status, _, payload = client.call("GET", path)
        assert (status, payload) == (200, b""), path


def test_model_ready_false_names_the_model(client: Client) -> None:
    status, message = error_of(client.json("GET", "/v2/models/nope/ready"))
    assert status == 400 and "'nope'" in message
    status, message = error_of(client.json("GET", "/v2/models/simple/versions/7/ready"))
    assert status == 400 and "version 7" in message
    assert_simple_works(client)


def test_server_metadata(client: Client) -> None:
    status, body = client.json("GET", "/v2")
    assert status == 200
    assert body["name"] == "fastoip"  # type: ignore[index]
    assert isinstance(body["version"], str)  # type: ignore[index]
    assert {"model_repository", "binary_tensor_data"} <= set(body["extensions"])  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata(client: Client, path: str) -> None:
    status, body = client.json("GET", path)
    assert status == 200
    assert body == SIMPLE_METADATA


def test_model_config_is_tritons_json_form(client: Client) -> None:
    status, config = client.json("GET", "/v2/models/mlp/config")
    assert status == 200
    assert config["name"] == "mlp"  # type: ignore[index]
    assert config["max_batch_size"] == 64  # type: ignore[index]
    # int64 fields are numbers, not the strings proto3 JSON would write.
    assert config["input"][0]["dims"] == [256]  # type: ignore[index]
    assert config["input"][0]["data_type"] == "TYPE_FP32"  # type: ignore[index]
    assert config["output"][0]["dims"] == [10]  # type: ignore[index]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # type: ignore[index]
    status, versioned = client.json("GET", "/v2/models/mlp/versions/1/config")
    assert (status, versioned) == (200, config)


def test_statistics(client: Client) -> None:
    assert_simple_works(client)
    status, body = client.json("GET", "/v2/models/simple/stats")
    assert status == 200
    (stats,) = body["model_stats"]  # type: ignore[index]
    assert stats["name"] == "simple" and stats["version"] == "1"
    assert stats["inference_count"] >= 1 and stats["execution_count"] >= 1
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert isinstance(stats["inference_stats"]["success"]["ns"], int)
    status, body = client.json("GET", "/v2/models/simple/versions/1/stats")
    assert status == 200 and body["model_stats"][0]["name"] == "simple"  # type: ignore[index]
    status, body = client.json("GET", "/v2/models/stats")
    assert status == 200
    names = {s["name"] for s in body["model_stats"]}  # type: ignore[index]
    assert {"simple", "identity_fp32", "image_identity", "string_identity", "mlp"} <= names


def test_repository_index(client: Client) -> None:
    status, index = client.json("POST", "/v2/repository/index")
    assert status == 200
    entries = {e["name"]: e for e in index}  # type: ignore[union-attr]
    assert entries["simple"] == {"name": "simple", "version": "1", "state": "READY", "reason": ""}
    status, ready_index = client.json("POST", "/v2/repository/index", {"ready": True})
    assert status == 200 and ready_index == index


# --------------------------------------------------------------------------- #
# JSON inference                                                              #
# --------------------------------------------------------------------------- #


def test_spec_request_example(client: Client) -> None:
    """The spec's request example, on 'simple' (the spec's 'mymodel' / input0 / input1 / output0 do not exist here).

    Adapted: model simple, inputs INPUT0/INPUT1 INT32 [1,16] (the example's
    UINT32 [2,2] and BOOL [3] do not fit a demo model), output OUTPUT0.
    Kept verbatim: the request layout, "id": "42", a requested output, and the
    response layout, which must echo the id.
    """
    request = simple_request(range(16), request_id="42")
    request["outputs"] = [{"name": "OUTPUT0"}]
    status, headers, payload = client.call(
        "POST", "/v2/models/simple/infer", json.dumps(request), {"Content-Type": "application/json"}
    )
    assert status == 200 and headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(payload)
    assert json.loads(payload) == {
        "model_name": "simple",
        "model_version": "1",
        "id": "42",
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": [v + 1 for v in range(16)]}],
    }


def test_spec_response_example_values(client: Client) -> None:
    """The spec's response example data [1.0, 1.1, 2.0, 2.1, 3.0, 3.1] (FP32) through identity_fp32.

    Adapted: the example's output is FP32 [3,2]; identity_fp32 takes FP32
    [-1,16], so the six values lead a [1,16] tensor.  The data goes in nested
    (the spec's "natural format") and comes back flat, as float32 values.
    """
    values = [1.0, 1.1, 2.0, 2.1, 3.0, 3.1] + [0.0] * 10
    request = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [values]}]}
    status, body = client.json("POST", "/v2/models/identity_fp32/infer", request)
    assert status == 200
    (out,) = body["outputs"]  # type: ignore[index]
    assert out["name"] == "OUTPUT0" and out["datatype"] == "FP32" and out["shape"] == [1, 16]
    assert np.array_equal(np.array(out["data"], dtype=np.float32), np.array(values, dtype=np.float32))
    assert "id" not in body  # type: ignore[operator]


def test_no_content_type_needed_and_keep_alive(client: Client) -> None:
    # http.client sends no Content-Type; several requests share one connection.
    for _ in range(3):
        assert_simple_works(client)


def test_json_bytes_strings(client: Client) -> None:
    words = [["hello", "wörld", ""], ["日本", "a b", "x"]]
    request = {"inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "BYTES", "data": words}]}
    status, body = client.json("POST", "/v2/models/string_identity/infer", request)
    assert status == 200
    assert body["outputs"] == [  # type: ignore[index]
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2, 3], "data": [w for row in words for w in row]}
    ]


def test_request_parameters_and_per_output_binary(client: Client) -> None:
    request = simple_request(request_id="mixed")
    request["parameters"] = {"custom": "value", "binary_data_output": False}
    request["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]
    status, headers, payload = client.call("POST", "/v2/models/simple/infer", request)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    doc, blobs = split_binary_response(headers, payload)
    out0, out1 = doc["outputs"]
    assert out0["parameters"] == {"binary_data_size": 64} and "data" not in out0
    assert np.array_equal(np.frombuffer(blobs["OUTPUT0"], "<i4"), np.arange(16) + 1)
    assert out1["data"] == [v - 1 for v in range(16)] and "parameters" not in out1


# --------------------------------------------------------------------------- #
# Binary tensor extension                                                     #
# --------------------------------------------------------------------------- #


def test_binary_request_and_response(client: Client) -> None:
    a = np.arange(32, dtype="<i4").reshape(2, 16)
    b = np.full((2, 16), 3, dtype="<i4")
    header = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "parameters": {"binary_data_size": a.nbytes}},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "parameters": {"binary_data_size": b.nbytes}},
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, a.tobytes(), b.tobytes())
    status, response_headers, payload = client.call("POST", "/v2/models/simple/infer", body, headers)
    assert status == 200
    assert response_headers["content-type"] == "application/octet-stream"
    doc, blobs = split_binary_response(response_headers, payload)
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert np.array_equal(np.frombuffer(blobs["OUTPUT0"], "<i4").reshape(2, 16), a + b)
    assert np.array_equal(np.frombuffer(blobs["OUTPUT1"], "<i4").reshape(2, 16), a - b)


def test_binary_bytes_with_empty_nul_and_non_utf8(client: Client) -> None:
    elements = [b"", b"\x00", b"a\x00b", b"\xff\xfe\xfd", "héllo".encode()]
    framed = frame_bytes(elements)
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 5], "datatype": "BYTES", "parameters": {"binary_data_size": len(framed)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    body, headers = binary_body(header, framed)
    status, response_headers, payload = client.call("POST", "/v2/models/string_identity/infer", body, headers)
    assert status == 200, payload
    doc, blobs = split_binary_response(response_headers, payload)
    assert doc["outputs"][0]["shape"] == [1, 5]
    assert blobs["OUTPUT0"] == framed


def test_non_utf8_bytes_output_as_json_is_a_clear_error(client: Client) -> None:
    framed = frame_bytes([b"ok", b"\xff\xfe"])
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": len(framed)}}]
    }
    body, headers = binary_body(header, framed)
    status, message = error_of(client.json("POST", "/v2/models/string_identity/infer", body, headers))
    assert status == 400
    assert "OUTPUT0" in message and "UTF-8" in message and "binary_data" in message
    assert_simple_works(client)


def test_raw_binary_request(client: Client) -> None:
    """Inference-Header-Content-Length: 0: the body is the one input; batch of one; outputs binary."""
    values = np.linspace(-1, 1, 16, dtype="<f4")
    status, headers, payload = client.call(
        "POST", "/v2/models/identity_fp32/infer", values.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    doc, blobs = split_binary_response(headers, payload)
    assert doc["outputs"][0]["shape"] == [1, 16]
    assert np.array_equal(np.frombuffer(blobs["OUTPUT0"], "<f4"), values)


def test_raw_binary_large_image(client: Client) -> None:
    image = np.random.default_rng(1).standard_normal((3, 224, 224)).astype("<f4")
    status, headers, payload = client.call(
        "POST", "/v2/models/image_identity/infer", image.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200
    doc, blobs = split_binary_response(headers, payload)
    assert doc["outputs"][0]["shape"] == [1, 3, 224, 224]
    assert blobs["OUTPUT0"] == image.tobytes()


def test_raw_binary_request_errors(client: Client) -> None:
    status, message = error_of(
        client.json("POST", "/v2/models/simple/infer", b"\x00" * 64, {"Inference-Header-Content-Length": "0"})
    )
    assert status == 400 and "exactly one input" in message
    # Triton's words (L0_http), then fastoip's detail.
    assert message.startswith("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple'")
    assert_simple_works(client)
    status, message = error_of(
        client.json("POST", "/v2/models/identity_fp32/infer", b"\x00" * 60, {"Inference-Header-Content-Length": "0"})
    )
    assert status == 400 and "needs 64 bytes" in message and "60" in message
    assert_simple_works(client)
    status, message = error_of(
        client.json("POST", "/v2/models/string_identity/infer", frame_bytes([b"a"]), {"Inference-Header-Content-Length": "0"})
    )
    assert status == 400 and "the model must have input shape [1]" in message
    assert_simple_works(client)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(client: Client, encoding: str) -> None:
    raw = json.dumps(simple_request(range(16))).encode()
    compressed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    status, headers, payload = client.call(
        "POST",
        "/v2/models/simple/infer",
        compressed,
        {"Content-Encoding": encoding, "Accept-Encoding": encoding},
    )
    assert status == 200
    assert headers["content-encoding"] == encoding
    plain = gzip.decompress(payload) if encoding == "gzip" else zlib.decompress(payload)
    outputs = {o["name"]: o["data"] for o in json.loads(plain)["outputs"]}
    assert outputs["OUTPUT0"] == [v + 1 for v in range(16)]


def test_no_compression_unless_asked(client: Client) -> None:
    status, headers, _ = client.call("POST", "/v2/models/simple/infer", simple_request(), {"Accept-Encoding": "identity"})
    assert status == 200 and "content-encoding" not in headers


# --------------------------------------------------------------------------- #
# Errors: status, body, and the server keeps serving                          #
# --------------------------------------------------------------------------- #


def _input(name: str = "INPUT0", datatype: str = "INT32", shape: list | None = None, data: object = None) -> dict:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape if shape is not None else [1, 16],
        "data": data if data is not None else list(range(16)),
    }


def _two(first: dict) -> dict:
    return {"inputs": [first, _input("INPUT1")]}


JSON_ERRORS = [
    # (id, path, body, headers, status, words the message must contain)
    ("unknown-model", "/v2/models/nope/infer", simple_request(), None, 404, ["nope"]),
    ("unknown-version", "/v2/models/simple/versions/9/infer", simple_request(), None, 404, ["simple", "9"]),
    ("wrong-input-name", "/v2/models/simple/infer", _two(_input("INPUTX")), None, 400, ["INPUTX", "simple", "INPUT0"]),
    ("wrong-datatype", "/v2/models/simple/infer", _two(_input(datatype="FP32")), None, 400, ["INPUT0", "FP32", "INT32"]),
    ("wrong-shape", "/v2/models/simple/infer", _two(_input(shape=[1, 8], data=list(range(8)))), None, 400,
     ["INPUT0", "[-1, 16]", "[1, 8]"]),
    ("element-count", "/v2/models/simple/infer", _two(_input(data=list(range(15)))), None, 400, ["INPUT0", "16", "15"]),
    ("non-integer-data", "/v2/models/simple/infer", _two(_input(data=[0.5] * 16)), None, 400, ["INPUT0", "INT32", "integers"]),
    ("out-of-range", "/v2/models/simple/infer", _two(_input(data=[2**40] * 16)), None, 400, ["INPUT0", "INT32", str(2**40)]),
    ("missing-input", "/v2/models/simple/infer", {"inputs": [_input()]}, None, 400, ["INPUT1"]),
    ("unknown-output", "/v2/models/simple/infer", {**simple_request(), "outputs": [{"name": "OUTPUTX"}]}, None, 400,
     ["OUTPUTX"]),
    ("no-data", "/v2/models/simple/infer", {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16]}]}, None,
     400, ["INPUT0", "data"]),
    ("fp16-as-json", "/v2/models/identity_fp32/infer",
     {"inputs": [_input(datatype="FP16", data=[0.5] * 16)]}, None, 400, ["INPUT0", "FP16", "binary"]),
    ("malformed-json", "/v2/models/simple/infer", b'{"inputs": [', None, 400, ["malformed JSON"]),
    ("json-not-object", "/v2/models/simple/infer", b"[1, 2]", None, 400, ["JSON object"]),
    ("empty-body", "/v2/models/simple/infer", b"", None, 400, ["empty"]),
    ("header-length-not-int", "/v2/models/simple/infer", simple_request(), {"Inference-Header-Content-Length": "abc"},
     400, ["Inference-Header-Content-Length", "abc"]),
    ("header-length-negative", "/v2/models/simple/infer", simple_request(), {"Inference-Header-Content-Length": "-5"},
     400, ["Inference-Header-Content-Length", "-5"]),
    ("header-length-too-big", "/v2/models/simple/infer", simple_request(),
     {"Inference-Header-Content-Length": "100000"}, 400, ["Inference-Header-Content-Length", "100000"]),
    ("bad-content-encoding", "/v2/models/simple/infer", simple_request(), {"Content-Encoding": "br"}, 400, ["br"]),
    ("not-gzip", "/v2/models/simple/infer", simple_request(), {"Content-Encoding": "gzip"}, 400, ["gzip"]),
]


@pytest.mark.parametrize(
    "path,body,headers,status,words", [case[1:] for case in JSON_ERRORS], ids=[case[0] for case in JSON_ERRORS]
)
def test_error_then_still_serving(client: Client, path: str, body: Body, headers: dict | None, status: int,
                                  words: list[str]) -> None:
    got_status, message = error_of(client.json("POST", path, body, headers))
    assert got_status == status, message
    for word in words:
        assert word in message, (word, message)
    assert_simple_works(client)


def _binary_case(sizes: list[int], tensors: list[bytes]) -> tuple[bytes, dict]:
    header = {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": size}}
            for name, size in zip(("INPUT0", "INPUT1"), sizes, strict=False)
        ]
    }
    return binary_body(header, *tensors)


@pytest.mark.parametrize(
    "sizes,tensors,words",
    [
        ([60, 64], [b"\x00" * 60, b"\x00" * 64], ["INPUT0", "64 bytes", "60"]),  # declared size != tensor size
        ([64, 64], [b"\x00" * 64, b"\x00" * 40], ["INPUT1", "64", "40 bytes"]),  # body shorter than declared
        ([64, 64], [b"\x00" * 64, b"\x00" * 70], ["6 bytes", "no input claims"]),  # extra bytes
        ([-1, 64], [b"", b"\x00" * 64], ["binary_data_size", "-1"]),
    ],
    ids=["size-mismatch", "short-body", "extra-bytes", "negative-size"],
)
def test_binary_size_errors(client: Client, sizes: list[int], tensors: list[bytes], words: list[str]) -> None:
    body, headers = _binary_case(sizes, tensors)
    status, message = error_of(client.json("POST", "/v2/models/simple/infer", body, headers))
    assert status == 400
    for word in words:
        assert word in message, (word, message)
    assert_simple_works(client)


def test_binary_data_without_the_header_is_400(client: Client) -> None:
    body, _ = _binary_case([64, 64], [b"\x00" * 64, b"\x00" * 64])
    status, message = error_of(client.json("POST", "/v2/models/simple/infer", body))
    # Without the header the whole body is taken as JSON, which the binary tail breaks.
    assert status == 400 and "JSON" in message
    header = json.loads(body[: body.index(b"}]}") + 3])
    status, message = error_of(client.json("POST", "/v2/models/simple/infer", header))
    assert status == 400 and "INPUT0" in message and "Inference-Header-Content-Length" in message
    assert_simple_works(client)


def test_binary_bytes_bad_framing(client: Client) -> None:
    framed = frame_bytes([b"abc"])[:-1]  # the length says 3, only 2 bytes follow
    header = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(framed)}}]}
    body, headers = binary_body(header, framed)
    status, message = error_of(client.json("POST", "/v2/models/string_identity/infer", body, headers))
    assert status == 400 and "INPUT0" in message
    assert_simple_works(client)


def test_wrong_method_is_405(client: Client) -> None:
    for method, path, allowed in [
        ("GET", "/v2/models/simple/infer", "POST"),
        ("POST", "/v2/health/live", "GET"),
        ("GET", "/v2/repository/index", "POST"),
        ("DELETE", "/v2/models/simple", "GET"),
    ]:
        status, headers, payload = client.call(method, path)
        assert status == 405, (method, path)
        assert headers["allow"] == allowed
        message = json.loads(payload)["error"]
        assert method in message and path in message
    assert_simple_works(client)


def test_unknown_path_is_404(client: Client) -> None:
    # ("/", /v1/models/<m> and its :predict / :explain are KServe's V1 protocol: tests/e2e/test_kserve_v1.py)
    for path in ("/v1", "/v1/models/simple:bogus", "/v2/models/simple/bogus", "/v2/health"):
        status, message = error_of(client.json("GET", path))
        assert status == 404 and path in message
    assert_simple_works(client)


def test_body_over_limit_is_413(small_server: ServerProcess) -> None:
    client = Client(small_server.http_port)
    try:
        big = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.125] * 2000}]}
        assert len(json.dumps(big)) > SMALL_LIMIT
        status, message = error_of(client.json("POST", "/v2/models/identity_fp32/infer", big))
        assert status == 413 and "limit" in message
        assert_simple_works(client)
        # No Content-Length (chunked): the limit is enforced while reading.
        status, headers, payload = client.call("POST", "/v2/models/identity_fp32/infer", json.dumps(big), chunked=True)
        assert status == 413 and "limit" in json.loads(payload)["error"]
        assert_simple_works(client)
        # A small gzip body that inflates past the limit.
        bomb = gzip.compress(json.dumps(simple_request()).encode() + b" " * (SMALL_LIMIT * 4))
        assert len(bomb) < SMALL_LIMIT
        status, message = error_of(client.json("POST", "/v2/models/simple/infer", bomb, {"Content-Encoding": "gzip"}))
        assert status == 413 and "decompressed" in message
        assert_simple_works(client)
    finally:
        client.close()


def test_body_at_limit_is_served(small_server: ServerProcess) -> None:
    client = Client(small_server.http_port)
    try:
        body = json.dumps(simple_request()).encode()
        body += b" " * (SMALL_LIMIT - len(body))
        status, _, _ = client.call("POST", "/v2/models/simple/infer", body)
        assert status == 200
    finally:
        client.close()


# --------------------------------------------------------------------------- #
# Readiness false; model control                                              #
# --------------------------------------------------------------------------- #


def test_not_ready_server_is_400_and_still_serves(broken_server: ServerProcess) -> None:
    client = Client(broken_server.http_port)
    try:
        status, headers, payload = client.call("GET", "/v2/health/live")
        assert status == 200
        status, message = error_of(client.json("GET", "/v2/health/ready"))
        assert status == 400 and "broken" in message
        status, message = error_of(client.json("GET", "/v2/models/broken/ready"))
        assert status == 400 and "broken" in message
        status, message = error_of(client.json("POST", "/v2/models/broken/infer", simple_request()))
        assert status == 503 and "broken" in message
        status, index = client.json("POST", "/v2/repository/index")
        broken = next(e for e in index if e["name"] == "broken")  # type: ignore[union-attr]
        assert broken["state"] == "UNAVAILABLE" and broken["reason"]
        assert_simple_works(client)
    finally:
        client.close()


def test_unload_and_load(repo_server: ServerProcess) -> None:
    client = Client(repo_server.http_port)
    try:
        status, _, payload = client.call("POST", "/v2/repository/models/simple/unload")
        assert (status, payload) == (200, b"")
        assert client.call("GET", "/v2/models/simple/ready")[0] == 400
        status, message = error_of(client.json("POST", "/v2/models/simple/infer", simple_request()))
        assert status == 503 and "simple" in message
        status, index = client.json("POST", "/v2/repository/index")
        assert {"name": "simple", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"} in index  # type: ignore[operator]
        assert client.call("GET", "/v2/health/ready")[0] == 200  # unloaded on purpose: still ready (Triton IsReady)

        status, _, payload = client.call("POST", "/v2/repository/models/simple/load", {"parameters": {}})
        assert (status, payload) == (200, b"")
        assert client.call("GET", "/v2/models/simple/ready")[0] == 200
        assert client.call("GET", "/v2/health/ready")[0] == 200
        assert_simple_works(client)
    finally:
        client.close()


def test_load_with_config_override(control_server: ServerProcess) -> None:
    client = Client(control_server.http_port)
    try:
        override = json.dumps({"name": "identity_fp32", "platform": "onnxruntime_onnx", "max_batch_size": 4})
        status, _, payload = client.call(
            "POST", "/v2/repository/models/identity_fp32/load", {"parameters": {"config": override}}
        )
        assert status == 200, payload
        status, config = client.json("GET", "/v2/models/identity_fp32/config")
        assert config["max_batch_size"] == 4  # type: ignore[index]
        too_big = {"inputs": [{"name": "INPUT0", "shape": [5, 16], "datatype": "FP32", "data": [0.0] * 80}]}
        status, message = error_of(client.json("POST", "/v2/models/identity_fp32/infer", too_big))
        assert status == 400 and "batch-size" in message
    finally:
        client.close()


@pytest.mark.parametrize(
    "path,body,status,words",
    [
        ("/v2/repository/models/nope/load", None, 404, ["nope"]),
        ("/v2/repository/models/simple/load", {"parameters": {"config": "{not json"}}, 400, ["config"]),
        ("/v2/repository/models/simple/load", {"parameters": {"config": 5}}, 400, ["config", "string"]),
        ("/v2/repository/models/simple/load", {"parameters": {"file:1/model.onnx": "AAAA"}}, 400, ["need a 'config'"]),
        ("/v2/repository/models/simple/load", {"parameters": {"file:1/model.onnx": "@@"}}, 400, ["'file:1/model.onnx'", "base64"]),
        ("/v2/repository/models/up/load", {"parameters": {"config": "{}", "file:../x.onnx": "AAAA"}}, 400, ["relative path"]),
        ("/v2/repository/models/simple/load", b"{oops", 400, ["malformed JSON"]),
        ("/v2/repository/models/simple/unload", {"parameters": {"unload_dependents": "yes"}}, 400,
         ["unload_dependents"]),
        ("/v2/repository/index", {"ready": "yes"}, 400, ["ready"]),
    ],
)
def test_model_control_errors(control_server: ServerProcess, path: str, body: Body, status: int,
                              words: list[str]) -> None:
    client = Client(control_server.http_port)
    try:
        got_status, message = error_of(client.json("POST", path, body))
        assert got_status == status, message
        for word in words:
            assert word in message, (word, message)
        assert_simple_works(client)
    finally:
        client.close()


# --------------------------------------------------------------------------- #
# Shutdown                                                                    #
# --------------------------------------------------------------------------- #


def test_shutdown_answers_the_request_in_flight_and_closes_idle_connections(tmp_path: Path) -> None:
    """SIGTERM: idle keep-alive connections close, a request still arriving gets a whole answer, exit 0."""
    import signal
    import socket
    import time

    from fastoip.demo import write_repository

    proc = ServerProcess(write_repository(tmp_path / "repo", names=["simple"]), http=True).start()
    try:
        idle = Client(proc.http_port)
        assert_simple_works(idle)
        body = json.dumps(simple_request()).encode()
        in_flight = socket.create_connection(("127.0.0.1", proc.http_port), timeout=30)
        head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n" % len(body)
        in_flight.sendall(head + body[:10])
        time.sleep(0.3)
        proc.signal(signal.SIGTERM)
        time.sleep(0.5)
        in_flight.sendall(body[10:])
        answer = b""
        while chunk := in_flight.recv(65536):
            answer += chunk
        in_flight.close()
        status_line, _, rest = answer.partition(b"\r\n")
        # A request the listener took before it closed is served to the end, on a closing connection.
        assert status_line == b"HTTP/1.1 200 OK", answer
        assert b"connection: close" in rest.lower()
        assert [o["name"] for o in json.loads(rest.split(b"\r\n\r\n", 1)[1])["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        assert proc.wait(20) == 0
        assert "fastoip: stopped" in proc.output()
        idle.close()
    finally:
        proc.stop()

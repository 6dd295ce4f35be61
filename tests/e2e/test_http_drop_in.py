"""Triton drop-in features over HTTP with tritonclient.http: system shared memory, CUDA shm answers,
trace and log settings, server metadata extensions.

The HTTP counterparts of ``test_drop_in.py``: a real ``fastoip serve`` on loopback,
the real tritonclient.http (and a few hand-written requests for the error paths
a well-behaved client cannot produce).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 5, dtype=np.int32)
SIZE = A.nbytes  # 64


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, http=True) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


class Regions:
    """POSIX shared-memory regions made with tritonclient.utils.shared_memory, destroyed at the end."""

    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}
        self.keys: dict[str, str] = {}

    def create(self, name: str, byte_size: int) -> Any:
        key = f"/fastoip_http_{os.getpid()}_{uuid.uuid4().hex[:8]}_{name}"
        self.handles[name] = shm.create_shared_memory_region(name, key, byte_size)
        self.keys[name] = key
        return self.handles[name]

    def destroy(self) -> None:
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(client: httpclient.InferenceServerClient) -> Iterator[Regions]:
    client.unregister_system_shared_memory()
    made = Regions()
    try:
        yield made
    finally:
        client.unregister_system_shared_memory()
        made.destroy()


def registered_io(client: httpclient.InferenceServerClient, regions: Regions) -> tuple[Any, Any]:
    """input_data holds A then B; output_data has room for two [1, 16] INT32 outputs; both registered."""
    handle_in = regions.create("input_data", SIZE * 2)
    handle_out = regions.create("output_data", SIZE * 2)
    shm.set_shared_memory_region(handle_in, [A])
    shm.set_shared_memory_region(handle_in, [B], offset=SIZE)
    client.register_system_shared_memory("input_data", regions.keys["input_data"], SIZE * 2)
    client.register_system_shared_memory("output_data", regions.keys["output_data"], SIZE * 2)
    return handle_in, handle_out


def shm_inputs(offset0: int = 0, size0: int = SIZE, region0: str = "input_data") -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(region0, size0, offset=offset0)
    inputs[1].set_shared_memory("input_data", SIZE, offset=SIZE)
    return inputs


def data_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def assert_simple_works(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("simple", data_inputs(A, B))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def error_of(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        call(*args, **kwargs)
    return err.value.status(), err.value.message()


def raw(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One hand-written request; the status and the JSON answer (None when empty)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        conn.request(method, path, body=data)
        response = conn.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None
    finally:
        conn.close()


# --------------------------------------------------------------------------- #
# System shared memory                                                        #
# --------------------------------------------------------------------------- #


def test_register_status_unregister(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    registered_io(client, regions)
    status = client.get_system_shared_memory_status()
    assert isinstance(status, list)  # Triton's HTTP form: a list of regions
    by_name = {region["name"]: region for region in status}
    assert set(by_name) == {"input_data", "output_data"}
    assert by_name["input_data"] == {
        "name": "input_data", "key": regions.keys["input_data"], "offset": 0, "byte_size": SIZE * 2
    }
    assert client.get_system_shared_memory_status("output_data") == [by_name["output_data"]]

    client.unregister_system_shared_memory("input_data")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["output_data"]
    client.unregister_system_shared_memory("input_data")  # unknown now: not an error (as Triton)
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []
    status, message = error_of(client.get_system_shared_memory_status, "output_data")
    assert status == "404" and "output_data" in message


def test_register_with_offset(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    handle = regions.create("big", SIZE * 4)
    shm.set_shared_memory_region(handle, [A, B], offset=SIZE * 2)
    client.register_system_shared_memory("upper", regions.keys["big"], SIZE * 2, offset=SIZE * 2)
    client.register_system_shared_memory("out", regions.keys["big"], SIZE * 2)  # the lower half
    assert client.get_system_shared_memory_status("upper")[0]["offset"] == SIZE * 2
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("upper", SIZE)  # offsets are relative to the registered part
    inputs[1].set_shared_memory("upper", SIZE, offset=SIZE)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", SIZE)
    outputs[1].set_shared_memory("out", SIZE, offset=SIZE)
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16]), A + B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=SIZE), A - B)


def test_inputs_and_outputs_in_shared_memory(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    """The tritonclient system shared-memory example, over HTTP."""
    _, handle_out = registered_io(client, regions)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", SIZE)
    outputs[1].set_shared_memory("output_data", SIZE, offset=SIZE)
    result = client.infer("simple", shm_inputs(), outputs=outputs, request_id="shm-1")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16]), A + B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=SIZE), A - B)
    # As Triton answers: name, datatype and shape; no data, no binary part.
    response = result.get_response()
    assert response["id"] == "shm-1"
    for name in ("OUTPUT0", "OUTPUT1"):
        assert result.get_output(name) == {"name": name, "datatype": "INT32", "shape": [1, 16]}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_shared_memory_mixed_with_body_tensors(client: httpclient.InferenceServerClient, regions: Regions,
                                               binary: bool) -> None:
    """One input and one output in shared memory, the others in the body as binary data or JSON."""
    _, handle_out = registered_io(client, regions)
    b = B + 1
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input_data", SIZE)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    for shm_output, body_output, expected_shm, expected_body in (
        ("OUTPUT0", "OUTPUT1", A + b, A - b),
        ("OUTPUT1", "OUTPUT0", A - b, A + b),  # the shared-memory output first: the binary part still lines up
    ):
        outputs = [httpclient.InferRequestedOutput(shm_output), httpclient.InferRequestedOutput(body_output, binary_data=binary)]
        outputs[0].set_shared_memory("output_data", SIZE, offset=SIZE)
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy(body_output), expected_body)
        assert "data" not in result.get_output(shm_output)
        body_entry = result.get_output(body_output)
        assert ("data" in body_entry) is not binary
        assert ("binary_data_size" in body_entry.get("parameters", {})) is binary
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=SIZE), expected_shm)
    # No outputs named: tritonclient asks binary_data_output, inputs still come from shared memory.
    result = client.infer("simple", shm_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_shared_memory_with_the_aio_client(server: ServerProcess, client: httpclient.InferenceServerClient,
                                           regions: Regions) -> None:
    _, handle_out = registered_io(client, regions)

    async def run() -> Any:
        async with aiohttpclient.InferenceServerClient(server.http_url) as aio:
            outputs = [aiohttpclient.InferRequestedOutput("OUTPUT0"), aiohttpclient.InferRequestedOutput("OUTPUT1")]
            outputs[0].set_shared_memory("output_data", SIZE)
            outputs[1].set_shared_memory("output_data", SIZE, offset=SIZE)
            inputs = [aiohttpclient.InferInput("INPUT0", [1, 16], "INT32"), aiohttpclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory("input_data", SIZE)
            inputs[1].set_shared_memory("input_data", SIZE, offset=SIZE)
            await aio.infer("simple", inputs, outputs=outputs)
            return await aio.get_system_shared_memory_status()

    status = asyncio.run(run())
    assert {r["name"] for r in status} == {"input_data", "output_data"}
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16]), A + B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=SIZE), A - B)


def test_bytes_tensor_in_shared_memory(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    data = np.array([b"alpha", "wörld".encode(), b"", b"\x00\xff"], dtype=np.object_)
    framed = serialize_byte_tensor(data)  # what this tritonclient writes to a region for BYTES
    size = serialized_byte_size(framed)
    assert size == sum(4 + len(v) for v in data)
    handle_in = regions.create("strings_in", size)
    handle_out = regions.create("strings_out", size)
    shm.set_shared_memory_region(handle_in, [framed])
    client.register_system_shared_memory("strings_in", regions.keys["strings_in"], size)
    client.register_system_shared_memory("strings_out", regions.keys["strings_out"], size)
    inp = httpclient.InferInput("INPUT0", [1, 4], "BYTES")
    inp.set_shared_memory("strings_in", size)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("strings_out", size)
    result = client.infer("string_identity", [inp], outputs=[out])
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 4]}
    got = shm.get_contents_as_numpy(handle_out, np.object_, [1, 4])
    assert [bytes(v) for v in got.reshape(-1)] == list(data)


def test_shared_memory_errors_name_the_tensor_and_region(server: ServerProcess, client: httpclient.InferenceServerClient,
                                                         regions: Regions) -> None:
    registered_io(client, regions)
    # An input past the end of its region.
    status, message = error_of(client.infer, "simple", shm_inputs(offset0=SIZE + 8))
    assert status == "400" and "INPUT0" in message and "exceeds region 'input_data'" in message
    # An input whose byte size does not match its shape.
    status, message = error_of(client.infer, "simple", shm_inputs(size0=SIZE - 4))
    assert status == "400" and "INPUT0" in message and "needs 64 bytes" in message
    # An output region too small for the output.
    outputs = [httpclient.InferRequestedOutput("OUTPUT0")]
    outputs[0].set_shared_memory("output_data", SIZE - 4)
    status, message = error_of(client.infer, "simple", data_inputs(A, B), outputs=outputs)
    assert status == "400" and "OUTPUT0" in message and "60" in message
    # An output past the end of its region.
    outputs = [httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", SIZE, offset=SIZE + 4)
    status, message = error_of(client.infer, "simple", data_inputs(A, B), outputs=outputs)
    assert status == "400" and "OUTPUT1" in message and "exceeds region 'output_data'" in message
    # A region that is not registered.
    status, message = error_of(client.infer, "simple", shm_inputs(region0="no_region"))
    assert status == "404" and "no_region" in message

    # Registration errors.
    status, message = error_of(client.register_system_shared_memory, "too_big", regions.keys["input_data"], SIZE * 4)
    assert status == "400" and "too_big" in message and "exceeds" in message
    status, message = error_of(client.register_system_shared_memory, "input_data", regions.keys["input_data"], SIZE)
    assert status == "400" and "input_data" in message and "already in manager" in message
    status, message = error_of(client.register_system_shared_memory, "ghost", "/fastoip_http_no_such_key", SIZE)
    # Triton: shm_open failed, INTERNAL (500), "Unable to open shared memory region: '<key>'".
    assert status == "500" and "ghost" in message and "Unable to open shared memory region" in message
    assert {r["name"] for r in client.get_system_shared_memory_status()} == {"input_data", "output_data"}

    # What tritonclient would not send, by hand.
    base = "/v2/systemsharedmemory"
    key = regions.keys["input_data"]
    for path, body, words in [
        (f"{base}/register", {"key": key, "offset": 0, "byte_size": SIZE}, ["region name"]),
        (f"{base}/region/r1/register", None, ["r1", "key"]),
        (f"{base}/region/r1/register", {"key": key, "offset": -1, "byte_size": SIZE}, ["r1", "offset"]),
        (f"{base}/region/r1/register", {"key": key, "offset": 0, "byte_size": "64"}, ["r1", "byte_size"]),
        (f"{base}/region/r1/register", {"key": key, "offset": 0, "byte_size": 0}, ["r1", "byte_size"]),
        (f"{base}/region/r1/register", b"{not json", ["malformed JSON"]),
    ]:
        status_code, answer = raw(server, "POST", path, body)
        assert status_code == 400 and all(word in answer["error"] for word in words), (path, body, answer)
    tensor = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"}
    other = {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
    for parameters, extra, words in [
        ({"shared_memory_region": "input_data", "shared_memory_byte_size": "64"}, {}, ["INPUT0", "shared_memory_byte_size"]),
        ({"shared_memory_region": "input_data", "shared_memory_offset": -8}, {}, ["INPUT0", "shared_memory_offset"]),
        ({"shared_memory_region": 7, "shared_memory_byte_size": SIZE}, {}, ["INPUT0", "shared_memory_region"]),
        ({"shared_memory_region": "input_data", "shared_memory_byte_size": SIZE}, {"data": [1] * 16}, ["INPUT0", "data"]),
    ]:
        request = {"inputs": [{**tensor, **extra, "parameters": parameters}, other]}
        status_code, answer = raw(server, "POST", "/v2/models/simple/infer", request)
        assert status_code == 400 and all(word in answer["error"] for word in words), (parameters, answer)
    request = {"inputs": [{**tensor, "data": list(range(16))}, other],
               "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "output_data",
                                                              "shared_memory_byte_size": 1.5}}]}
    status_code, answer = raw(server, "POST", "/v2/models/simple/infer", request)
    assert status_code == 400 and "OUTPUT0" in answer["error"] and "shared_memory_byte_size" in answer["error"]
    status_code, answer = raw(server, "GET", f"{base}/region/input_data/register")
    assert status_code == 405 and "POST" in answer["error"]
    status_code, answer = raw(server, "POST", f"{base}/status")
    assert status_code == 405 and "GET" in answer["error"]

    assert_simple_works(client)


def test_server_serves_after_shared_memory_is_gone(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    registered_io(client, regions)
    client.unregister_system_shared_memory()
    status, message = error_of(client.infer, "simple", shm_inputs())
    assert status == "404" and "input_data" in message
    assert_simple_works(client)


# --------------------------------------------------------------------------- #
# CUDA shared memory                                                          #
# --------------------------------------------------------------------------- #


def test_cuda_shared_memory_is_503_without_gpu(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    from fastoip import cuda

    if cuda.runtime() is not None:
        pytest.skip("a GPU is present: CUDA shared memory is tested by tests/test_cuda.py")
    # As Triton on any build: status lists no regions and unregister succeeds; only register needs CUDA.
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("gpu0")
    status, message = error_of(client.get_cuda_shared_memory_status, "gpu0")
    assert "Unable to find cuda shared memory region: 'gpu0'" in message, message
    status, message = error_of(client.register_cuda_shared_memory, "gpu0", "AAAA", 0, 1024)
    assert status == "503" and "GPU" in message, message
    status_code, answer = raw(server, "GET", "/v2/cudasharedmemory/region/gpu0/register")
    assert status_code == 405
    # A malformed register body is a 400 naming the field, before any GPU is asked for.
    for body in ({"raw_handle": "AAAA", "byte_size": 64}, {"raw_handle": {"b64": "not base64!"}, "byte_size": 64}):
        status_code, answer = raw(server, "POST", "/v2/cudasharedmemory/region/gpu0/register", body)
        assert status_code == 400 and "'raw_handle'" in answer["error"], answer
    status_code, answer = raw(
        server, "POST", "/v2/cudasharedmemory/region/gpu0/register", {"raw_handle": {"b64": "AAAA"}, "byte_size": -1}
    )
    assert status_code == 400 and "'byte_size'" in answer["error"], answer
    assert_simple_works(client)


# --------------------------------------------------------------------------- #
# Trace and log settings                                                      #
# --------------------------------------------------------------------------- #


def test_trace_settings(server: ServerProcess, client: httpclient.InferenceServerClient, tmp_path: Path) -> None:
    """v2/trace/setting with Triton's forms and rules (tests/test_tracing_server.py writes traces end to end)."""
    settings = client.get_trace_settings()
    # Triton's HTTP form: trace_level a list, the other settings one string each.
    assert settings["trace_level"] == ["OFF"]
    assert settings["trace_rate"] == "1000" and settings["trace_count"] == "-1"
    assert set(settings) == {"trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"}
    try:
        updated = client.update_trace_settings(model_name="simple", settings={"trace_rate": "1", "trace_count": "3"})
        assert updated["trace_rate"] == "1" and updated["trace_count"] == "3"
        assert client.get_trace_settings()["trace_rate"] == "1000"  # the global settings are unchanged
        # the model mirrors global changes in what it did not set itself
        client.update_trace_settings(settings={"log_frequency": "5"})
        assert client.get_trace_settings(model_name="simple")["log_frequency"] == "5"
        client.update_trace_settings(settings={"log_frequency": None})
        # null clears a model's setting: it falls back to the global one.
        cleared = client.update_trace_settings(model_name="simple", settings={"trace_rate": None})
        assert cleared["trace_rate"] == "1000" and cleared["trace_count"] == "3"

        status, message = error_of(client.update_trace_settings, settings={"trace_level": ["TIMESTAMPS"]})
        assert status == "400" and "trace file name is not given" in message  # no --trace-config triton,file=
        status, message = error_of(client.update_trace_settings, settings={"trace_file": str(tmp_path / "t.json")})
        assert status == "501" and "trace file location can not be updated" in message
        status, message = error_of(client.update_trace_settings, settings={"trace_level": ["OFF", "TENSORS"]})
        assert status == "400" and "only one trace level 'OFF'" in message
        status, message = error_of(client.update_trace_settings, settings={"trace_rate": 5})
        assert status == "400" and "trace_rate" in message
        status, message = error_of(client.update_trace_settings, settings={"trace_rate": "often"})
        assert status == "400" and "trace_rate" in message
        status, message = error_of(client.update_trace_settings, settings={"no_such_setting": "1"})
        assert status == "400" and "no_such_setting" in message
        for call, kwargs in [(client.get_trace_settings, {}), (client.update_trace_settings, {"settings": {"trace_rate": "1"}})]:
            status, message = error_of(call, model_name="nope", **kwargs)
            assert status == "400" and "Request for unknown model : nope" in message
        assert client.get_trace_settings()["trace_level"] == ["OFF"]
    finally:
        client.update_trace_settings(model_name="simple", settings={
            "trace_level": None, "trace_rate": None, "trace_count": None})
    assert client.get_trace_settings(model_name="simple") == settings
    assert_simple_works(client)


def test_log_settings(client: httpclient.InferenceServerClient) -> None:
    settings = client.get_log_settings()
    assert settings == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}
    try:
        changed = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
        assert changed["log_verbose_level"] == 1 and changed["log_format"] == "ISO8601"
        assert client.get_log_settings() == changed
        assert client.update_log_settings({"log_info": None})["log_info"] is True  # null: left as is
        for bad, word in [({"no_such_setting": True}, "no_such_setting"), ({"log_info": "yes"}, "log_info"),
                          ({"log_format": "xml"}, "log_format"), ({"log_file": "/tmp/fastoip.log"}, "log file location")]:
            status, message = error_of(client.update_log_settings, bad)
            assert status == "400" and word in message
    finally:
        client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
    assert client.get_log_settings() == settings
    assert_simple_works(client)


# --------------------------------------------------------------------------- #
# Server metadata                                                             #
# --------------------------------------------------------------------------- #


def test_server_metadata_extensions(client: httpclient.InferenceServerClient) -> None:
    extensions = set(client.get_server_metadata()["extensions"])
    assert {"system_shared_memory", "trace", "logging", "binary_tensor_data"} <= extensions

"""Triton's words where Triton's own tests read them (shared memory, byte sizes, shapes, JSON, the index API).

The expected strings are the ones Triton's L0 tests match on (L0_shared_memory, L0_cuda_shared_memory, L0_grpc,
L0_http); fastoip's own detail may follow them.  Real servers, real tritonclient, one HTTP client with raw JSON.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from fastoip.demo import write_repository
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

Client = tg.InferenceServerClient | th.InferenceServerClient


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("messages"))
    with ServerProcess(root, http=True) as proc:
        yield proc


def client_for(server: ServerProcess, protocol: str) -> Client:
    if protocol == "grpc":
        return tg.InferenceServerClient(server.grpc_url)
    return th.InferenceServerClient(server.http_url)


@pytest.fixture()
def region() -> Iterator[tuple[str, object]]:
    key = f"/fastoip_msg_{os.getpid()}"
    handle = shm.create_shared_memory_region("msg_region", key, 128)
    yield key, handle
    shm.destroy_shared_memory_region(handle)


PROTOCOLS = ["grpc", "http"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_register_twice_says_already_in_manager(server: ServerProcess, region: tuple, protocol: str) -> None:
    client = client_for(server, protocol)
    key, _ = region
    client.register_system_shared_memory("dummy_data", key, 64)
    try:
        with pytest.raises(InferenceServerException, match="shared memory region 'dummy_data' already in manager"):
            client.register_system_shared_memory("dummy_data", key, 64)
    finally:
        client.unregister_system_shared_memory("dummy_data")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("key", ["/", "///"])
def test_a_key_of_slashes_is_an_invalid_shm_key(server: ServerProcess, protocol: str, key: str) -> None:
    with pytest.raises(InferenceServerException) as err:
        client_for(server, protocol).register_system_shared_memory("my_test_shm_name", key, 10000)
    assert f"cannot register shared memory region 'my_test_shm_name' - invalid shm key '{key}'" in err.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("offset", "byte_size"), [(0, 129), (1, 128), (128, 1), (129, 0)])
def test_register_beyond_the_object_is_invalid_args(
    server: ServerProcess, region: tuple, protocol: str, offset: int, byte_size: int
) -> None:
    key, _ = region
    with pytest.raises(InferenceServerException, match="failed to register shared memory region.*invalid args"):
        client_for(server, protocol).register_system_shared_memory("oob", key, byte_size, offset)


def test_a_cuda_region_without_a_name_is_invalid_args(server: ServerProcess) -> None:
    # Triton's L0_grpc aio test registers ("", b"", 0, 0) and reads this (on any host, GPU or not)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region.*invalid args"):
        tg.InferenceServerClient(server.grpc_url).register_cuda_shared_memory("", b"", 0, 0)


def test_an_output_offset_and_byte_size_past_size_max_is_tritons_integer_overflow(
    server: ServerProcess, region: tuple
) -> None:
    client = th.InferenceServerClient(server.http_url)  # (gRPC's client cannot send a byte size past int64)
    key, _ = region
    client.register_system_shared_memory("output_data", key, 64)
    try:
        output = th.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("output_data", 2**64 - 32, offset=32)
        with pytest.raises(InferenceServerException, match="Integer overflow detected: byte_size "):
            client.infer("simple", _simple_inputs(th), outputs=[output])
    finally:
        client.unregister_system_shared_memory("output_data")


def test_a_missing_object_is_internal_unable_to_open(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as err:
        tg.InferenceServerClient(server.grpc_url).register_system_shared_memory("missing", "/test_shm", 64)
    assert err.value.status() == "StatusCode.INTERNAL"
    assert err.value.message().startswith("Unable to open shared memory region: '/test_shm'")


def _simple_inputs(module: object, in1_region: str | None = None, in1_size: int = 64) -> list:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),  # type: ignore[attr-defined]
              module.InferInput("INPUT1", [1, 16], "INT32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    if in1_region is None:
        inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    else:
        inputs[1].set_shared_memory(in1_region, in1_size)
    return inputs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_larger_than_the_input_is_a_byte_size_mismatch(
    server: ServerProcess, region: tuple, protocol: str
) -> None:
    client = client_for(server, protocol)
    key, _ = region
    client.register_system_shared_memory("input2_data", key, 128)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", _simple_inputs(tg if protocol == "grpc" else th, "input2_data", 128))
        assert "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128" in (
            err.value.message())
    finally:
        client.unregister_system_shared_memory("input2_data")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_beyond_its_region_is_invalid_offset_plus_byte_size(
    server: ServerProcess, region: tuple, protocol: str
) -> None:
    module = tg if protocol == "grpc" else th
    client = client_for(server, protocol)
    key, _ = region
    client.register_system_shared_memory("output_data", key, 64)
    try:
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("output_data", 64, offset=1)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", _simple_inputs(module), outputs=[output])
        assert "Invalid offset + byte size for shared memory region" in err.value.message()
        output.set_shared_memory("output_data", 1, offset=64)
        with pytest.raises(InferenceServerException, match="Invalid offset for shared memory region"):
            client.infer("simple", _simple_inputs(module), outputs=[output])
    finally:
        client.unregister_system_shared_memory("output_data")


def test_raw_grpc_contents_of_the_wrong_size_are_a_byte_size_mismatch(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    inputs = _simple_inputs(tg)
    inputs[1] = tg.InferInput("INPUT1", [1, 32], "INT32")
    inputs[1].set_data_from_numpy(np.ones((1, 32), dtype=np.int32))
    inputs[1].set_shape([1, 16])  # 128 bytes for a [1, 16] INT32 tensor
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs)
    assert "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128" in (
        err.value.message())


# -- HTTP/JSON -------------------------------------------------------------------------
def post(server: ServerProcess, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _nested(depth: int, value: object) -> object:
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("datatype", "value", "model"), [("BYTES", "hello", "string_identity"),
                                                          ("FP32", 1.0, "identity_fp32")])
def test_json_data_nested_too_deep(server: ServerProcess, datatype: str, value: object, model: str) -> None:
    shape = [1, 1]
    for depth, ok in ((120, False), (50, True)):
        doc = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": _nested(depth, value)}]}
        status, answer = post(server, f"/v2/models/{model}/infer", json.dumps(doc).encode())
        if ok:
            assert status != 500 and "nesting" not in answer.get("error", ""), answer
        else:
            assert status == 400
            assert "JSON nesting depth exceeds maximum allowed limit (100)" in answer["error"]


def test_json_shapes_that_overflow_are_refused_in_tritons_words(server: ServerProcess) -> None:
    for shape, words in (([2**4, 2**60 + 2], "causes total element count to exceed maximum size of"),
                         ([2**2, 2**60 + 2], "byte size overflow for input")):
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": [1.0]}]}
        status, answer = post(server, "/v2/models/identity_fp32/infer", json.dumps(doc).encode())
        assert status == 400 and words in answer["error"], answer


def test_a_negative_dimension_is_refused_with_tritons_sentence_first(server: ServerProcess) -> None:
    # Triton's L0_http test_negative_dimensions reads this sentence (its status, 500, is its JSON reader's INTERNAL;
    # fastoip answers 400, a client's mistake: COMPATIBILITY.md)
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, -5], "data": [1.0]}]}
    status, answer = post(server, "/v2/models/identity_fp32/infer", json.dumps(doc).encode())
    assert status == 400, answer
    assert answer["error"].startswith(
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"), answer


def test_a_raw_request_to_a_model_of_several_inputs(server: ServerProcess) -> None:
    status, answer = post(server, "/v2/models/simple/infer", np.arange(32, dtype=np.int32).tobytes(),
                          {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"})
    assert status == 400
    assert "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in" in answer["error"]


def test_index_ready_that_is_not_a_boolean(server: ServerProcess) -> None:
    depth = 250_000
    body = b'{"ready":' + b"[" * depth + b"true" + b"]" * depth + b"}"
    status, answer = post(server, "/v2/repository/index", body)
    assert status == 400 and "Invalid value for 'ready': expected a boolean" in answer["error"]
    status, answer = post(server, "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400 and "Invalid value for 'ready': expected a boolean" in answer["error"]
    status, _ = post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200


def test_the_server_is_still_up(server: ServerProcess) -> None:
    assert tg.InferenceServerClient(server.grpc_url).is_server_live()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_log_settings_refusals_in_tritons_words(server: ServerProcess, protocol: str) -> None:
    client = client_for(server, protocol)
    with pytest.raises(InferenceServerException, match="log file location can not be updated through network protocol"):
        client.update_log_settings(settings={"log_file": "log_file.log"})
    with pytest.raises(InferenceServerException, match="invalid argument for log_format, got: nope"):
        client.update_log_settings(settings={"log_format": "nope"})


def test_log_settings_report_the_file_and_format_the_server_started_with(tmp_path) -> None:
    """Triton's `qa/L0_logging` reads `"log_file":"<--log-file>"` and `"log_format":"ISO8601"` back from
    /v2/logging (fastoip answered "" and "default" whatever the flags said); changing the file stays refused."""
    log_file = str(tmp_path / "log_file.log")
    root = write_repository(tmp_path / "models")
    with ServerProcess(root, "--log-file", log_file, "--log-format", "ISO8601", http=True) as proc:
        settings = th.InferenceServerClient(proc.http_url).get_log_settings()
        assert settings["log_file"] == log_file and settings["log_format"] == "ISO8601"
        grpc_settings = tg.InferenceServerClient(proc.grpc_url).get_log_settings(as_json=True)["settings"]
        assert grpc_settings["log_file"]["string_param"] == log_file
        assert grpc_settings["log_format"]["string_param"] == "ISO8601"
        request = urllib.request.Request(f"http://{proc.http_url}/v2/logging", method="POST",
                                         data=json.dumps({"log_file": "other_log.log"}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert json.loads(refused.value.read()) == {
            "error": "log file location can not be updated through network protocol"}
    assert "fastoip" in open(log_file).read()  # the log went to the file


# -- model control: Triton's L0_lifecycle words (issue 41) ---------------------------------------------------------
@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("explicit_messages"))
    (root / "no_versions").mkdir()
    (root / "no_versions" / "config.pbtxt").write_text((root / "simple" / "config.pbtxt").read_text()
                                                        .replace('"simple"', '"no_versions"'))
    with ServerProcess(root, "--model-control-mode=explicit", http=True) as proc:
        yield proc


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_whose_load_fails_answers_load_failed_for_model(explicit: ServerProcess, protocol: str) -> None:
    client = client_for(explicit, protocol)
    # no version folder at all, and a config override whose version policy finds none of the folders
    with pytest.raises(InferenceServerException, match="load failed for model 'no_versions'"):
        client.load_model("no_versions")
    config = json.dumps({"backend": "onnxruntime", "version_policy": {"specific": {"versions": [7]}}})
    with pytest.raises(InferenceServerException, match="load failed for model 'simple'"):
        client.load_model("simple", config=config)
    client.load_model("simple")  # and a good load still works after them
    assert client.is_model_ready("simple")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_files_without_a_config_fail_to_poll_in_tritons_words(explicit: ServerProcess, protocol: str) -> None:
    client = client_for(explicit, protocol)
    with pytest.raises(InferenceServerException,
                       match="failed to load 'simple', failed to poll from model repository") as raised:
        client.load_model("simple", files={"file:1/model.onnx": b"bytes"})
    assert "'config'" in raised.value.message()  # and what was missing


def test_an_uploaded_path_leaving_the_model_directory_fails_to_load(explicit: ServerProcess) -> None:
    client = th.InferenceServerClient(explicit.http_url)
    config = json.dumps({"backend": "onnxruntime"})
    with pytest.raises(InferenceServerException, match="failed to load") as raised:
        client.load_model("new_model", config=config, files={"file:../../escape.txt": b"should not exist"})
    assert raised.value.status() == "400" and "inside the model directory" in raised.value.message()

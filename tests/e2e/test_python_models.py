"""Custom Python models (``fastoip.Model`` in ``<model>/<version>/model.py``), end to end.

One real fastoip serves a repository of small Python models next to an ONNX
model; tritonclient (gRPC, and HTTP where it matters) drives them.  Covers:
batching through the dynamic batcher, the ways predict may answer, errors a
model raises or makes, async predict with several lanes, metadata, config and
statistics, and models that fail to load (UNAVAILABLE with the reason while
the rest of the server keeps serving).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, write_model
from python_models import (
    BATCHED_CONFIG,
    BROKEN_LOAD,
    DOUBLER,
    INFO,
    INT_IO,
    MISBEHAVE,
    SHAPES,
    SLEEPER,
    write_python_model,
)
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)


# One server on the default gRPC frontend, not one per frontend: Python models run under the Core, and
# tests/e2e/test_grpc_differential.py keeps the two frontends' answers byte-identical.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("python-repo")
    write_python_model(root, "doubler", DOUBLER, BATCHED_CONFIG)
    write_python_model(root, "doubler_unbatched", DOUBLER, BATCHED_CONFIG + """
        parameters { key: "batchable" value { string_value: "false" } }
    """)
    write_python_model(root, "info", INFO, """
        backend: "python"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        parameters { key: "greeting" value { string_value: "hi" } }
        parameters { key: "extra" value { string_value: "{\\"threshold\\": 0.5}" } }
    """, version=3)
    write_python_model(root, "pair", SHAPES, """
        backend: "python"
        input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ -1 ] } ]
        parameters { key: "implementation" value { string_value: "Pair" } }
    """)
    write_python_model(root, "single", SHAPES, """
        backend: "python"
        input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "HALF" data_type: TYPE_FP32 dims: [ -1 ] } ]
        parameters { key: "implementation" value { string_value: "model.Single" } }
    """)
    write_python_model(root, "two_classes", SHAPES, INT_IO)
    write_python_model(root, "misbehave", MISBEHAVE, INT_IO)
    write_python_model(root, "sleeper", SLEEPER, INT_IO + """
        parameters { key: "max_concurrency" value { string_value: "8" } }
    """)
    write_python_model(root, "broken_load", BROKEN_LOAD, INT_IO)
    write_python_model(root, "broken_import", "import fastoip\nclass Oops(fastoip.Model)\n", INT_IO)
    write_python_model(root, "no_config", "import fastoip\nclass NoConfig(fastoip.Model):\n    pass\n")
    write_model(root, "identity_fp32", identity_model_bytes(1, [4]))  # an ONNX model beside them
    with ServerProcess(root, http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def fp32(rows: np.ndarray) -> list:
    inp = grpcclient.InferInput("INPUT0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    return [inp]


def int_input(values: list, lib=grpcclient):  # type: ignore[no-untyped-def]
    array = np.array(values, dtype=np.int32)
    inp = lib.InferInput("X", list(array.shape), "INT32")
    inp.set_data_from_numpy(array)
    return [inp]


def connected_clients(server: ServerProcess, count: int) -> list[grpcclient.InferenceServerClient]:
    """Clients whose connections are already up, so that requests sent together arrive together."""
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(count)]
    for c in clients:
        assert c.is_server_live()
    return clients


def test_batchable_predict_gets_merged_batches(server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    clients = connected_clients(server, 8)

    def one(i: int) -> tuple[int, np.ndarray, int]:
        rows = np.full((1 + i % 2, 4), i, dtype=np.float32)
        result = clients[i].infer("doubler", fp32(rows))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows * 2)  # each request gets its own rows
        return i, result.as_numpy("OUTPUT0"), int(result.as_numpy("BATCH")[0, 0])

    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(one, range(8)))
    assert max(batch for _, _, batch in seen) > 2, seen  # requests were merged into bigger batches
    stats = client.get_inference_statistics("doubler", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 12  # rows
    assert int(stats["execution_count"]) < 8
    assert any(int(b["batch_size"]) > 2 for b in stats["batch_stats"])


def test_not_batchable_predict_gets_one_request_at_a_time(server: ServerProcess) -> None:
    def one(i: int) -> int:
        c = grpcclient.InferenceServerClient(server.grpc_url)
        rows = np.full((2, 4), i, dtype=np.float32)
        result = c.infer("doubler_unbatched", fp32(rows))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows * 2)
        return int(result.as_numpy("BATCH")[0, 0])

    with ThreadPoolExecutor(6) as pool:
        assert set(pool.map(one, range(6))) == {2}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    stats = client.get_inference_statistics("doubler_unbatched", as_json=True)["model_stats"][0]
    assert (int(stats["execution_count"]), int(stats["inference_count"])) == (6, 12)  # one predict per request


def test_model_attributes_instances_and_one_argument_predict(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("X", [3, 1], "FP32")
    inp.set_data_from_numpy(np.zeros((3, 1), dtype=np.float32))
    seen = set()
    for _ in range(8):
        info = json.loads(client.infer("info", [inp]).as_numpy("INFO")[0, 0])
        assert info["name"] == "info" and info["version"] == 3 and info["folder"] == "3"
        assert info["extra"] == {"threshold": 0.5} and info["param"] == "hi"
        assert info["init"] == ["info", info["instance"]] and info["n"] == 3
        seen.add(info["instance"])
    assert seen <= {0, 1}
    config = client.get_model_config("info", as_json=True)["config"]
    assert config["instance_group"][0]["count"] == 2
    assert client.get_model_metadata("info", as_json=True)["versions"] == ["3"]


def test_tuple_and_single_value_returns(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("pair", int_input([1, 2, 3]))
    assert result.as_numpy("A").tolist() == [1, 2, 3] and result.as_numpy("B").tolist() == [2, 3, 4]
    result = client.infer("single", int_input([1, 3]))
    half = result.as_numpy("HALF")
    assert half.dtype == np.float32 and half.tolist() == [0.5, 1.5]


def expect_error(client: grpcclient.InferenceServerClient, mode: str, code: str, text: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("misbehave", int_input([1, 2]), parameters={"mode": mode})
    assert info.value.status() == f"StatusCode.{code}", info.value
    assert text in info.value.message(), info.value.message()


def test_what_a_model_gets_wrong_is_reported(client: grpcclient.InferenceServerClient) -> None:
    assert client.infer("misbehave", int_input([1, 2]), parameters={"mode": "wide"}).as_numpy("OUT").tolist() == [3, 6]
    expect_error(client, "undeclared", "INTERNAL", "output 'NOPE', which the model does not declare")
    expect_error(client, "missing", "INTERNAL", "did not return output 'OUT'")
    expect_error(client, "float", "INTERNAL", "FP64 data, which does not cast to the declared INT32")
    expect_error(client, "strings", "INTERNAL", "output 'OUT' is BYTES data but the model declares INT32")
    expect_error(client, "tuple", "INTERNAL", "returned 2 values but the model has 1 outputs")
    expect_error(client, "invalid", "INVALID_ARGUMENT", "X must be positive")
    expect_error(client, "crash", "INTERNAL", "predict failed: ValueError: boom")
    # the model keeps serving
    assert client.infer("misbehave", int_input([7])).as_numpy("OUT").tolist() == [7]


def test_model_errors_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("misbehave", int_input([1], httpclient), parameters={"mode": "invalid"})
    assert info.value.status() == "400" and "X must be positive" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("misbehave", int_input([1], httpclient), parameters={"mode": "crash"})
    assert info.value.status() == "500"
    assert client.infer("pair", int_input([5], httpclient)).as_numpy("B").tolist() == [6]


def test_async_predict_runs_concurrently_on_lanes(server: ServerProcess) -> None:
    clients = connected_clients(server, 6)

    def one(i: int) -> list:
        return clients[i].infer("sleeper", int_input([i])).as_numpy("OUT").tolist()

    start = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(6))) == [[i] for i in range(6)]
    elapsed = time.monotonic() - start
    assert elapsed < 1.6, f"6 requests of 0.4 s took {elapsed:.2f} s: async predicts did not overlap"


def test_python_and_onnx_models_share_the_server(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    meta = client.get_model_metadata("doubler", as_json=True)
    assert meta["platform"] == "python"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("INPUT0", "FP32", ["-1", "4"])]
    assert client.get_model_metadata("identity_fp32", as_json=True)["platform"] == "onnxruntime_onnx"
    assert client.is_model_ready("doubler") and client.is_model_ready("identity_fp32")


def test_models_that_fail_to_load_are_unavailable_with_the_reason(client: grpcclient.InferenceServerClient) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    expected = {
        "broken_load": "load() failed: RuntimeError: no weights here",
        "broken_import": "SyntaxError",
        "two_classes": "several fastoip.Model subclasses (Pair, Single)",
        "no_config": "declares its inputs and outputs in config.pbtxt or model-settings.json",
    }
    for name, text in expected.items():
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert text in index[name]["reason"], index[name]
        assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException, match="no weights here"):
        client.infer("broken_load", int_input([1]))
    # the server stays up: live, serving the others, not ready (strict readiness: a model failed)
    assert client.is_server_live()
    assert not client.is_server_ready()
    assert client.infer("pair", int_input([1])).as_numpy("A").tolist() == [1]


def test_statistics_for_python_models(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("pair", as_json=True)["model_stats"][0]
    for _ in range(3):
        client.infer("pair", int_input([1, 2]))
    after = client.get_inference_statistics("pair", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 3
    success = after["inference_stats"]["success"]
    assert int(success["count"]) >= 3 and int(after["inference_stats"]["compute_infer"]["ns"]) > 0

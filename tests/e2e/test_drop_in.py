"""Triton drop-in features end to end: streaming, system shared memory, model control, trace/log settings."""

from __future__ import annotations

import json
import queue
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from fastoip._proto import grpc_service_pb2 as pb
from models import SLOW_CONFIG, identity_model_bytes, slow_model_bytes, write_model
from serverproc import ServerProcess, wait_until
from simple_model import simple_inputs


@pytest.fixture(scope="module")
def server(frontend_server: ServerProcess) -> ServerProcess:
    """This module runs against every selected gRPC frontend (conftest's ``grpc_frontend``)."""
    return frontend_server


# -- streaming ------------------------------------------------------------------------------
def test_stream_1000_in_flight_ids_matched_errors_mixed(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    expected = {}
    errors_sent = 0
    for i in range(1000):
        a = np.full((1, 16), i, dtype=np.int32)
        b = np.arange(16, dtype=np.int32).reshape(1, 16)
        if i % 10 == 7:  # a bad request in the middle of the stream
            errors_sent += 1
            bad = tg.InferInput("INPUT0", [1, 8], "INT32")
            bad.set_data_from_numpy(np.zeros((1, 8), np.int32))
            client.async_stream_infer("simple", [bad, simple_inputs(tg, a, b)[1]], request_id=f"bad-{i}")
            continue
        model = "mlp" if i % 10 == 3 else "simple"
        if model == "mlp":
            x = np.full((1, 256), i / 1000.0, dtype=np.float32)
            inp = tg.InferInput("INPUT0", [1, 256], "FP32")
            inp.set_data_from_numpy(x)
            client.async_stream_infer("mlp", [inp], request_id=f"mlp-{i}")
            expected[f"mlp-{i}"] = None
        else:
            client.async_stream_infer("simple", simple_inputs(tg, a, b), request_id=f"ok-{i}")
            expected[f"ok-{i}"] = a + b
    got_ok, got_errors = {}, []
    for _ in range(1000):
        result, error = results.get(timeout=60)
        if error is not None:
            got_errors.append(str(error))
        else:
            got_ok[result.get_response().id] = result
    client.stop_stream()
    assert len(got_errors) == errors_sent
    assert all("INPUT0" in message for message in got_errors)
    assert set(got_ok) == set(expected)
    for request_id, want in expected.items():
        if want is not None:
            np.testing.assert_array_equal(got_ok[request_id].as_numpy("OUTPUT0"), want)
        else:
            assert got_ok[request_id].as_numpy("OUTPUT0").shape == (1, 10)


@pytest.fixture()
def slow_server(tmp_path: Path, grpc_frontend: str):  # type: ignore[no-untyped-def]
    write_model(tmp_path, "slow", slow_model_bytes(rows=1024, layers=8), config=SLOW_CONFIG)
    with ServerProcess(tmp_path, grpc_frontend=grpc_frontend) as proc:
        yield proc


def inference_count(client: tg.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0))


def test_stop_stream_cancels_queued_requests(slow_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(slow_server.grpc_url)
    before = inference_count(client, "slow")
    client.start_stream(callback=lambda result, error: None)
    for i in range(8):
        inp = tg.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), np.float32))
        client.async_stream_infer("slow", [inp], request_id=str(i))
    time.sleep(0.15)
    client.stop_stream(cancel_requests=True)
    time.sleep(1.5)
    ran = inference_count(client, "slow") - before
    assert ran < 8, "queued stream requests ran after the stream was cancelled"
    inp = tg.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert client.infer("slow", [inp]).as_numpy("OUTPUT0").shape == (1, 1)


# -- system shared memory --------------------------------------------------------------------
def test_system_shared_memory_flow(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    client.unregister_system_shared_memory()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    size = a.nbytes
    key_in, key_out = f"/fastoip_in_{id(client)}", f"/fastoip_out_{id(client)}"
    handle_in = shm.create_shared_memory_region("input_data", key_in, size * 2)
    handle_out = shm.create_shared_memory_region("output_data", key_out, size * 2)
    try:
        shm.set_shared_memory_region(handle_in, [a])
        shm.set_shared_memory_region(handle_in, [b], offset=size)
        client.register_system_shared_memory("input_data", key_in, size * 2)
        client.register_system_shared_memory("output_data", key_out, size * 2)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert set(status) == {"input_data", "output_data"}
        assert int(status["input_data"]["byte_size"]) == size * 2

        inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [tg.InferRequestedOutput("OUTPUT0"), tg.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer("simple", inputs, outputs=outputs)
        out0 = result.get_output("OUTPUT0")
        # As Triton does: the data is in shared memory and the response has an empty raw entry.
        assert [len(raw) for raw in result.get_response().raw_output_contents] == [0, 0]
        sum_ = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16])
        diff = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=size)
        np.testing.assert_array_equal(sum_, a + b)
        np.testing.assert_array_equal(diff, a - b)
        assert list(out0.shape) == [1, 16]

        # Offsets and sizes are checked against the region.
        bad = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
        bad[0].set_shared_memory("input_data", size, offset=size + 8)
        bad[1].set_shared_memory("input_data", size)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", bad)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "exceeds region 'input_data'" in err.value.message()
        short = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
        short[0].set_shared_memory("input_data", size - 4)
        short[1].set_shared_memory("input_data", size)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", short)
        assert "needs 64 bytes" in err.value.message()
        missing = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
        missing[0].set_shared_memory("no_region", size)
        missing[1].set_shared_memory("input_data", size)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", missing)
        assert err.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("too_big", key_in, size * 4)
        assert "exceeds" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("input_data", key_in, size)
        assert err.value.status() == "StatusCode.ALREADY_EXISTS"

        client.unregister_system_shared_memory("input_data")
        assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"output_data"}
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    finally:
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)
    assert client.infer("simple", simple_inputs(tg, a, b)).as_numpy("OUTPUT0").tolist() == (a + b).tolist()


def test_cuda_shared_memory_answers_clearly_without_gpu(server: ServerProcess) -> None:
    from fastoip import cuda

    if cuda.runtime() is not None:
        pytest.skip("a GPU is present: CUDA shared memory is tested by tests/test_cuda.py")
    client = tg.InferenceServerClient(server.grpc_url)
    # As Triton on any build: status lists no regions and unregister succeeds; only register needs CUDA.
    assert len(client.get_cuda_shared_memory_status().regions) == 0
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("gpu0", b"\x00" * 64, 0, 1024)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "GPU" in err.value.message()


# -- model control --------------------------------------------------------------------------
def fp32_input(value: float) -> list[tg.InferInput]:
    inp = tg.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return [inp]


class Hammer:
    """Constant load on one model from a few threads; records every failure and version seen."""

    def __init__(self, url: str, model: str, threads: int = 4) -> None:
        self.url, self.model = url, model
        self.failures: list[str] = []
        self.versions: list[str] = []
        self.count = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = tg.InferenceServerClient(self.url)
        while not self._stop.is_set():
            try:
                result = client.infer(self.model, fp32_input(1.0))
                self.versions.append(result.get_response().model_version)
                self.count += 1
            except InferenceServerException as exc:
                self.failures.append(f"{exc.status()}: {exc.message()}")

    def __enter__(self) -> Hammer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def test_explicit_model_control_without_downtime(tmp_path: Path, grpc_frontend: str) -> None:
    data = identity_model_bytes(1, [4], "swap")
    write_model(tmp_path, "swap", data, 1)
    write_model(tmp_path, "other", data, 1)
    args = ("--model-control-mode", "explicit", "--load-model", "swap")
    with ServerProcess(tmp_path, *args, grpc_frontend=grpc_frontend) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        assert client.is_model_ready("swap")
        assert not client.is_model_ready("other")  # explicit: only --load-model at start-up
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
        assert set(index) == {"swap", "other"}
        client.load_model("other")
        assert client.is_model_ready("other")
        client.unload_model("other")
        assert not client.is_model_ready("other")
        with pytest.raises(InferenceServerException) as err:
            client.infer("other", fp32_input(1))
        assert err.value.status() == "StatusCode.UNAVAILABLE"

        with Hammer(proc.grpc_url, "swap") as hammer:
            time.sleep(0.3)
            write_model(tmp_path, "swap", data, 2)
            client.load_model("swap")  # v2 loads while v1 serves, then swaps in
            time.sleep(0.3)
            (tmp_path / "swap" / "3").mkdir()
            (tmp_path / "swap" / "3" / "model.onnx").write_bytes(b"broken")
            with pytest.raises(InferenceServerException):
                client.load_model("swap")  # fails: v2 keeps serving
            time.sleep(0.3)
            client.load_model("swap", config=json.dumps({"max_batch_size": 4, "version_policy": {"specific": {"versions": [1, 2]}}}))
            time.sleep(0.3)
        assert hammer.failures == []
        assert hammer.count > 50
        assert hammer.versions[0] == "1" and "2" in hammer.versions
        assert client.get_model_metadata("swap", as_json=True)["versions"] == ["1", "2"]
        assert client.get_model_config("swap", as_json=True)["config"]["max_batch_size"] == 4
        index = {m["version"]: m for m in client.get_model_repository_index(as_json=True)["models"] if m["name"] == "swap"}
        assert set(index) == {"1", "2"}


def test_load_with_uploaded_model_files_over_grpc(tmp_path: Path, grpc_frontend: str) -> None:
    """Triton's load with ``config`` + ``file:<version>/model.onnx``: the model need not be in the repository."""
    load_with_uploaded_model_files(tmp_path, "grpc", grpc_frontend)


def test_load_with_uploaded_model_files_over_http(tmp_path: Path) -> None:
    """The same over HTTP: once, on the server's default gRPC frontend (no gRPC frontend is under test)."""
    load_with_uploaded_model_files(tmp_path, "http", None)


def load_with_uploaded_model_files(tmp_path: Path, protocol: str, grpc_frontend: str | None) -> None:
    import tritonclient.http as th

    write_model(tmp_path, "swap", identity_model_bytes(1, [4], "swap"), 1)
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", http=True, grpc_frontend=grpc_frontend) as proc:
        client = tg.InferenceServerClient(proc.grpc_url) if protocol == "grpc" else th.InferenceServerClient(proc.http_url)
        config = json.dumps({"backend": "onnxruntime", "max_batch_size": 8})
        client.load_model("uploaded", config=config, files={"file:3/model.onnx": identity_model_bytes(1, [4], "up")})
        assert client.is_model_ready("uploaded")
        grpc_client = tg.InferenceServerClient(proc.grpc_url)
        assert grpc_client.get_model_metadata("uploaded", as_json=True)["versions"] == ["3"]
        out = grpc_client.infer("uploaded", fp32_input(2.5)).as_numpy("OUTPUT0")
        assert out.tolist() == [[2.5] * 4]
        index = {m["name"]: m for m in grpc_client.get_model_repository_index(as_json=True)["models"]}
        assert index["uploaded"]["state"] == "READY"
        with pytest.raises(InferenceServerException) as err:
            client.load_model("again", files={"file:1/model.onnx": b"x"})
        assert "need a 'config'" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.load_model("bad", config=config, files={"file:1/model.onnx": b"not onnx"})
        assert "onnxruntime could not load" in err.value.message()
        uploads = Path(tempfile.gettempdir())
        assert list(uploads.glob("fastoip-upload-bad-*")) == []  # a failed load leaves nothing behind
        assert len(list(uploads.glob("fastoip-upload-uploaded-*"))) == 1
        client.unload_model("uploaded")
        assert not client.is_model_ready("uploaded")
        assert list(uploads.glob("fastoip-upload-uploaded-*")) == []


def test_model_control_mode_none_refuses_load(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple")
    assert "not allowed" in err.value.message()
    with pytest.raises(InferenceServerException):
        client.unload_model("simple")
    assert client.is_model_ready("simple")


def test_poll_mode_swaps_versions_without_downtime(tmp_path: Path, grpc_frontend: str) -> None:
    data = identity_model_bytes(1, [4], "polled")
    write_model(tmp_path, "polled", data, 1)
    with ServerProcess(
        tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0.2", grpc_frontend=grpc_frontend
    ) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        with Hammer(proc.grpc_url, "polled") as hammer:
            time.sleep(0.3)
            write_model(tmp_path, "polled", data, 2)
            assert wait_until(lambda: "2" in hammer.versions[-5:], timeout=20)
            write_model(tmp_path, "added", data, 1)
            assert wait_until(lambda: client.is_model_ready("added"), timeout=20)
            shutil.rmtree(tmp_path / "added")
            assert wait_until(lambda: not client.is_model_ready("added"), timeout=20)
        assert hammer.failures == []


# -- trace and log settings --------------------------------------------------------------------
def test_trace_and_log_settings(server: ServerProcess, tmp_path: Path) -> None:
    """The trace settings RPC with Triton's rules (tests/test_tracing_server.py writes traces end to end)."""
    client = tg.InferenceServerClient(server.grpc_url)
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"] and settings["trace_file"]["value"] == [""]
    updated = client.update_trace_settings(model_name="simple", settings={"trace_rate": ["7"]}, as_json=True)
    assert updated["settings"]["trace_rate"]["value"] == ["7"]
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]  # global unchanged
    client.update_trace_settings(model_name="simple", settings={"trace_rate": []})  # empty: cleared
    assert client.get_trace_settings(model_name="simple", as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    with pytest.raises(InferenceServerException) as err:  # no --trace-config triton,file=: nothing to write to
        client.update_trace_settings(settings={"trace_level": ["TENSORS"]})
    assert "trace file name is not given" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.update_trace_settings(settings={"trace_file": [str(tmp_path / "trace.json")]})
    assert "can not be updated" in err.value.message() and err.value.status() == "StatusCode.UNIMPLEMENTED"

    log = client.get_log_settings(as_json=True)["settings"]
    assert log["log_info"]["bool_param"] is True
    changed = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert changed["log_verbose_level"]["uint32_param"] == 1
    client.update_log_settings({"log_verbose_level": 0})
    with pytest.raises(InferenceServerException):
        client.update_log_settings({"no_such_setting": True})


def test_every_rpc_of_the_service_is_called_by_some_test() -> None:
    """A guard: each RPC of inference.GRPCInferenceService appears in a test through a client or stub."""
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
    assert len(methods) == 20
    calls = {
        "ServerLive": "is_server_live", "ServerReady": "is_server_ready", "ModelReady": "is_model_ready",
        "ServerMetadata": "get_server_metadata", "ModelMetadata": "get_model_metadata", "ModelInfer": "client.infer",
        "ModelStreamInfer": "async_stream_infer", "ModelConfig": "get_model_config",
        "ModelStatistics": "get_inference_statistics", "RepositoryIndex": "get_model_repository_index",
        "RepositoryModelLoad": "load_model", "RepositoryModelUnload": "unload_model",
        "SystemSharedMemoryStatus": "get_system_shared_memory_status",
        "SystemSharedMemoryRegister": "register_system_shared_memory",
        "SystemSharedMemoryUnregister": "unregister_system_shared_memory",
        "CudaSharedMemoryStatus": "get_cuda_shared_memory_status",
        "CudaSharedMemoryRegister": "register_cuda_shared_memory",
        "CudaSharedMemoryUnregister": "unregister_cuda_shared_memory",
        "TraceSetting": "update_trace_settings", "LogSettings": "update_log_settings",
    }
    assert set(calls) == set(methods)
    text = "".join(p.read_text() for p in Path(__file__).parents[1].rglob("test_*.py"))
    missing = [rpc for rpc, call in calls.items() if not re.search(re.escape(call) + r"\(", text)]
    assert missing == []


def test_grpc_stub_stream_with_raw_bytes(server: ServerProcess) -> None:
    """The stream answers Triton's ModelStreamInferResponse, decodable by the project's own stubs."""
    channel = grpc.insecure_channel(server.grpc_url)
    stream = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    requests = []
    for i in range(3):
        request = pb.ModelInferRequest(model_name="simple" if i != 1 else "missing", id=str(i))
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
        requests.append(request)
    answers = list(stream(iter(requests), timeout=30))
    assert len(answers) == 3
    by_id = {a.infer_response.id: a for a in answers}
    assert by_id["1"].error_message and "missing" in by_id["1"].error_message
    assert by_id["0"].error_message == "" and len(by_id["0"].infer_response.raw_output_contents) == 2

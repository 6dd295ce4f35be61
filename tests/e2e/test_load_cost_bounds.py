"""What one model-control request may cost (issue 37, finding 4; explicit mode, no --model-control-allow-code).

Before: a warmup ``count`` of 2e9 held the load lock for ever (other loads hung, SIGTERM was not honoured); a
1.5 KB BYTES warmup of dims [1e7] took +855 MB; 6 uploaded versions x 32 instances built 192 sessions (+383
threads); ``intra_op_thread_count`` was taken as given (+299 threads); an uploaded ONNX graph of 75 bytes answered
every 4-byte request with 256 MB (and ONNX Runtime's constant folding built such a tensor at load).  Each case ends
with a good request.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, write_model
from serverproc import ServerProcess, frontend_args

pytestmark = pytest.mark.timeout(240)

BIG = 8 * 1024 * 1024  # FP32 elements: 32 MiB a warmup run
CONFIG = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


def expanding_graph(elements: int) -> bytes:
    """The issue's graph: a 4-byte FP32 input Expanded to ``elements`` (a shape held in an initializer)."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [elements])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["INPUT0", "shape"], ["OUTPUT0"])], "expand",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, None)], initializer=[shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def shape_driven_graph() -> bytes:
    """ConstantOfShape of the client's INT64 input: the output's size is the request's data."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["SHAPE"], ["OUTPUT0"])], "filler",
        [helper.make_tensor_value_info("SHAPE", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("load-cost")
    write_model(root, "good", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    for version in range(1, 7):
        write_model(root, "versions", identity_model_bytes(TensorProto.FLOAT, [4]), version=version)
    with ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "good", http=True) as proc:
        yield proc


def good_request(server: ServerProcess) -> None:
    client = th.InferenceServerClient(server.http_url)
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = th.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("good", [inp]).as_numpy("OUTPUT0"), data)


def load_error(server: ServerProcess, name: str, config: dict, **files: bytes) -> str:
    client = th.InferenceServerClient(server.http_url, network_timeout=60)
    began = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name, config=json.dumps(config), files={f"file:{k}": v for k, v in files.items()} or None)
    assert time.monotonic() - began < 10, "the refusal took the load's time"
    return info.value.message()


def test_a_huge_warmup_count_is_refused(server: ServerProcess) -> None:
    config = {**CONFIG, "model_warmup": [{"name": "w", "batch_size": 1, "count": 2_000_000_000,
                                          "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4],
                                                                "zero_data": True}}}]}
    message = load_error(server, "good", config)
    assert "count 2000000000" in message and "at most 1000" in message, message
    good_request(server)


def test_a_huge_bytes_warmup_is_refused_before_it_is_built(server: ServerProcess) -> None:
    config = {**CONFIG, "input": [{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}], "max_batch_size": 0,
              "model_warmup": [{"name": "w", "inputs": {"INPUT0": {"data_type": "TYPE_STRING", "dims": [10_000_000],
                                                                   "random_data": True}}}]}
    before = int(Path(f"/proc/{server.proc.pid}/statm").read_text().split()[1])  # type: ignore[union-attr]
    message = load_error(server, "good", config)
    after = int(Path(f"/proc/{server.proc.pid}/statm").read_text().split()[1])  # type: ignore[union-attr]
    assert "10000000" in message and "bytes" in message, message
    assert (after - before) * os.sysconf("SC_PAGE_SIZE") < 100 * 1024 * 1024
    good_request(server)


def test_instances_count_over_every_version_of_a_load(server: ServerProcess) -> None:
    config = {**CONFIG, "version_policy": {"all": {}}, "instance_group": [{"count": 32, "kind": "KIND_CPU"}]}
    before = threads_of(server.proc.pid)  # type: ignore[union-attr]
    message = load_error(server, "versions", config)
    assert "32 instances x 6 versions = 192" in message and "at most 32" in message, message
    assert threads_of(server.proc.pid) - before < 16  # type: ignore[union-attr]
    good_request(server)


def test_intra_op_threads_are_capped_to_the_machine(server: ServerProcess) -> None:
    config = {**CONFIG, "parameters": {"intra_op_thread_count": {"string_value": "300"}}}
    client = th.InferenceServerClient(server.http_url, network_timeout=60)
    before = threads_of(server.proc.pid)  # type: ignore[union-attr]
    client.load_model("good", config=json.dumps(config))
    grew = threads_of(server.proc.pid) - before  # type: ignore[union-attr]
    print(f"intra_op_thread_count 300 on {os.cpu_count()} cores: +{grew} threads")
    assert grew < 2 * (os.cpu_count() or 1) + 16, grew
    good_request(server)
    client.load_model("good")  # the repository's config again


def test_an_uploaded_graph_that_computes_256_mb_is_refused_at_load(server: ServerProcess) -> None:
    """The issue's graph (75 bytes here) through the load API: refused before ONNX Runtime builds anything."""
    graph = expanding_graph(64 * 1024 * 1024)
    assert len(graph) < 120
    config = {"backend": "onnxruntime", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [64 * 1024 * 1024]}]}
    pid = server.proc.pid  # type: ignore[union-attr]
    before = rss_bytes(pid)
    message = load_error(server, "expand", config, **{"1/model.onnx": graph})
    grew = rss_bytes(pid) - before
    print(f"uploaded 256 MB Expand graph: refused, RSS +{grew / 2**20:.0f} MiB: {message}")
    assert "'OUTPUT0'" in message and "268435456 bytes" in message and "--onnx-max-tensor-bytes" in message, message
    assert grew < 100 * 1024 * 1024, grew
    # the same graph within the bound loads and answers
    client = th.InferenceServerClient(server.http_url, network_timeout=60)
    small = {**config, "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1024]}]}
    client.load_model("expand", config=json.dumps(small), files={"file:1/model.onnx": expanding_graph(1024)})
    inp = th.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.array([2.0], np.float32))
    np.testing.assert_array_equal(client.infer("expand", [inp]).as_numpy("OUTPUT0"), np.full(1024, 2.0, np.float32))
    client.unload_model("expand")
    good_request(server)


def test_an_uploaded_graph_whose_output_follows_the_request_is_bounded_per_request(server: ServerProcess) -> None:
    """No size is known at load (the shape is the request's data): a request whose output passes the bound fails
    with RESOURCE_EXHAUSTED (HTTP 500), its memory released; a small one is answered."""
    config = {"backend": "onnxruntime", "max_batch_size": 0,
              "input": [{"name": "SHAPE", "data_type": "TYPE_INT64", "dims": [1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
    client = th.InferenceServerClient(server.http_url, network_timeout=60)
    client.load_model("filler", config=json.dumps(config), files={"file:1/model.onnx": shape_driven_graph()})
    pid = server.proc.pid  # type: ignore[union-attr]

    def ask(elements: int) -> th.InferResult:
        inp = th.InferInput("SHAPE", [1], "INT64")
        inp.set_data_from_numpy(np.array([elements], np.int64))
        return client.infer("filler", [inp])

    before = rss_bytes(pid)
    for _ in range(3):
        with pytest.raises(InferenceServerException) as info:
            ask(64 * 1024 * 1024)
        assert info.value.status() == "500", info.value.status()
        assert "'OUTPUT0' is 268435456 bytes" in info.value.message(), info.value.message()
        assert "--onnx-max-tensor-bytes" in info.value.message()
    grew = rss_bytes(pid) - before
    print(f"3 requests for a 256 MB output: refused, RSS +{grew / 2**20:.0f} MiB")
    assert grew < 200 * 1024 * 1024, grew
    assert ask(16).as_numpy("OUTPUT0").shape == (16,)
    client.unload_model("filler")
    good_request(server)


def test_the_repository_graph_is_bounded_only_when_the_operator_says(tmp_path: Path) -> None:
    """--onnx-max-tensor-bytes-for: the default bounds uploads only (Triton loads any graph); 'all' bounds the
    repository's own files too."""
    write_model(tmp_path, "expand", expanding_graph(4 * 1024 * 1024))  # 16 MiB
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "expand",
                       "--onnx-max-tensor-bytes", str(1024 * 1024), http=True) as proc:
        client = th.InferenceServerClient(proc.http_url)
        assert client.is_model_ready("expand")
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", "--onnx-max-tensor-bytes", str(1024 * 1024),
                       "--onnx-max-tensor-bytes-for", "all", http=True) as proc:
        client = th.InferenceServerClient(proc.http_url)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("expand")
        assert "16777216 bytes" in info.value.message() and "1048576" in info.value.message(), info.value.message()
        assert not client.is_model_ready("expand")


def long_warmup_load_body() -> bytes:
    """A load whose warmup takes minutes: 4 entries of 1,000 runs of 32 MiB (each within a client's caps)."""
    entry = {"batch_size": 1, "count": 1000,
             "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [BIG], "random_data": True}}}
    config = {**CONFIG, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [BIG]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [BIG]}],
              "model_warmup": [{**entry, "name": f"w{index}"} for index in range(4)]}
    model = base64.b64encode(identity_model_bytes(TensorProto.FLOAT, [BIG])).decode()
    return json.dumps({"parameters": {"config": json.dumps(config), "file:1/model.onnx": model}}).encode()


def stopped_for_its_client(server: ServerProcess, name: str, within: float = 15.0) -> float:
    """Seconds until ``name``'s load ended for its client's leaving (its index reason), and another load went
    through the load lock (the repository's own ``good``)."""
    client = th.InferenceServerClient(server.http_url, network_timeout=120)
    began = time.monotonic()
    reason = ""
    while time.monotonic() - began < within:
        entry = next((e for e in client.get_model_repository_index() if e["name"] == name), {})
        reason = entry.get("reason", "")
        if "client went away" in reason:
            break
        time.sleep(0.2)
    assert "client went away" in reason, f"the load went on after its client left: {reason!r}"
    client.load_model("good")  # the load lock is free again
    took = time.monotonic() - began
    assert not client.is_model_ready(name)
    return took


def test_an_http_load_stops_when_its_client_disconnects(server: ServerProcess) -> None:
    import socket

    body = long_warmup_load_body()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/repository/models/slow_http/load HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(3.0)  # well into the warmup (minutes long)
    sock.close()
    took = stopped_for_its_client(server, "slow_http")
    print(f"HTTP load whose client disconnected: stopped, the next load through in {took:.2f} s")
    assert took < 15, took
    good_request(server)


def test_a_grpc_load_stops_when_its_deadline_passes(server: ServerProcess) -> None:
    grpc_load_past_its_deadline(server)


def test_a_grpcio_frontend_load_stops_when_its_deadline_passes(tmp_path: Path) -> None:
    write_model(tmp_path, "good", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "good",
                       *frontend_args("grpcio"), http=True) as proc:
        grpc_load_past_its_deadline(proc)


def grpc_load_past_its_deadline(server: ServerProcess) -> None:
    import tritonclient.grpc as tg

    body = json.loads(long_warmup_load_body())["parameters"]
    client = tg.InferenceServerClient(server.grpc_url)
    began = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("slow_grpc", config=body["config"],
                          files={"file:1/model.onnx": base64.b64decode(body["file:1/model.onnx"])}, client_timeout=3.0)
    assert "Deadline" in str(info.value) or "DEADLINE" in str(info.value), info.value
    assert time.monotonic() - began < 10
    took = stopped_for_its_client(server, "slow_grpc")
    print(f"gRPC load past its deadline: stopped, the next load through in {took:.2f} s")
    assert took < 15, took
    good_request(server)


def test_sigterm_stops_a_load_in_its_warmup(tmp_path: Path) -> None:
    write_model(tmp_path, "good", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    big = {**CONFIG, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [BIG]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [BIG]}],
           "model_warmup": [{"name": "w", "batch_size": 1, "count": 1000,
                             "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [BIG], "random_data": True}}}]}
    model = base64.b64encode(identity_model_bytes(TensorProto.FLOAT, [BIG])).decode()
    body = json.dumps({"parameters": {"config": json.dumps(big), "file:1/model.onnx": model}}).encode()
    with ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "good", http=True) as proc:
        import http.client
        import threading

        answers: list[int] = []

        def load() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", proc.http_port, timeout=120)
            conn.request("POST", "/v2/repository/models/big/load", body, {"Content-Type": "application/json"})
            answers.append(conn.getresponse().status)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(3.0)  # the warmup's 1,000 runs of 32 MiB take far longer than this
        assert not answers, "the load ended before SIGTERM: the test needs a longer warmup"
        began = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - began
        loader.join(10)
        print(f"SIGTERM during a load's warmup: exited {code} in {took:.2f} s; the load answered {answers}")
        assert took < 10, took
        assert answers and answers[0] == 503, answers

"""What one model-control request may cost (issue 37, finding 4; explicit mode, no --model-control-allow-code).

Before: a warmup ``count`` of 2e9 held the load lock for ever (other loads hung, SIGTERM was not honoured); a
1.5 KB BYTES warmup of dims [1e7] took +855 MB; 6 uploaded versions x 32 instances built 192 sessions (+383
threads); ``intra_op_thread_count`` was taken as given (+299 threads).  Each case ends with a good request.
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
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(240)

BIG = 8 * 1024 * 1024  # FP32 elements: 32 MiB a warmup run
CONFIG = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


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

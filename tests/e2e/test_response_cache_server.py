"""Triton's response cache in a real server: identical requests run once, hits and misses in the statistics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto

from models import identity_model_bytes
from serverproc import ServerProcess


def write(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4], name="identity"))
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("cache")
    write(root, "cached", "max_batch_size: 4\nresponse_cache { enable: true }\n")
    write(root, "uncached", "max_batch_size: 4\n")
    with ServerProcess(root, "--cache-config", "local,size=1048576") as proc:
        yield proc


def infer(url: str, model: str, values: list[float]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([values], dtype=np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def stats(url: str, model: str) -> grpcclient.service_pb2.ModelStatistics:  # type: ignore[name-defined]
    return grpcclient.InferenceServerClient(url).get_inference_statistics(model).model_stats[0]


def test_identical_concurrent_requests_run_once(server: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: infer(server.grpc_url, "cached", values), range(32)))
    for answer in answers:
        np.testing.assert_array_equal(answer, [values])
    s = stats(server.grpc_url, "cached")
    assert s.execution_count == 1  # one execution, 32 answers
    assert s.inference_stats.cache_miss.count == 1
    assert s.inference_stats.cache_hit.count == 31
    assert s.inference_stats.success.count == 32


def test_different_inputs_miss_and_uncached_models_always_run(server: ServerProcess) -> None:
    before = stats(server.grpc_url, "cached").inference_stats.cache_miss.count
    np.testing.assert_array_equal(infer(server.grpc_url, "cached", [9, 9, 9, 9]), [[9, 9, 9, 9]])
    np.testing.assert_array_equal(infer(server.grpc_url, "cached", [8, 9, 9, 9]), [[8, 9, 9, 9]])
    assert stats(server.grpc_url, "cached").inference_stats.cache_miss.count == before + 2
    for _ in range(3):
        infer(server.grpc_url, "uncached", [1, 1, 1, 1])
    plain = stats(server.grpc_url, "uncached")
    assert plain.execution_count == 3 and plain.inference_stats.cache_hit.count == 0


def _doubler_bytes() -> bytes:
    from onnx import helper

    node = helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"])
    tensor = helper.make_tensor_value_info
    graph = helper.make_graph([node], "doubler", [tensor("INPUT0", TensorProto.FLOAT, ["b", 4])],
                              [tensor("OUTPUT0", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_a_reload_never_answers_from_the_previous_load(tmp_path: Path) -> None:
    """Issue 27: a model reloaded with other weights under the same name and version answered the old cached
    result.  The cache key now names the load."""
    write(tmp_path, "swap", "max_batch_size: 4\nresponse_cache { enable: true }\n")
    with ServerProcess(tmp_path, "--cache-config", "local,size=1048576", "--model-control-mode", "explicit",
                       "--load-model", "swap") as proc:
        values = [1.0, 2.0, 3.0, 4.0]
        np.testing.assert_array_equal(infer(proc.grpc_url, "swap", values), [values])
        np.testing.assert_array_equal(infer(proc.grpc_url, "swap", values), [values])  # a hit
        (tmp_path / "swap" / "1" / "model.onnx").write_bytes(_doubler_bytes())
        grpcclient.InferenceServerClient(proc.grpc_url).load_model("swap")
        np.testing.assert_array_equal(infer(proc.grpc_url, "swap", values), [[2.0, 4.0, 6.0, 8.0]])


def test_a_leader_past_its_deadline_fails_no_identical_waiter(tmp_path: Path) -> None:
    """Issue 37: an identical request with a short deadline (or one then cancelled) led, and its own failure
    failed the 3 legitimate requests waiting on it (6/6).  Now the first waiter takes over and all 3 are served.
    The batcher holds a lone request 1.5 s, so the leader's 0.4 s deadline passes while it waits."""
    import time

    from tritonclient.utils import InferenceServerException

    write(tmp_path, "slow", "max_batch_size: 4\nresponse_cache { enable: true }\n"
          "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1500000 }\n")
    values = [4.0, 3.0, 2.0, 1.0]
    with ServerProcess(tmp_path, "--cache-config", "local,size=1048576") as proc:
        def leader() -> str:
            client = grpcclient.InferenceServerClient(proc.grpc_url)
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.array([values], dtype=np.float32))
            try:
                client.infer("slow", [inp], client_timeout=0.4)
            except InferenceServerException as exc:
                return str(exc.status())
            return "answered"

        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(leader)
            time.sleep(0.1)
            waiters = [pool.submit(infer, proc.grpc_url, "slow", values) for _ in range(3)]
            answers = [w.result(timeout=30) for w in waiters]
        assert first.result() == "StatusCode.DEADLINE_EXCEEDED"
        for answer in answers:
            np.testing.assert_array_equal(answer, [values])


def test_a_cancelled_leader_fails_no_identical_waiter(tmp_path: Path) -> None:
    """Issue 37's other case: the leading identical request is cancelled by its client while it waits in the
    batcher (1.5 s for a lone request); the 3 legitimate requests waiting on it are served."""
    import time

    write(tmp_path, "slow", "max_batch_size: 4\nresponse_cache { enable: true }\n"
          "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1500000 }\n")
    values = [5.0, 6.0, 7.0, 8.0]
    with ServerProcess(tmp_path, "--cache-config", "local,size=1048576") as proc:
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([values], dtype=np.float32))
        outcome: list[object] = []
        call = client.async_infer("slow", [inp], callback=lambda result, error: outcome.append(error or result))
        time.sleep(0.2)  # it leads: the others wait on it
        with ThreadPoolExecutor(3) as pool:
            waiters = [pool.submit(infer, proc.grpc_url, "slow", values) for _ in range(3)]
            time.sleep(0.3)
            call.cancel()
            answers = [w.result(timeout=30) for w in waiters]
        for answer in answers:
            np.testing.assert_array_equal(answer, [values])
        assert outcome and "CANCELLED" in str(outcome[0]).upper(), outcome

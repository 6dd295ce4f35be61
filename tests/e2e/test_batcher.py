"""The dynamic batcher end to end: correctness under concurrency, batching, queue policy, priority, cancellation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from models import write_model
from serverproc import ServerProcess, wait_until

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(frontend_server: ServerProcess) -> ServerProcess:
    """This module runs against every selected gRPC frontend (conftest's ``grpc_frontend``)."""
    return frontend_server


def stats_of(client: tg.InferenceServerClient, model: str) -> dict:
    """Counters of the model's newest version (protobuf JSON leaves zero values out)."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    success = stats.get("inference_stats", {}).get("success", {})
    return {
        "requests": int(success.get("count", 0)),
        "executions": int(stats.get("execution_count", 0)),
        "inferences": int(stats.get("inference_count", 0)),
        "batch_sizes": [int(b["batch_size"]) for b in stats.get("batch_stats", [])],
    }


def test_500_concurrent_requests_each_get_their_own_result(server: ServerProcess, demo_repo: Path) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    client = tg.InferenceServerClient(server.grpc_url)
    before = stats_of(client, "mlp")
    rng = np.random.default_rng(11)
    count = 500
    inputs = [rng.standard_normal((int(rng.integers(1, 9)), 256)).astype(np.float32) for _ in range(count)]
    for index, x in enumerate(inputs):
        x[:, 0] = index  # unique data per request
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary(INFER)
    payloads = [
        _codec.encode_infer_request(
            InferRequest("mlp", id=str(i), inputs=[InferInput("INPUT0", "FP32", x.shape, x)])
        )
        for i, x in enumerate(inputs)
    ]
    futures = [call.future(p, timeout=120) for p in payloads]  # all 500 in flight at once
    responses = [_codec.decode_infer_response(f.result()) for f in futures]
    expected = [session.run(None, {"INPUT0": x})[0] for x in inputs]
    for i, (response, want) in enumerate(zip(responses, expected, strict=False)):
        assert response.id == str(i)
        got = response.outputs[0].data
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    after = stats_of(client, "mlp")
    requests = after["requests"] - before["requests"]
    executions = after["executions"] - before["executions"]
    inferences = after["inferences"] - before["inferences"]
    assert requests == count
    assert inferences == sum(x.shape[0] for x in inputs)
    assert executions < requests, f"no batching: {executions} executions for {requests} requests"
    assert max(after["batch_sizes"]) > 8


#: A model that holds its one instance for a fixed time per item: a sleep, so the queue fills the same way on a
#: busy machine as on a quiet one, and waiting burns no CPU (ONNX matmul models took 4x longer under load).
#: It touches ``started`` when an execution begins: a test can wait for "running" instead of guessing.
SLEEPER = """
import pathlib
import time
import fastoip

class Sleeper(fastoip.Model):
    @fastoip.batchable
    def predict(self, inputs, parameters):
        pathlib.Path({started!r}).touch()
        time.sleep({seconds} * len(inputs["INPUT0"]))
        return {{"OUTPUT0": inputs["INPUT0"]}}
"""
SLEEPER_CONFIG = """backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
max_batch_size: {max_batch_size}
{scheduling}
"""


def write_sleeper(root: Path, name: str, seconds: float, max_batch_size: int, scheduling: str) -> None:
    """A Python model ``name`` (INPUT0 FP32 [batch, 1] -> OUTPUT0, the same) that sleeps ``seconds`` an item."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(SLEEPER.format(seconds=seconds, started=str(started(root, name))))
    config = SLEEPER_CONFIG.format(max_batch_size=max_batch_size, scheduling=scheduling)
    (root / name / "config.pbtxt").write_text(config)


def started(root: Path, name: str) -> Path:
    """The file the sleeper ``name`` touches when an execution begins."""
    return root / f"{name}.started"


@pytest.fixture()
def slow_repo(tmp_path: Path) -> Path:
    write_sleeper(tmp_path, "slow_queue", 0.5, 8, "dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    write_sleeper(tmp_path, "slow_timeout", 0.1, 1, (
        "dynamic_batching { default_queue_policy { default_timeout_microseconds: 20000 allow_timeout_override: true } }"
    ))
    write_sleeper(tmp_path, "slow_priority", 0.4, 1, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }")
    # 0.6 s an item: the queued requests are cancelled long before the instance is free, even on a busy machine.
    write_sleeper(tmp_path, "slow_cancel", 0.6, 1, "dynamic_batching { }")
    return tmp_path


def one(x: float) -> list[tg.InferInput]:
    inp = tg.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[x]], np.float32))
    return [inp]


def pending(proc: ServerProcess, model: str) -> int:
    """The server's ``nv_inference_pending_request_count`` for ``model`` (requests queued, not yet running)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def start_running(root: Path, name: str, call: Callable[[], object]) -> threading.Thread:
    """Start ``call`` on a thread and return once the sleeper ``name`` has begun executing it."""
    started(root, name).unlink(missing_ok=True)
    thread = threading.Thread(target=call)
    thread.start()
    assert wait_until(started(root, name).exists, timeout=60), f"{name} never started"
    return thread


def test_queue_full_timeout_priority_and_cancel(slow_repo: Path, grpc_frontend: str) -> None:
    # Each step waits for what the server shows (an execution started, a queue length), never for a fixed time,
    # so a busy machine slows the test down instead of reordering it.
    with ServerProcess(slow_repo, metrics=True, grpc_frontend=grpc_frontend) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)

        # Queue full: one running, two waiting, the rest refused.
        with ThreadPoolExecutor(12) as pool:
            def attempt(i: int) -> str:
                try:
                    client.infer("slow_queue", one(i))
                    return "ok"
                except InferenceServerException as exc:
                    return f"{exc.status()} {exc.message()}"

            # The first runs before the others arrive (else two may wait in the queue and one less succeeds).
            running = pool.submit(attempt, 0)
            assert wait_until(started(slow_repo, "slow_queue").exists, timeout=60), proc.output()
            others = list(pool.map(attempt, range(1, 12)))
            outcomes = [running.result(), *others]
        refused = [o for o in outcomes if o != "ok"]
        assert refused, outcomes
        assert all(o == "StatusCode.UNAVAILABLE Exceeds maximum queue size" for o in refused), refused
        assert outcomes.count("ok") >= 3

        # Timeout from the policy (20 ms) while the instance is busy, and overridden per request.
        busy = start_running(slow_repo, "slow_timeout", lambda: client.infer("slow_timeout", one(0)))
        with pytest.raises(InferenceServerException) as err:
            client.infer("slow_timeout", one(1))
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert "Request timeout expired" in err.value.message()
        busy.join()
        busy = start_running(slow_repo, "slow_timeout", lambda: client.infer("slow_timeout", one(0)))
        client.infer("slow_timeout", one(2), timeout=30_000_000)  # 30 s in µs: waits and succeeds
        busy.join()

        # Priority: level 1 overtakes level 2 in the queue.
        finished: list[str] = []
        lock = threading.Lock()

        def run(name: str, priority: int) -> None:
            client.infer("slow_priority", one(0), priority=priority)
            with lock:
                finished.append(name)

        blocker = start_running(slow_repo, "slow_priority", lambda: run("blocker", 2))
        low = [threading.Thread(target=run, args=(f"low{i}", 2)) for i in range(3)]
        for thread in low:
            thread.start()
        assert wait_until(lambda: pending(proc, "slow_priority") == 3, timeout=60), proc.output()
        high = threading.Thread(target=run, args=("high", 1))
        high.start()
        for thread in [blocker, *low, high]:
            thread.join()
        assert finished[0] == "blocker"
        assert finished[1] == "high", finished

        # Cancellation and client deadlines: the request leaves the queue and never runs.
        before = stats_of(client, "slow_cancel")
        call = grpc.insecure_channel(proc.grpc_url).unary_unary(INFER)
        payload = _codec.encode_infer_request(
            InferRequest("slow_cancel", inputs=[InferInput("INPUT0", "FP32", (1, 1), np.ones((1, 1), np.float32))])
        )
        started(slow_repo, "slow_cancel").unlink(missing_ok=True)
        running = call.future(payload, timeout=30)
        assert wait_until(started(slow_repo, "slow_cancel").exists, timeout=60), proc.output()
        cancelled = call.future(payload, timeout=30)
        expired = call.future(payload, timeout=0.05)
        time.sleep(0.005)
        cancelled.cancel()
        running.result()
        with pytest.raises(grpc.RpcError) as err:
            expired.result()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(0.3)
        after = stats_of(client, "slow_cancel")
        ran = after["inferences"] - before["inferences"]
        assert ran == 1, f"{ran} executions: a cancelled or expired request ran"
        client.infer("slow_cancel", one(5))  # still serving


def test_server_wide_default_batcher_for_models_without_config(tmp_path: Path, grpc_frontend: str) -> None:
    from models import identity_model_bytes

    write_model(tmp_path, "plain", identity_model_bytes(1, [4], "plain"))
    write_model(tmp_path, "unbatched", identity_model_bytes(1, [4], "unbatched"), config="max_batch_size: 8\n")
    args = ("--default-dynamic-batching", "--default-max-queue-delay-microseconds", "250")
    with ServerProcess(tmp_path, *args, grpc_frontend=grpc_frontend) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        config = client.get_model_config("plain", as_json=True)["config"]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "250"
        # An explicit config with no scheduling block also gets the server default.
        assert "dynamic_batching" in client.get_model_config("unbatched", as_json=True)["config"]
        inp = tg.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(np.ones((2, 4), np.float32))
        np.testing.assert_array_equal(client.infer("plain", [inp]).as_numpy("OUTPUT0"), np.ones((2, 4), np.float32))

"""Issue 36: a model's own ``is_ready()`` never holds a frontend's event loop.

A Triton Python model whose ``is_ready()`` sleeps 3 s: while a readiness request (gRPC ServerReady / ModelReady,
HTTP /v2/health/ready, /v2/models/{m}/ready, KServe V1 /v1/models/{m}) waits for it, a gRPC ``simple`` infer and
an HTTP /v2/health/live on the same server answer at once, on either gRPC frontend.
"""

from __future__ import annotations

import shutil
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(180)

#: is_ready() notes each start in STARTED (one line), then sleeps SLEEP_S.
SLOW_READY = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]

        def is_ready(self):
            with open({started!r}, "a") as notes:
                notes.write("checking\\n")
            time.sleep({sleep})
            return True
"""
#: is_ready() waits while the file HOLD exists (at most 60 s): a hung check, for the flood.
HUNG_READY = """
    import os
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]

        def is_ready(self):
            end = time.monotonic() + 60
            while os.path.exists({hold!r}) and time.monotonic() < end:
                time.sleep(0.05)
            return True
"""
CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLEEP_S = 3.0
#: What an answer on a free loop must take at most (loaded 2-core machine); a held loop takes the sleep's 3 s.
PROMPT_S = 1.5


@pytest.fixture(scope="module")
def slow_ready_server(demo_repo: Path, grpc_frontend: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("slow_ready")
    shutil.copytree(demo_repo / "simple", root / "simple")
    started = root / "started"
    started.touch()
    (root / "slow_ready" / "1").mkdir(parents=True)
    source = textwrap.dedent(SLOW_READY).format(started=str(started), sleep=SLEEP_S)
    (root / "slow_ready" / "1" / "model.py").write_text(source)
    (root / "slow_ready" / "config.pbtxt").write_text(textwrap.dedent(CONFIG).replace("{name}", "slow_ready"))
    (root / "hung_ready" / "1").mkdir(parents=True)
    hold = root / "hold"
    (root / "hung_ready" / "1" / "model.py").write_text(textwrap.dedent(HUNG_READY).format(hold=str(hold)))
    (root / "hung_ready" / "config.pbtxt").write_text(textwrap.dedent(CONFIG).replace("{name}", "hung_ready"))
    # the default --strict-readiness: the server's readiness asks every model, slow_ready too
    with ServerProcess(root, http=True, grpc_frontend=grpc_frontend) as proc:
        proc.started_notes = started  # type: ignore[attr-defined]
        proc.hold = hold  # type: ignore[attr-defined]
        yield proc


def _checks_started(server: ServerProcess) -> int:
    return len(server.started_notes.read_text().splitlines())  # type: ignore[attr-defined]


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _simple_infer(client: grpcclient.InferenceServerClient) -> None:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    result = client.infer("simple", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]


def _readiness_requests(server: ServerProcess) -> dict:
    http = f"http://{server.http_url}"
    return {
        "grpc ModelReady": lambda: grpcclient.InferenceServerClient(server.grpc_url).is_model_ready("slow_ready"),
        "grpc ServerReady": lambda: grpcclient.InferenceServerClient(server.grpc_url).is_server_ready(),
        "http model ready": lambda: _http_status(f"{http}/v2/models/slow_ready/ready") == 200,
        "http server ready": lambda: _http_status(f"{http}/v2/health/ready") == 200,
        "kserve v1 model ready": lambda: _http_status(f"{http}/v1/models/slow_ready") == 200,
    }


@pytest.mark.parametrize("asking", ["grpc ModelReady", "grpc ServerReady", "http model ready",
                                    "http server ready", "kserve v1 model ready"])
def test_a_slow_is_ready_holds_no_event_loop(slow_ready_server: ServerProcess, asking: str) -> None:
    client = grpcclient.InferenceServerClient(slow_ready_server.grpc_url)
    _simple_infer(client)  # (connected and warm before anything is timed)
    before = _checks_started(slow_ready_server)
    answers: list[tuple[bool, float]] = []

    def ask() -> None:
        began = time.monotonic()
        ready = _readiness_requests(slow_ready_server)[asking]()
        answers.append((ready, time.monotonic() - began))

    waiting = threading.Thread(target=ask)
    waiting.start()
    try:
        # the model's is_ready() is running: the readiness request waits for it
        assert wait_until(lambda: _checks_started(slow_ready_server) > before, timeout=30)
        began = time.monotonic()
        _simple_infer(client)
        infer_s = time.monotonic() - began
        began = time.monotonic()
        assert _http_status(f"http://{slow_ready_server.http_url}/v2/health/live") == 200
        live_s = time.monotonic() - began
    finally:
        waiting.join(30)
    assert infer_s < PROMPT_S, f"a gRPC infer waited {infer_s:.1f} s behind {asking}"
    assert live_s < PROMPT_S, f"HTTP health/live waited {live_s:.1f} s behind {asking}"
    # the readiness request did wait for the model's answer, and took it
    assert answers and answers[0][0] is True
    assert answers[0][1] > SLEEP_S - 1.0


def test_a_model_without_is_ready_is_answered_on_the_loop(slow_ready_server: ServerProcess) -> None:
    """``simple`` (ONNX) cannot wait: its readiness is answered at once, even while slow_ready's check runs."""
    client = grpcclient.InferenceServerClient(slow_ready_server.grpc_url)
    before = _checks_started(slow_ready_server)
    waiting = threading.Thread(target=lambda: client.is_model_ready("slow_ready"))
    waiting.start()
    try:
        assert wait_until(lambda: _checks_started(slow_ready_server) > before, timeout=30)
        began = time.monotonic()
        assert client.is_model_ready("simple")
        assert _http_status(f"http://{slow_ready_server.http_url}/v2/models/simple/ready") == 200
        assert time.monotonic() - began < PROMPT_S * 2
    finally:
        waiting.join(30)


def test_a_flood_of_readiness_requests_for_a_hung_is_ready_is_bounded(slow_ready_server: ServerProcess) -> None:
    """Who: any client of ModelReady.  What it holds: a place among core/readiness_pool.py's MAX_WAITING (64) and
    one of its threads.  Full: refused at once (RESOURCE_EXHAUSTED; HTTP 503 with Retry-After), the rest of the
    server unaffected; when the model answers, every waiting request gets its answer."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    if slow_ready_server.grpc_frontend != "native":
        pytest.skip("grpcio answers ModelReady on its own bounded thread pool, not the readiness pool")
    hold = slow_ready_server.hold  # type: ignore[attr-defined]
    hold.touch()
    channel = grpc.insecure_channel(slow_ready_server.grpc_url)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        flood = [stub.ModelReady.future(service_pb2.ModelReadyRequest(name="hung_ready"), timeout=120)
                 for _ in range(80)]
        # 64 wait (python_backend's 5 s bound frees the first places only after 5 s), the rest are refused
        assert wait_until(lambda: sum(f.done() for f in flood) >= 80 - 64, timeout=30)
        refused = [f for f in flood if f.done() and f.exception() is not None]
        assert len(refused) >= 80 - 64 - 4
        for answer in refused:
            assert answer.exception() is not None
            assert answer.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[union-attr]
            assert "readiness requests are waiting" in answer.exception().details()  # type: ignore[union-attr]
        # HTTP's answer while full: 503 with Retry-After
        url = f"http://{slow_ready_server.http_url}/v2/models/hung_ready/ready"
        try:
            urllib.request.urlopen(url, timeout=30)
            raise AssertionError("a readiness request past the bound was not refused")
        except urllib.error.HTTPError as full:
            assert full.code == 503 and full.headers["Retry-After"] == "1"
        # the rest of the server: inference, liveness, a readiness that cannot wait
        client = grpcclient.InferenceServerClient(slow_ready_server.grpc_url)
        began = time.monotonic()
        _simple_infer(client)
        assert client.is_model_ready("simple")
        assert _http_status(f"http://{slow_ready_server.http_url}/v2/health/live") == 200
        assert time.monotonic() - began < PROMPT_S * 2
        # the model answers: every request that waited gets its answer (past python_backend's 5 s bound some are
        # "not ready" for the request that timed out; none is lost)
        hold.unlink()
        waited = [f for f in flood if f not in refused]
        for answer in waited:
            assert answer.exception(timeout=90) is None
        assert client.is_model_ready("hung_ready")
    finally:
        hold.unlink(missing_ok=True)
        channel.close()

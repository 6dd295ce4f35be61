"""Prometheus metrics on their own port, under Triton's names, agreeing with ModelStatistics."""

from __future__ import annotations

import http.client
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

SAMPLE = re.compile(r'^(\w+)\{model="([^"]*)",version="([^"]*)"\} (\d+)$')


@pytest.fixture(scope="module")
def metrics_server(demo_repo: Path, grpc_frontend: str):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, metrics=True, grpc_frontend=grpc_frontend) as proc:
        yield proc


def scrape(port: int, method: str = "GET", path: str = "/metrics") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        conn.close()


def samples(text: str) -> dict[tuple[str, str, str], int]:
    found = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            found[(match.group(1), match.group(2), match.group(3))] = int(match.group(4))
    return found


def simple_inputs(a: np.ndarray) -> list[tg.InferInput]:
    inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def test_metrics_count_what_statistics_count(metrics_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(metrics_server.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    threads = [threading.Thread(target=lambda: [client.infer("simple", simple_inputs(a)) for _ in range(10)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bad = [tg.InferInput("INPUT0", [1, 16], "INT32")]
    bad[0].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException):
        client.infer("simple", bad)  # refused before it runs

    status, content_type, text = scrape(metrics_server.metrics_port)
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    got = samples(text)
    stats = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    key = ("simple", "1")
    assert got[("nv_inference_request_success", *key)] == int(inference["success"]["count"]) >= 40
    assert got[("nv_inference_request_failure", *key)] == int(inference["fail"].get("count", 0))
    assert got[("nv_inference_count", *key)] == int(stats["inference_count"])
    assert got[("nv_inference_exec_count", *key)] == int(stats["execution_count"])
    assert got[("nv_inference_queue_duration_us", *key)] == int(inference["queue"]["ns"]) // 1000
    assert got[("nv_inference_compute_infer_duration_us", *key)] == int(inference["compute_infer"]["ns"]) // 1000
    assert got[("nv_inference_request_duration_us", *key)] >= got[("nv_inference_compute_infer_duration_us", *key)]
    assert got[("nv_inference_pending_request_count", *key)] == 0
    # Every loaded model is listed, also those nobody asked.
    assert ("nv_inference_count", "mlp", "1") in got


def test_only_get_metrics_is_served(metrics_server: ServerProcess) -> None:
    status, _, body = scrape(metrics_server.metrics_port, path="/v2/health/ready")
    assert status == 404 and '"error"' in body
    status, _, body = scrape(metrics_server.metrics_port, method="POST")
    assert status == 405 and "only GET /metrics" in body
    assert scrape(metrics_server.metrics_port)[0] == 200


def test_metrics_port_can_be_turned_off(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, "--metrics-port", "-1") as proc:
        assert proc.metrics_port == 0
        assert "metrics listening" not in proc.output()
        assert tg.InferenceServerClient(proc.grpc_url).is_server_ready()


def test_metrics_port_in_use_is_a_clear_start_failure(demo_repo: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(demo_repo),
             "--grpc-port", "0", "--http-port", "-1", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 1
    assert f"fastoip: cannot start: [Errno 98] metrics port 127.0.0.1:{port}: Address already in use" in result.stderr

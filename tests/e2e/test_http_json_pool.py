"""Large JSON inference requests are decoded off the HTTP event loop (issue 27, server/http/json_pool.py).

Before: a valid JSON body was parsed (orjson) and turned into arrays (numpy) on the loop, both holding the GIL
for the whole call: about 0.2 s per 192 MB on a quiet machine, and every other HTTP client, health checks
included, waited that long.  Now JSON parts of 2 MiB and more are decoded in worker processes.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from memory import RssSampler, rss_bytes
from serverproc import ServerProcess
from serving import assert_good_infer

pytestmark = pytest.mark.timeout(300)


def post(port: int, path: str, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def longest_health_stall(port: int, during: list[threading.Thread]) -> tuple[float, float]:
    """Another client's GET /v2/health/live latencies while ``during`` run: (longest, seconds they took)."""
    stalls: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while not stop.is_set():
            began = time.monotonic()
            conn.request("GET", "/v2/health/live")
            response = conn.getresponse()
            response.read()
            stalls.append(time.monotonic() - began)
            assert response.status == 200
            time.sleep(0.005)
        conn.close()

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(0.3)
    began = time.monotonic()
    for thread in during:
        thread.start()
    for thread in during:
        thread.join(240)
    took = time.monotonic() - began
    stop.set()
    prober.join(30)
    return max(stalls), took


def test_a_large_json_body_does_not_stall_other_clients(demo_repo: Path) -> None:
    count = 8_000_000  # about 32 MB of JSON: [0.5, 0.5, ...]
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": [0.5] * count}]})
    with ServerProcess(demo_repo, "--http-max-input-size", str(256 << 20), http=True) as proc:
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        answers: list[tuple[int, dict]] = []
        posts = [threading.Thread(target=lambda: answers.append(post(proc.http_port, "/v2/models/nope/infer", body)))
                 for _ in range(2)]
        with RssSampler(proc.proc.pid) as peak:  # type: ignore[union-attr]
            longest, took = longest_health_stall(proc.http_port, posts)
        print(f"2 JSON bodies of {len(body) >> 20} MiB decoded in {took:.2f} s; longest health stall "
              f"{longest:.3f} s; server RSS +{(peak.peak - before) >> 20} MiB")
        assert [status for status, _ in answers] == [404, 404], answers  # decoded, then the model is unknown
        assert longest < max(0.5, took / 4), (longest, took)
        assert_good_infer(proc.http_port)


def test_a_large_json_request_decoded_off_the_loop_is_answered_right(demo_repo: Path) -> None:
    data = np.random.default_rng(7).random((4, 3, 224, 224), dtype=np.float32)  # about 6 MB of JSON
    request = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(data.shape),
                           "data": data.reshape(2, -1).tolist()}]}  # nested otherwise than the shape
    body = orjson.dumps(request)
    assert len(body) > 2 * 1024 * 1024
    bad = body.replace(b'"FP32"', b'"INT8"')
    with ServerProcess(demo_repo, "--http-thread-count", "1", http=True) as proc:
        status, answer = post(proc.http_port, "/v2/models/image_identity/infer", body)
        assert status == 200, answer
        out = np.asarray(answer["outputs"][0]["data"], dtype=np.float32)
        assert np.array_equal(out.reshape(-1), data.reshape(-1))
        status, answer = post(proc.http_port, "/v2/models/image_identity/infer", bad)  # refused in the worker
        assert status == 400 and "INT8" in answer["error"], answer
        status, answer = post(proc.http_port, "/v2/models/image_identity/infer", body[:-1])  # malformed JSON
        assert status == 400 and answer["error"], answer
        assert_good_infer(proc.http_port)

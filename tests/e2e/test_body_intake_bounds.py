"""One intake for every body, bounded queues that answer instead of wait, inflation within one budget (issue 37,
findings 2 and 3; server/inflate.py, server/http/intake.py, server/http/json_pool.py).

Before: every JSON endpoint but V2 infer inflated and parsed on the HTTP event loop (four 59 KB gzip uploads of
59 MB of JSON stalled /v2/health/ready for up to 8.2 s); the large-JSON pool's queue had no bound and kept every
inflated body (10 uploads: a 3 MB JSON request waited 13.3 s, RSS +883 MB); a gzip'ed 602 KB gRPC request waited
7.5 s behind 8 bombs in the 2-thread inflation pool; one 1 MB bomb peaked the server at +1.7 GB.  Each attack is
followed by a legitimate request that must be served.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from h2raw import MODEL_INFER, RawGrpcConnection, assert_good_request_on_new_connection, grpc_frame
from memory import RssSampler, rss_bytes
from serverproc import ServerProcess
from serving import assert_good_infer

pytestmark = pytest.mark.timeout(300)
GZIP = (("grpc-encoding", "gzip"),)
MIB = 1024 * 1024


def gzip_of_zeros(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (about 1,000 to 1), made without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * MIB
    parts = [packer.compress(zeros) for _ in range(inflated // MIB)]
    return b"".join(parts) + packer.flush()


def json_bomb(prefix: bytes, inflated: int, suffix: bytes) -> bytes:
    """A gzip'ed JSON document of about ``inflated`` bytes: ``prefix`` 0,0,0,... ``suffix``."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"0," * (MIB // 2)
    parts = [packer.compress(prefix)] + [packer.compress(chunk) for _ in range(inflated // MIB)]
    return b"".join(parts) + packer.compress(b"0" + suffix) + packer.flush()


def stall_bound() -> float:
    """0.5 s (the issue's bound) on a machine with a core to spare; on one whose run queue is longer than its
    cores (the shared test machine under make test), 2 s: the scheduler alone delays the loop there (still four
    times under the 8.2 s these attacks caused)."""
    busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    return 0.5 if busy < 1.0 else 2.0


def image_request(request_id: str = "good") -> tuple[bytes, np.ndarray]:
    data = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)  # 602,112 bytes
    request = InferRequest("image_identity", id=request_id, inputs=[InferInput("INPUT0", "FP32", data.shape, data)])
    return _codec.encode_infer_request(request), data


def post(port: int, path: str, body: bytes, headers: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw or b"{}")
        except ValueError:
            return response.status, {"raw": raw[:200].decode("latin-1")}
    finally:
        conn.close()


class Prober:
    """Another client's GET /v2/health/ready, over and over on one connection, while an attack runs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stop.is_set():
            began = time.monotonic()
            conn.request("GET", "/v2/health/ready")
            response = conn.getresponse()
            response.read()
            self.latencies.append(time.monotonic() - began)
            assert response.status == 200
            time.sleep(0.01)
        conn.close()

    def __enter__(self) -> Prober:
        self.thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def test_gzip_bombs_do_not_delay_a_compressed_request(demo_repo: Path, native_frontend: str) -> None:
    """8 bombs of 1 MB (about 1 GB each inflated) at once, then a gzip'ed 602 KB request: answered in 2 s, and the
    server's memory stays within the inflation budget."""
    bomb = gzip_of_zeros(1024 * MIB)
    payload, data = image_request()
    packed = gzip.compress(payload, 1)
    with ServerProcess(demo_repo, grpc_frontend=native_frontend) as proc:
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        with RssSampler(proc.proc.pid) as peak:  # type: ignore[union-attr]
            conns = [RawGrpcConnection(proc.grpc_port).handshake() for _ in range(8)]
            streams = []
            for conn in conns:
                stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
                conn.send_data(stream_id, grpc_frame(bomb, compressed=True))
                streams.append(stream_id)
            time.sleep(0.05)
            began = time.monotonic()
            with RawGrpcConnection(proc.grpc_port) as good:
                good.handshake()
                stream_id = good.start_call(MODEL_INFER, extra=GZIP)
                good.send_data(stream_id, grpc_frame(packed, compressed=True))
                result = good.wait(stream_id, 30)
            took = time.monotonic() - began
            refused = [conn.wait(stream_id, 60) for conn, stream_id in zip(conns, streams, strict=True)]
        for conn in conns:
            conn.close()
        grew = (peak.peak - before) >> 20
        print(f"8 x 1 MB gzip bombs: the 602 KB gzip'ed request answered in {took:.3f} s; bombs "
              f"{[r.status for r in refused]}; RSS +{grew} MiB")
        assert result.status == 0, (result.status, result.message)
        (message,) = result.messages
        answer = _codec.decode_infer_response(message)
        assert np.array_equal(np.asarray(answer.outputs[0].data).reshape(data.shape), data)
        assert took < 2.0, took
        assert all(r.status == 8 for r in refused), [(r.status, r.message) for r in refused]  # RESOURCE_EXHAUSTED
        assert grew < 400, grew
        assert_good_request_on_new_connection(proc.grpc_port)


def test_a_lone_bomb_stops_at_the_inflation_budget(demo_repo: Path, native_frontend: str) -> None:
    bomb = gzip_of_zeros(1024 * MIB)
    with ServerProcess(demo_repo, grpc_frontend=native_frontend) as proc:
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        with RssSampler(proc.proc.pid) as peak, RawGrpcConnection(proc.grpc_port) as conn:  # type: ignore[union-attr]
            conn.handshake()
            stream_id = conn.start_call(MODEL_INFER, extra=GZIP)
            conn.send_data(stream_id, grpc_frame(bomb, compressed=True))
            result = conn.wait(stream_id, 60)
        grew = (peak.peak - before) >> 20
        print(f"one 1 MB bomb: {result.status} {result.message!r}; RSS +{grew} MiB")
        assert result.status == 8 and "--max-inflated-request-bytes" in result.message, result.message
        assert grew < 300, grew
        assert_good_request_on_new_connection(proc.grpc_port)


#: Every JSON endpoint: path, prefix and suffix of a 59 MB JSON document for it.
JSON_ENDPOINTS = [
    ("/v1/models/simple:predict", b'{"instances": [', b"]}"),
    ("/v1/models/simple:explain", b'{"instances": [', b"]}"),
    ("/v2/trace/setting", b'{"trace_level": [', b"]}"),
    ("/v2/logging", b'{"log_info": [', b"]}"),
    ("/v2/models/simple/generate", b'{"INPUT0": [', b"]}"),
    ("/v2/repository/models/simple/load", b'{"parameters": {"x": [', b"]}}"),
    ("/v2/models/simple/infer", b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [',
     b"]}]}"),
]


@pytest.mark.parametrize(("path", "prefix", "suffix"), JSON_ENDPOINTS, ids=[p for p, _, _ in JSON_ENDPOINTS])
def test_gzip_uploads_to_each_json_endpoint_leave_the_loop_free(demo_repo: Path, path: str, prefix: bytes,
                                                                 suffix: bytes) -> None:
    body = json_bomb(prefix, 59 * MIB, suffix)
    with ServerProcess(demo_repo, "--model-control-mode", "explicit", "--load-model", "simple", http=True) as proc:
        post(proc.http_port, "/v2/models/nope/infer", b'{"inputs": [' + b"0," * (2 * MIB) + b"0]}")  # workers up
        answers: list[int] = []
        uploads = [threading.Thread(target=lambda: answers.append(
            post(proc.http_port, path, body, {"Content-Encoding": "gzip"})[0])) for _ in range(4)]
        with Prober(proc.http_port) as prober:
            for upload in uploads:
                upload.start()
            for upload in uploads:
                upload.join(240)
        longest = max(prober.latencies)
        print(f"4 x {len(body) >> 10} KB gzip ({59} MB JSON) to {path}: {sorted(answers)}; health stall "
              f"{longest:.3f} s")
        assert len(answers) == 4, answers
        if "/load" not in path:  # (a load's other parameters are ignored, as the Core ignores them: it loads)
            assert all(400 <= status < 600 for status in answers), answers
        assert longest < stall_bound(), (longest, os.getloadavg())
        assert_good_infer(proc.http_port)


def test_queued_json_uploads_leave_room_for_a_small_one(demo_repo: Path) -> None:
    """10 gzip uploads of 59 MB of JSON at once, then a 3 MB JSON request: answered within 2 s, RSS < +300 MB."""
    body = json_bomb(b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [', 59 * MIB,
                     b"]}]}")
    data = np.random.default_rng(5).random((1, 3, 224, 224), dtype=np.float32)
    legit = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(data.shape),
                                      "data": data.reshape(-1).tolist()}]}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(legit) > 2 * MIB  # parsed in the JSON pool too
    with ServerProcess(demo_repo, http=True) as proc:
        post(proc.http_port, "/v2/models/nope/infer", b'{"inputs": [' + b"0," * (2 * MIB) + b"0]}")  # workers up
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        answers: list[int] = []
        uploads = [threading.Thread(target=lambda: answers.append(
            post(proc.http_port, "/v2/models/image_identity/infer", body, {"Content-Encoding": "gzip"})[0]))
            for _ in range(10)]
        with RssSampler(proc.proc.pid) as peak:  # type: ignore[union-attr]
            for upload in uploads:
                upload.start()
            time.sleep(0.3)
            began = time.monotonic()
            status, answer = post(proc.http_port, "/v2/models/image_identity/infer", legit)
            took = time.monotonic() - began
            for upload in uploads:
                upload.join(240)
        grew = (peak.peak - before) >> 20
        print(f"10 queued 59 MB JSON uploads: {sorted(answers)}; the 3 MB request answered in {took:.3f} s; "
              f"RSS +{grew} MiB")
        assert status == 200, answer
        assert np.allclose(np.asarray(answer["outputs"][0]["data"], dtype=np.float32), data.reshape(-1))
        assert took < 2.0, took
        assert grew < 300, grew
        assert 503 in answers, answers  # the queue answered instead of holding them all
        assert_good_infer(proc.http_port)


def test_a_load_in_mode_none_is_refused_before_its_body_is_read(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, http=True) as proc:
        conn = http.client.HTTPConnection("127.0.0.1", proc.http_port, timeout=10)
        conn.putrequest("POST", "/v2/repository/models/simple/load")
        conn.putheader("Content-Length", str(60 * MIB))
        conn.endheaders()
        conn.send(b'{"parameters": {')  # and nothing more: the answer must not wait for the rest
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        assert response.status == 503 and "model control mode 'none'" in answer["error"], answer
        assert_good_infer(proc.http_port)

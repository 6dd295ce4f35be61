"""ModelStreamInfer holds a bounded number of request bytes, and a decoupled model a bounded number of responses
(issue 27, native frontend; server/grpc/limits.py RequestBudget and the queued-response bound).

Before: stream messages received but not yet answered (queued in the Core behind a slow model) were bounded only
by the 2 GiB message limit, each; a client could pile gigabytes into one stream.  Now a stream may hold
--grpc-max-stream-request-bytes and the server --grpc-max-queued-request-bytes; past either, the stream ends with
RESOURCE_EXHAUSTED and its queued requests are cancelled.  A decoupled model producing into a zero window is
bounded by --grpc-max-queued-response-bytes like any response.  Each case ends with a good request on a new
connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from h2.settings import SettingCodes

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from h2raw import SERVICE, RawGrpcConnection, assert_good_request_on_new_connection, grpc_frame
from memory import RssSampler, rss_bytes
from python_models import COUNTER, COUNTER_CONFIG, write_python_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)
STREAM = SERVICE + "ModelStreamInfer"
RESOURCE_EXHAUSTED = 8
ENHANCE_YOUR_CALM = 0xB
MIB = 1024 * 1024

SLOW = """
    import time
    import fastoip

    class Slow(fastoip.Model):
        def predict(self, inputs):
            time.sleep(3)
            return {"OUTPUT0": inputs["INPUT0"][:1]}
"""

SLOW_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastoip.demo import write_repository

    root = write_repository(tmp_path_factory.mktemp("stream-budget"))
    write_python_model(root, "slow", SLOW, SLOW_CONFIG)
    write_python_model(root, "counter", COUNTER, COUNTER_CONFIG)
    return root


def slow_message(index: int) -> bytes:
    data = np.full(MIB // 4, float(index), dtype=np.float32)  # 1 MiB of tensor
    request = InferRequest("slow", id=f"r{index}", inputs=[InferInput("INPUT0", "FP32", [data.size], data)])
    return grpc_frame(_codec.encode_infer_request(request))


def send_messages(conn: RawGrpcConnection, stream_id: int, count: int) -> None:
    for index in range(count):
        conn.send_data(stream_id, slow_message(index), end_stream=False)
        if conn.results[stream_id].finished:
            return


@pytest.fixture()
def servers(repository: Path, native_frontend: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ServerProcess(repository, "--grpc-max-stream-request-bytes", str(3 * MIB + 4096),
                       grpc_frontend=native_frontend) as per_stream, \
         ServerProcess(repository, "--grpc-max-queued-request-bytes", str(3 * MIB + 4096),
                       grpc_frontend=native_frontend) as server_wide:
        yield per_stream, server_wide


def test_a_stream_holds_a_bounded_number_of_request_bytes(servers: tuple[ServerProcess, ServerProcess]) -> None:
    per_stream, _ = servers
    with RawGrpcConnection(per_stream.grpc_port, timeout=10.0) as conn:
        conn.handshake()
        stream_id = conn.start_call(STREAM)
        send_messages(conn, stream_id, 8)  # the slow model answers one every 3 s: they wait in its queue
        result = conn.wait(stream_id, 20.0)
    assert result.status == RESOURCE_EXHAUSTED, (result.status, result.message, result.reset_code)
    assert "--grpc-max-stream-request-bytes" in result.message, result.message
    assert_good_request_on_new_connection(per_stream.grpc_port)


def test_the_server_holds_a_bounded_number_of_stream_request_bytes(
        servers: tuple[ServerProcess, ServerProcess]) -> None:
    _, server_wide = servers
    with RawGrpcConnection(server_wide.grpc_port) as first, RawGrpcConnection(server_wide.grpc_port) as second:
        first.handshake()
        second.handshake()
        one = first.start_call(STREAM)
        send_messages(first, one, 2)  # 2 MiB held
        time.sleep(0.3)
        two = second.start_call(STREAM)
        send_messages(second, two, 3)  # its first is always taken (3 MiB in all); its second is over
        result = second.wait(two, 20.0)
        assert result.status == RESOURCE_EXHAUSTED, (result.status, result.message, result.reset_code)
        assert "--grpc-max-queued-request-bytes" in result.message, result.message
        first.drain(0.3)
        assert not first.results[one].finished, "the stream within the budget was ended too"
    assert_good_request_on_new_connection(server_wide.grpc_port)


def test_a_decoupled_model_producing_into_a_zero_window_is_bounded(repository: Path, native_frontend: str) -> None:
    limit = 2 * MIB
    with ServerProcess(repository, "--grpc-max-queued-response-bytes", str(limit),
                       grpc_frontend=native_frontend) as proc:
        count = np.array([50_000_000], dtype=np.int32)  # far more responses than the limit holds
        request = InferRequest("counter", id="many", inputs=[InferInput("COUNT", "INT32", [1], count)])
        before = rss_bytes(proc.proc.pid)  # type: ignore[union-attr]
        with RssSampler(proc.proc.pid) as peak:  # type: ignore[union-attr]
            conn = RawGrpcConnection(proc.grpc_port)
            conn.conn.initiate_connection()
            # its own SETTINGS frame: h2 sends settings given before initiate_connection only once acknowledged
            conn.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})  # no response DATA can leave
            conn.flush()
            stream_id = conn.start_call(STREAM)
            conn.send_data(stream_id, grpc_frame(_codec.encode_infer_request(request)), end_stream=False)
            deadline = time.monotonic() + 60
            while not conn.results[stream_id].finished and time.monotonic() < deadline:
                conn.receive_once(deadline)
            result = conn.results[stream_id]
            conn.close()
        grew = peak.peak - before
        print(f"decoupled responses into a zero window, limit {limit >> 20} MiB: reset {result.reset_code}, "
              f"status {result.status}; RSS +{grew >> 20} MiB")
        assert result.reset_code == ENHANCE_YOUR_CALM or result.status == RESOURCE_EXHAUSTED, result
        assert grew < 256 * MIB, grew
        assert_good_request_on_new_connection(proc.grpc_port)

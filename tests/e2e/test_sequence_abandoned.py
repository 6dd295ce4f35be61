"""Abandoned sequences over a real server (issue 27): a client that starts 2,000 sequences on a ModelStreamInfer
stream and goes away must not keep new sequences waiting (before: each held the model's slot for the idle
timeout in turn, 42 minutes for 2,000 at Triton's default 1 s; here the idle timeout is 5 s)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from h2raw import SERVICE, RawGrpcConnection, grpc_frame
from models import IMPLICIT_STATE_SEQUENCE_CONFIG, implicit_state_sequence_model_bytes
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)
IDLE_S = 5.0
ONE_SLOT = IMPLICIT_STATE_SEQUENCE_CONFIG.replace("max_batch_size: 4", "max_batch_size: 1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, grpc_frontend: str) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("abandoned")
    (root / "seq" / "1").mkdir(parents=True)
    (root / "seq" / "1" / "model.onnx").write_bytes(implicit_state_sequence_model_bytes())
    (root / "seq" / "config.pbtxt").write_text(ONE_SLOT)
    with ServerProcess(root, grpc_frontend=grpc_frontend) as proc:
        yield proc


def start_request(corrid: int) -> bytes:
    data = np.array([[1]], dtype=np.int32)
    request = InferRequest("seq", parameters={"sequence_id": corrid, "sequence_start": True},
                           inputs=[InferInput("INPUT", "INT32", data.shape, data)])
    return grpc_frame(_codec.encode_infer_request(request))


def test_a_fresh_sequence_is_served_soon_after_2000_abandoned_ones(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(SERVICE + "ModelStreamInfer")
        conn.send_data(stream_id, b"".join(start_request(1_000 + i) for i in range(2000)), end_stream=False)
        conn.drain(0.5)  # the first START runs; the rest wait for the one slot
    # the connection is gone: its stream's requests are cancelled
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[5]], dtype=np.int32))
    began = time.monotonic()
    result = client.infer("seq", [inp], sequence_id=42, sequence_start=True, client_timeout=60)
    took = time.monotonic() - began
    print(f"fresh sequence served {took:.2f} s after 2,000 abandoned ones (idle timeout {IDLE_S} s)")
    assert result.as_numpy("OUTPUT").tolist() == [[5]]
    assert took < IDLE_S + 2.0, took  # at worst the one START that ran idles out

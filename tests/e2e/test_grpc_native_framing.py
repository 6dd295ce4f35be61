"""gRPC messages cut across DATA frames anywhere (inside the 5-byte prefix too) arrive whole on the native frontend.

The native frontend allocates a message's buffer from its length prefix and copies pieces into it; these cuts
(every byte, prime-sized pieces, several messages in one frame, a message and the next one's prefix in one
frame) must give the same answers as whole messages.  (Large responses, sent without copies, are checked
byte-exact by the 64 MB message test in test_grpc_clients.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastoip import _codec
from h2raw import MODEL_INFER, SERVICE, RawGrpcConnection, grpc_frame, simple_request_bytes
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, grpc_frontend="native") as proc:
        yield proc


def answer_ids(messages: list[bytes]) -> list[str]:
    ids = []
    for raw in messages:
        response = _codec.decode_infer_response(raw)
        by_name = {output.name: np.asarray(output.data) for output in response.outputs}
        assert by_name["OUTPUT0"].reshape(-1).tolist() == [i + 3 for i in range(16)]
        ids.append(response.id)
    return ids


@pytest.mark.parametrize("piece", [1, 3, 7, 64], ids=lambda n: f"pieces-of-{n}")
def test_stream_messages_cut_anywhere(server: ServerProcess, piece: int) -> None:
    body = b"".join(grpc_frame(simple_request_bytes(f"r{i}")) for i in range(3))
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(SERVICE + "ModelStreamInfer")
        for start in range(0, len(body), piece):
            conn.send_data(stream, body[start : start + piece], end_stream=False)
        conn.send_data(stream, b"", end_stream=True)
        result = conn.wait(stream, 30.0)
    assert result.status == 0, result
    assert sorted(answer_ids([_stream_infer_response(m) for m in result.messages])) == ["r0", "r1", "r2"]


def _stream_infer_response(message: bytes) -> bytes:
    """The ModelInferResponse inside a ModelStreamInferResponse (field 2, length-delimited)."""
    assert message[0] == 0x12, message[:8]
    length, shift, i = 0, 0, 1
    while True:
        byte = message[i]
        length |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            break
    return message[i : i + length]


def test_unary_prefix_split_from_its_message(server: ServerProcess) -> None:
    framed = grpc_frame(simple_request_bytes())
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(MODEL_INFER)
        conn.send_data(stream, framed[:2], end_stream=False)
        conn.send_data(stream, framed[2:5], end_stream=False)
        conn.send_data(stream, framed[5:], end_stream=True)
        result = conn.wait(stream, 30.0)
    assert result.status == 0, result
    assert answer_ids(result.messages) == ["good"]

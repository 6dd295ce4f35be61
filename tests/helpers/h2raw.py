"""A small raw HTTP/2 gRPC client on a plain socket, for byte-level and protocol-abuse tests.

The ``h2`` library does the framing, HPACK and flow control of the valid parts; abuse tests write
hand-made frames (``hyperframe``) onto the same socket where the protocol must be broken on purpose.
Every connection is new, so "a good request after" really opens a fresh TCP connection.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass, field

import numpy as np
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    PingReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import FlowControlError, ProtocolError, StreamClosedError
from hyperframe.frame import PingFrame

from fastoip import _codec
from fastoip.types import InferInput, InferRequest
from sockets import closed_within

SERVICE = "/inference.GRPCInferenceService/"
MODEL_INFER = SERVICE + "ModelInfer"
PING_TYPE = 0x6


def grpc_frame(payload: bytes, *, compressed: bool = False, declared_length: int | None = None) -> bytes:
    """The 5-byte gRPC message prefix (compressed flag, big-endian length) and the message."""
    length = len(payload) if declared_length is None else declared_length
    return struct.pack(">BI", 1 if compressed else 0, length) + payload


def split_messages(data: bytes) -> list[bytes]:
    """Length-prefixed gRPC messages out of a stream's DATA bytes (a short tail is kept as-is, to be seen)."""
    messages, offset = [], 0
    while offset + 5 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset + 1)
        messages.append(data[offset + 5 : offset + 5 + length])
        offset += 5 + length
    if offset < len(data):
        messages.append(data[offset:])
    return messages


@dataclass
class CallResult:
    """How one stream ended, as seen on the wire."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    ended: bool = False
    reset_code: int | None = None
    connection_closed: bool = False

    @property
    def status(self) -> int | None:
        """grpc-status from the trailers, or from the headers of a Trailers-Only response."""
        raw = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if raw is None else int(raw)

    @property
    def message(self) -> str:
        raw = self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))
        return urllib.parse.unquote(raw)

    @property
    def messages(self) -> list[bytes]:
        return split_messages(self.data)

    @property
    def finished(self) -> bool:
        """The stream ended one way or another: trailers, a reset, or the connection went away."""
        return self.ended or self.reset_code is not None or self.connection_closed


def _text(headers: list) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in headers
    }


class RawGrpcConnection:
    """One TCP connection speaking h2c with prior knowledge, driven by hand."""

    def __init__(self, port: int, *, timeout: float = 10.0, settings: dict | None = None,
                 source: str | None = None) -> None:
        self.port = port
        # source: another loopback address (127.0.0.2, ...) for a client the server must tell from 127.0.0.1
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        if settings:
            self.conn.local_settings.update(settings)
        self.results: dict[int, CallResult] = {}
        self.ping_acks = 0
        self.pings_received = 0
        self.goaway: ConnectionTerminated | None = None
        self.closed = False
        self._pending = bytearray()

    def __enter__(self) -> RawGrpcConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- sending ---------------------------------------------------------------------------------
    def handshake(self) -> RawGrpcConnection:
        self.conn.initiate_connection()
        # A large connection window so responses (up to a 64 MB message) are never held back by us.
        self.conn.increment_flow_control_window(2**31 - 1 - 65535)
        self.flush()
        return self

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def start_call(self, method: str = MODEL_INFER, *, timeout: str | None = None, extra: tuple = ()) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", f"127.0.0.1:{self.port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if timeout is not None:
            headers.append(("grpc-timeout", timeout))
        headers.extend(extra)
        self.conn.send_headers(stream_id, headers)
        self.results[stream_id] = CallResult()
        self.flush()
        return stream_id

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = True, deadline_s: float = 60.0) -> None:
        """DATA within the peer's flow-control windows, reading (and so receiving WINDOW_UPDATEs) as needed."""
        deadline = time.monotonic() + deadline_s
        view = memoryview(data)
        result = self.results.get(stream_id)
        while len(view):
            if result is not None and result.finished:
                return  # the server already answered (an error) or reset the stream: the rest is not wanted
            window = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if window <= 0:
                if time.monotonic() > deadline or not self.receive_once():
                    raise TimeoutError("the server never opened its flow-control window")
                continue
            chunk = view[:window]
            view = view[window:]
            self.conn.send_data(stream_id, chunk.tobytes(), end_stream=end_stream and not len(view))
            self.flush()
        if end_stream and not data:
            self.conn.end_stream(stream_id)
            self.flush()

    def unary(self, method: str, payload: bytes, *, timeout: str | None = None, wait_s: float = 60.0) -> CallResult:
        stream_id = self.start_call(method, timeout=timeout)
        self.send_data(stream_id, grpc_frame(payload))
        return self.wait(stream_id, wait_s)

    # -- receiving -------------------------------------------------------------------------------
    def receive_once(self, deadline: float | None = None) -> bool:
        """Read what the server sent and handle it; False when the connection is closed.

        With a ``deadline`` (time.monotonic()), the read waits no longer than until then.
        """
        timeout = self.sock.gettimeout()
        if deadline is not None:
            self.sock.settimeout(max(0.01, min(timeout or 10.0, deadline - time.monotonic())))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return True
        except OSError:
            data = b""
        finally:
            if deadline is not None:
                self.sock.settimeout(timeout)
        if not data:
            self._mark_closed()
            return False
        self._pending += data
        for frame in self._complete_frames():
            if not self._receive_frame(frame):
                return False
        try:
            self.flush()
        except OSError:
            pass
        return True

    def _complete_frames(self) -> list[bytes]:
        """Whole frames out of what arrived (h2 is fed one frame at a time, see _receive_frame)."""
        frames = []
        while len(self._pending) >= 9:
            length = int.from_bytes(self._pending[:3], "big")
            if len(self._pending) < 9 + length:
                break
            frames.append(bytes(self._pending[: 9 + length]))
            del self._pending[: 9 + length]
        return frames

    def _receive_frame(self, frame: bytes) -> bool:
        if self.goaway is not None and frame[3] == PING_TYPE and not frame[4] & 0x1:
            # After a GOAWAY, h2 refuses every frame, but a server draining gracefully (grpcio) sends a PING and
            # waits for its ACK before it closes: answer it by hand.
            self.sock.sendall(PingFrame(0, opaque_data=frame[9:17], flags=["ACK"]).serialize())
            return True
        try:
            events = self.conn.receive_data(frame)
        except ProtocolError:
            if self.goaway is not None:
                return True  # frames after GOAWAY that h2 will not take: the stream results are final
            self._mark_closed()
            return False
        for event in events:
            self._handle(event)
        return True

    def _mark_closed(self) -> None:
        self.closed = True
        for result in self.results.values():
            result.connection_closed = True

    def _handle(self, event: object) -> None:
        stream_id = getattr(event, "stream_id", None)
        result = self.results.get(stream_id) if stream_id is not None else None
        if isinstance(event, ResponseReceived) and result is not None:
            result.headers = _text(event.headers)
        elif isinstance(event, TrailersReceived) and result is not None:
            result.trailers = _text(event.headers)
        elif isinstance(event, DataReceived):
            if result is not None:
                result.data += event.data
            try:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            except (StreamClosedError, FlowControlError, ProtocolError):
                pass
        elif isinstance(event, StreamEnded) and result is not None:
            result.ended = True
        elif isinstance(event, StreamReset) and result is not None:
            result.reset_code = int(event.error_code)
        elif isinstance(event, PingAckReceived):
            self.ping_acks += 1
        elif isinstance(event, PingReceived):
            self.pings_received += 1  # h2 queues the ACK; receive_once flushes it
        elif isinstance(event, ConnectionTerminated):
            self.goaway = event

    def wait(self, stream_id: int, wait_s: float = 60.0) -> CallResult:
        """Until the stream ends (or the connection goes), at most ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        result = self.results[stream_id]
        while not result.finished and time.monotonic() < deadline:
            if not self.receive_once(deadline):
                break
        return result

    def drain(self, wait_s: float) -> None:
        """Read and handle whatever arrives for ``wait_s`` seconds or until the connection closes."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self.closed:
            self.receive_once(deadline)

    def wait_closed(self, wait_s: float) -> bool:
        return closed_within(self.sock, wait_s)


def simple_request_bytes(request_id: str = "good") -> bytes:
    """A valid ModelInfer for the demo ``simple`` model (INPUT0 + INPUT1, INT32 [1, 16])."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [InferInput("INPUT0", "INT32", a.shape, a), InferInput("INPUT1", "INT32", b.shape, b)]
    request = InferRequest("simple", id=request_id, inputs=inputs)
    return _codec.encode_infer_request(request)


def assert_good_request_on_new_connection(port: int, wait_s: float = 30.0) -> None:
    """A fresh connection, a valid ModelInfer: status OK and the right sums."""
    with RawGrpcConnection(port, timeout=5.0) as fresh:
        fresh.handshake()
        result = fresh.unary(MODEL_INFER, simple_request_bytes(), wait_s=wait_s)
    assert result.status == 0, (result.status, result.message, result.reset_code, result.connection_closed)
    (message,) = result.messages
    response = _codec.decode_infer_response(message)
    assert response.id == "good"
    by_name = {output.name: np.asarray(output.data) for output in response.outputs}
    assert by_name["OUTPUT0"].reshape(-1).tolist() == [i + 3 for i in range(16)]

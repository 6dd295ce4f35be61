"""The native frontend's calls, head checks and timers in memory: no socket, no HTTP/2.

A ``Call`` answers through a Responder (three methods); here that is a recorder, and the Core is a real one
in-process on the demo repository, so these tests read exactly what a connection would be asked to send.
"""

from __future__ import annotations

import asyncio
import struct
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fastoip import _codec  # noqa: E402
from fastoip._proto import grpc_service_pb2 as pb  # noqa: E402
from fastoip.core import Core  # noqa: E402
from fastoip.demo import write_repository  # noqa: E402
from fastoip.scheduling.job import RELEASE_MIN_BYTES  # noqa: E402
from fastoip.server.grpc import protocol as wire  # noqa: E402
from fastoip.server.grpc.limits import ServerLimits  # noqa: E402
from fastoip.server.grpc.native_calls import (  # noqa: E402
    Call,
    Dispatcher,
    InferCall,
    StreamInferCall,
    UnaryCall,
    deadline_from,
)
from fastoip.server.grpc.native_head import NOT_GRPC, NOT_POST, AcceptedHead, read_head  # noqa: E402
from fastoip.server.grpc.native_options import NativeGrpcOptions  # noqa: E402
from fastoip.server.grpc.native_timers import ConnectionTimers  # noqa: E402
from fastoip.server.restricted import parse_restrictions  # noqa: E402
from fastoip.types import InferInput, InferRequest  # noqa: E402
from harness import DIRECT_SIMPLE, core_on  # noqa: E402

SERVICE = "/inference.GRPCInferenceService/"


class Recorder:
    """A Responder that writes down what the call asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, ...]] = []

    def send_headers(self, stream_id: int) -> None:
        self.sent.append(("headers", stream_id))

    def send_message(self, stream_id: int, message: bytes) -> None:
        self.sent.append(("message", stream_id, message))

    def finish(self, stream_id: int, code: int, message: str = "") -> None:
        self.sent.append(("finish", stream_id, code, message))

    def answer(self, stream_id: int, message: bytes) -> None:
        self.send_headers(stream_id)
        self.send_message(stream_id, message)
        self.finish(stream_id, 0)

    @property
    def finished(self) -> bool:
        return bool(self.sent) and self.sent[-1][0] == "finish"

    @property
    def messages(self) -> list[bytes]:
        return [entry[2] for entry in self.sent if entry[0] == "message"]  # type: ignore[misc]


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    root = write_repository(tmp_path_factory.mktemp("repo"), ["simple", "image_identity"])
    (root / "simple" / "config.pbtxt").write_text(DIRECT_SIMPLE)
    with core_on(root) as running:
        yield running


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture()
def dispatcher(core: Core, loop: asyncio.AbstractEventLoop) -> Iterator[Dispatcher]:
    with ThreadPoolExecutor(2) as executor:
        yield Dispatcher(core, loop, executor)


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Run the loop (where completions come back) until ``done()`` or the timeout."""

    async def wait() -> None:
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                raise AssertionError("timed out")
            await asyncio.sleep(0.002)

    loop.run_until_complete(wait())


def simple_bytes(model: str = "simple", request_id: str = "r") -> bytes:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    request = InferRequest(model, id=request_id, inputs=[InferInput("INPUT0", "INT32", a.shape, a),
                                                         InferInput("INPUT1", "INT32", b.shape, b)])
    return _codec.encode_infer_request(request)


def new_call(dispatcher: Dispatcher, method: str, out: Recorder, stream_id: int = 1) -> Call:
    call = dispatcher.new_call(f"{SERVICE}{method}".encode(), stream_id, out, 0)
    assert call is not None
    return call


# -- ModelInfer ----------------------------------------------------------------------------------

def test_model_infer_answers_headers_one_message_and_ok(
    dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop
) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelInfer", out, stream_id=7)
    assert isinstance(call, InferCall)
    call.on_message(simple_bytes(request_id="seven"))
    call.on_end()
    run_until(loop, lambda: out.finished)
    assert [entry[0] for entry in out.sent] == ["headers", "message", "finish"]
    assert out.sent[-1] == ("finish", 7, wire.OK, "")
    response = _codec.decode_infer_response(out.messages[0])
    assert response.id == "seven"
    outputs = {output.name: np.asarray(output.data).reshape(-1).tolist() for output in response.outputs}
    assert outputs["OUTPUT0"] == [i + 3 for i in range(16)]
    assert call.finished and call.headers_sent


@pytest.mark.parametrize("count", [0, 2])
def test_a_unary_call_takes_exactly_one_message(dispatcher: Dispatcher, count: int) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelInfer", out)
    for _ in range(count):
        call.on_message(simple_bytes())
    call.on_end()
    assert out.sent == [("finish", 1, wire.INTERNAL, f"a unary call takes one request message, received {count}")]


def test_a_malformed_request_is_invalid_argument(dispatcher: Dispatcher) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelInfer", out)
    call.on_message(b"\x0a\xff")  # a string field whose length runs past the end
    call.on_end()
    ((kind, stream_id, code, _message),) = out.sent
    assert (kind, stream_id, code) == ("finish", 1, wire.INVALID_ARGUMENT)


def test_an_unknown_model_is_answered_with_the_core_status(dispatcher: Dispatcher) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelInfer", out)
    call.on_message(simple_bytes(model="nope"))
    call.on_end()
    ((kind, _, code, message),) = out.sent
    assert kind == "finish" and code == wire.status_code("NOT_FOUND") and "nope" in message


def test_a_cancelled_call_never_answers(dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelInfer", out)
    assert isinstance(call, InferCall)
    call.on_message(simple_bytes())
    call.on_end()
    call.cancel()  # the client reset the stream: the answer, if any, is the connection's
    run_until(loop, lambda: call.job is None)  # the job came back (done or cancelled) and was ignored
    assert out.sent == [] and call.finished
    call.fail(wire.INTERNAL, "late")
    assert out.sent == []  # a finished call answers nothing more


# -- ModelStreamInfer ----------------------------------------------------------------------------

def test_stream_infer_answers_each_request_and_ends_ok_after_the_half_close(
    dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop
) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelStreamInfer", out, stream_id=3)
    assert isinstance(call, StreamInferCall) and call.streaming
    call.on_message(simple_bytes(request_id="a"))
    call.on_message(simple_bytes(model="nope", request_id="b"))  # an error is that request's answer
    call.on_message(simple_bytes(request_id="c"))
    call.on_end()
    run_until(loop, lambda: out.finished)
    assert out.sent[0] == ("headers", 3) and out.sent[-1] == ("finish", 3, wire.OK, "")
    answers = [pb.ModelStreamInferResponse.FromString(message) for message in out.messages]
    assert sorted(a.infer_response.id for a in answers) == ["a", "b", "c"]
    (failed,) = [a for a in answers if a.error_message]
    assert failed.infer_response.id == "b" and "nope" in failed.error_message


def test_stream_infer_stays_open_until_the_client_half_closes(
    dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop
) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelStreamInfer", out)
    call.on_message(simple_bytes())
    run_until(loop, lambda: len(out.messages) == 1)
    assert not out.finished and not call.finished
    call.on_end()
    assert out.sent[-1] == ("finish", 1, wire.OK, "")


def test_a_stream_half_closed_without_requests_ends_ok_at_once(dispatcher: Dispatcher) -> None:
    out = Recorder()
    new_call(dispatcher, "ModelStreamInfer", out).on_end()
    assert out.sent == [("headers", 1), ("finish", 1, wire.OK, "")]


# -- other RPCs ----------------------------------------------------------------------------------

def test_an_inline_rpc_answers_on_the_spot(dispatcher: Dispatcher) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ServerLive", out)
    assert isinstance(call, UnaryCall) and call.inline
    call.on_message(pb.ServerLiveRequest().SerializeToString())
    call.on_end()
    assert out.sent == [("headers", 1), ("message", 1, pb.ServerLiveResponse(live=True).SerializeToString()),
                        ("finish", 1, wire.OK, "")]


def test_a_pool_rpc_answers_from_the_pool_on_the_loop(dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> None:
    out = Recorder()
    call = new_call(dispatcher, "SystemSharedMemoryStatus", out)
    assert isinstance(call, UnaryCall) and not call.inline
    call.on_message(pb.SystemSharedMemoryStatusRequest().SerializeToString())
    call.on_end()
    run_until(loop, lambda: out.finished)
    assert out.sent[-1] == ("finish", 1, wire.OK, "")
    assert pb.SystemSharedMemoryStatusResponse.FromString(out.messages[0]).regions == {}


def test_a_malformed_protobuf_is_invalid_argument(dispatcher: Dispatcher) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelReady", out)
    call.on_message(b"\x0a\x05ab")  # name: 5 bytes announced, 2 present
    call.on_end()
    ((kind, _, code, message),) = out.sent
    assert (kind, code) == ("finish", wire.INVALID_ARGUMENT) and "ModelReadyRequest" in message


def test_an_rpc_error_carries_its_status(dispatcher: Dispatcher) -> None:
    out = Recorder()
    call = new_call(dispatcher, "ModelMetadata", out)
    call.on_message(pb.ModelMetadataRequest(name="nope").SerializeToString())
    call.on_end()
    ((kind, _, code, message),) = out.sent
    assert (kind, code) == ("finish", wire.status_code("NOT_FOUND")) and "nope" in message


def test_paths_that_are_not_rpcs_get_no_call(dispatcher: Dispatcher) -> None:
    assert dispatcher.new_call(b"/inference.GRPCInferenceService/Nope", 1, Recorder(), 0) is None
    assert dispatcher.new_call(b"/", 1, Recorder(), 0) is None
    assert dispatcher.new_call(b"/grpc.health.v1.Health/Check", 1, Recorder(), 0) is not None


def test_deadline_from_a_timeout() -> None:
    assert deadline_from(None) == 0
    before = time.monotonic_ns()
    assert before + 10**9 <= deadline_from(10**9) <= time.monotonic_ns() + 10**9


# -- head checks (native_head.read_head: a pure function) ---------------------------------------

HEAD = [(b":method", b"POST"), (b":path", f"{SERVICE}ModelInfer".encode()), (b"content-type", b"application/grpc")]


def test_a_good_head_is_accepted_with_its_timeout_and_encoding() -> None:
    head = read_head(HEAD + [(b"grpc-timeout", b"250m"), (b"grpc-encoding", b"gzip")], {})
    assert head == AcceptedHead(dict(HEAD + [(b"grpc-timeout", b"250m"), (b"grpc-encoding", b"gzip")]),
                                f"{SERVICE}ModelInfer".encode(), 250 * 10**6, b"gzip")
    plain = read_head(HEAD, {})
    assert isinstance(plain, AcceptedHead) and plain.timeout_ns is None and plain.encoding == b"identity"
    for content_type in (b"application/grpc+proto", b"application/grpc;charset=utf-8"):
        assert isinstance(read_head(HEAD[:2] + [(b"content-type", content_type)], {}), AcceptedHead)


def test_heads_refused_in_the_order_a_client_sees() -> None:
    assert read_head([(b":method", b"GET")] + HEAD[1:], {}) == NOT_POST
    assert read_head(HEAD[:2] + [(b"content-type", b"application/json")], {}) == NOT_GRPC
    assert read_head(HEAD[:2], {}) == NOT_GRPC  # no content-type at all
    assert read_head([(b":method", b"GET")] + HEAD[1:2], {}) == NOT_POST  # the method is checked first
    bad_timeout = read_head(HEAD + [(b"grpc-timeout", b"soon")], {})
    assert bad_timeout == wire.trailers_only(wire.INVALID_ARGUMENT, "malformed grpc-timeout b'soon'")


def test_a_restricted_rpc_needs_its_header(core: Core, loop: asyncio.AbstractEventLoop) -> None:
    restricted = parse_restrictions(["inference:admin-key=secret"], "--grpc-restricted-protocol", "protocol")
    with ThreadPoolExecutor(1) as executor:
        table = Dispatcher(core, loop, executor, restricted).restricted
    refused = read_head(HEAD, table)
    assert not isinstance(refused, AcceptedHead)
    assert dict(refused)[b"grpc-status"] == str(wire.UNAVAILABLE).encode()
    assert isinstance(read_head(HEAD + [(b"admin-key", b"secret")], table), AcceptedHead)
    health = [HEAD[0], (b":path", b"/grpc.health.v1.Health/Check"), HEAD[2]]
    assert isinstance(read_head(health, table), AcceptedHead)  # another group: open


# -- timers (native_timers.ConnectionTimers against a recording owner) --------------------------

class TimerLog:
    """A TimerOwner that writes down what the timers asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[object, ...]] = []

    def ping(self) -> None:
        self.asked.append(("ping",))

    def close(self) -> None:
        self.asked.append(("close",))

    def drain(self) -> None:
        self.asked.append(("drain",))

    def final_goaway(self) -> None:
        self.asked.append(("final goaway",))

    def sweep_idle_streams(self, limit_s: float) -> None:
        self.asked.append(("sweep", limit_s))

    def on_deadline(self, stream_id: int) -> None:
        self.asked.append(("deadline", stream_id))

    def has_calls(self) -> bool:
        return self.busy

    busy = False


def test_keepalive_pings_an_idle_connection_and_closes_it_without_an_ack(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=20, keepalive_timeout_ms=40,
                                                      stream_idle_timeout_ms=0), owner)
    timers.start()
    run_until(loop, lambda: ("close",) in owner.asked)
    assert owner.asked[:2] == [("ping",), ("close",)]
    timers.cancel()


def test_a_ping_ack_keeps_the_connection(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    # (keepalive 100 ms, bytes every 5 ms for ~3 periods: only a loop stalled for 100 ms, not a busy test
    # machine's few ms, would see the connection idle)
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=100, keepalive_timeout_ms=300,
                                                      stream_idle_timeout_ms=0), owner)
    timers.start()
    run_until(loop, lambda: ("ping",) in owner.asked)
    timers.bytes_received(17)  # the ACK arrives as bytes
    timers.ping_acknowledged()
    assert timers.ping_wait is None

    async def busy() -> None:  # a connection with traffic is never idle: no PING, no close
        for _ in range(60):
            timers.bytes_received(9)
            await asyncio.sleep(0.005)

    loop.run_until_complete(busy())
    assert owner.asked == [("ping",)]
    timers.cancel()


def test_max_age_drains_then_closes_after_the_grace(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=0, max_connection_age_ms=20,
                                                      max_connection_age_grace_ms=20, stream_idle_timeout_ms=0),
                              owner)
    timers.start()
    run_until(loop, lambda: ("close",) in owner.asked)
    assert owner.asked == [("drain",), ("close",)]


def test_the_drain_waits_for_its_ping_or_gives_up(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=0, stream_idle_timeout_ms=0), owner)
    timers.wait_for_drain_ping()
    timers.ping_acknowledged()
    assert owner.asked == [("final goaway",)]
    timers.goaway_wait = None
    timers.wait_for_drain_ping()
    assert timers.goaway_wait is not None
    timers.goaway_wait.cancel()
    timers.on_drain_ping_timeout()
    assert owner.asked == [("final goaway",), ("final goaway",)]


def test_idle_sweeps_and_deadlines_call_the_owner_and_stop_when_cancelled(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=0, stream_idle_timeout_ms=40), owner)
    timers.start()
    timers.deadline(5, 10**7)
    run_until(loop, lambda: ("sweep", 0.04) in owner.asked and ("deadline", 5) in owner.asked)
    timers.cancel()
    seen = len(owner.asked)
    loop.run_until_complete(asyncio.sleep(0.05))
    assert len(owner.asked) == seen


def test_a_silent_client_is_closed_after_the_handshake_timeout(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    quiet = NativeGrpcOptions(keepalive_time_ms=0, stream_idle_timeout_ms=0)
    timers = ConnectionTimers(loop, quiet, owner, ServerLimits(10, 0, 0.02))
    timers.start()
    run_until(loop, lambda: ("close",) in owner.asked)
    talking = TimerLog()
    timers = ConnectionTimers(loop, quiet, talking, ServerLimits(10, 0, 0.02))
    timers.start()
    timers.bytes_received(33)  # preface + SETTINGS
    loop.run_until_complete(asyncio.sleep(0.05))
    assert talking.asked == []
    timers.cancel()


def test_a_connection_without_calls_is_drained_after_the_idle_timeout(loop: asyncio.AbstractEventLoop) -> None:
    owner = TimerLog()
    owner.busy = True
    timers = ConnectionTimers(loop, NativeGrpcOptions(keepalive_time_ms=0, stream_idle_timeout_ms=0), owner,
                              ServerLimits(10, 0.02, 0))
    timers.start()
    loop.run_until_complete(asyncio.sleep(0.06))
    assert owner.asked == []  # a call is open: never idle
    owner.busy = False
    timers.call_ended()
    run_until(loop, lambda: ("drain",) in owner.asked)
    timers.cancel()


# -- the connection in memory (GrpcConnection on a fake transport, an h2 client, the Core above) --------

try:
    from fastoip.server.grpc import _http2 as http2
    from fastoip.server.grpc import native_server
except ImportError:  # the native frontend was not built: the calls above are tested all the same
    http2 = native_server = None  # type: ignore[assignment]

from h2.config import H2Configuration  # noqa: E402
from h2.connection import H2Connection  # noqa: E402
from h2.events import DataReceived, ResponseReceived, StreamEnded, StreamReset, TrailersReceived  # noqa: E402

needs_http2 = pytest.mark.skipif(http2 is None, reason="the native gRPC frontend was not built (libnghttp2-dev)")


class MemoryTransport:
    """What the connection writes, kept for the client to read."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.written += chunk

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class MemoryClient:
    """An h2 client wired to a GrpcConnection through memory."""

    def __init__(self, server: native_server.NativeGrpcServer) -> None:
        self.transport = MemoryTransport()
        self.connection = native_server.GrpcConnection(server)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.events: list[object] = []
        self.send()

    def send(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.connection.receive(memoryview(data))
        self.read()

    def read(self) -> None:
        if self.transport.written:
            data, self.transport.written = bytes(self.transport.written), bytearray()
            self.events += self.h2.receive_data(data)
            self.send()

    def call(self, path: str, body: bytes | None, *, method: str = "POST", end: bool = True,
             extra: tuple[tuple[str, str], ...] = ()) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]
        self.h2.send_headers(stream_id, headers, end_stream=body is None and end)
        if body is not None:
            self.h2.send_data(stream_id, struct.pack(">BI", 0, len(body)) + body, end_stream=end)
        self.send()
        return stream_id

    def of(self, stream_id: int) -> list[object]:
        return [e for e in self.events if getattr(e, "stream_id", None) == stream_id]


@pytest.fixture()
def grpc_server(core: Core) -> Iterator[native_server.NativeGrpcServer]:
    server = native_server.NativeGrpcServer(core, "127.0.0.1", 0, NativeGrpcOptions())
    yield server
    server.sock.close()
    server.executor.shutdown(wait=False)
    server.loop.close()


def run_server_loop(server: native_server.NativeGrpcServer, client: MemoryClient, done: Callable[[], bool]) -> None:
    async def wait() -> None:
        end = time.monotonic() + 20
        while not done():
            assert time.monotonic() < end, "timed out"
            await asyncio.sleep(0.002)
            client.read()

    server.loop.run_until_complete(wait())


@needs_http2
def test_every_event_type_of_the_binding_has_a_handler() -> None:
    assert set(native_server.EVENT_HANDLERS) == {
        http2.RequestReceived, http2.MessageReceived, http2.RequestEnded, http2.StreamClosed,
        http2.MessageTooLarge, http2.PingAcknowledged,
    }


@needs_http2
def test_a_model_infer_through_the_connection_in_memory(grpc_server: native_server.NativeGrpcServer) -> None:
    client = MemoryClient(grpc_server)
    stream_id = client.call(f"{SERVICE}ModelInfer", simple_bytes(request_id="mem"))
    run_server_loop(grpc_server, client, lambda: any(isinstance(e, StreamEnded) for e in client.of(stream_id)))
    kinds = [type(e) for e in client.of(stream_id)]
    assert kinds[0] is ResponseReceived and TrailersReceived in kinds and DataReceived in kinds
    (trailers,) = [e for e in client.of(stream_id) if isinstance(e, TrailersReceived)]
    assert dict(trailers.headers)[b"grpc-status"] == b"0"
    body = b"".join(e.data for e in client.of(stream_id) if isinstance(e, DataReceived))
    assert _codec.decode_infer_response(body[5:]).id == "mem"
    assert client.connection.streams == {}  # the record went with the answer


@needs_http2
@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", f"{SERVICE}ModelInfer", b"405"),
    ("POST", f"{SERVICE}NoSuchMethod", b"200"),
])
def test_early_answers_are_followed_by_a_reset(grpc_server: native_server.NativeGrpcServer, method: str,
                                               path: str, status: bytes) -> None:
    client = MemoryClient(grpc_server)
    stream_id = client.call(path, None, method=method, end=False)
    events = client.of(stream_id)
    assert [type(e) for e in events] == [ResponseReceived, StreamEnded, StreamReset]
    assert dict(events[0].headers)[b":status"] == status  # type: ignore[attr-defined]
    assert client.connection.streams == {}


@needs_http2
def test_a_deadline_answers_an_unfinished_request_and_forgets_it(grpc_server: native_server.NativeGrpcServer) -> None:
    client = MemoryClient(grpc_server)
    stream_id = client.call(f"{SERVICE}ModelInfer", None, end=False, extra=(("grpc-timeout", "20m"),))
    assert stream_id in client.connection.streams
    assert client.connection.streams[stream_id].deadline is not None
    run_server_loop(grpc_server, client, lambda: any(isinstance(e, StreamReset) for e in client.of(stream_id)))
    (answer,) = [e for e in client.of(stream_id) if isinstance(e, ResponseReceived)]
    assert dict(answer.headers)[b"grpc-status"] == str(wire.DEADLINE_EXCEEDED).encode()
    assert client.connection.streams == {}


def test_model_infer_frees_a_large_request_message_before_it_sends_the_response(
    dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop
) -> None:
    """The inputs are views on the received message: once the execution ends the Core lets go of inputs of
    RELEASE_MIN_BYTES or more, so a large message's memory is freed before the response is encoded and sent
    (a weak reference, not timing)."""

    class Watching(Recorder):
        def send_message(self, stream_id: int, message: bytes) -> None:
            freed.append(received() is None)
            super().send_message(stream_id, message)

    class Message(bytearray):
        """A received message (the bytearray a large one is gathered in) that takes weak references."""

    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)  # 602 KB
    assert image.nbytes >= RELEASE_MIN_BYTES
    message = Message(_codec.encode_infer_request(InferRequest(
        "image_identity", id="freed", inputs=[InferInput("INPUT0", "FP32", image.shape, image)])))
    received = weakref.ref(message)
    freed: list[bool] = []
    out = Watching()
    call = new_call(dispatcher, "ModelInfer", out)
    call.on_message(message)
    del message
    call.on_end()
    run_until(loop, lambda: out.finished)
    assert out.sent[-1][2] == wire.OK
    sent = out.messages[0]  # (a large response in parts: its output goes out from its array)
    response = _codec.decode_infer_response(b"".join(bytes(part) for part in sent) if type(sent) is list else sent)
    assert response.id == "freed" and np.array_equal(response.outputs[0].data, image)
    assert freed == [True]


@needs_http2
def test_answers_of_many_connections_go_out_in_one_flush_per_pass(grpc_server: native_server.NativeGrpcServer) -> None:
    """Connections with output queue themselves on the server; one callback in the next pass writes them all."""
    clients = [MemoryClient(grpc_server) for _ in range(8)]
    loop = grpc_server.loop
    written: list[int] = []

    def count_written() -> None:
        written.append(sum(bool(client.transport.written) for client in clients))

    loop.call_soon(count_written)  # queued before any flush: runs before it
    for n, client in enumerate(clients):
        client.connection.session.ping()  # output waiting, as an answer leaves it
        client.connection.schedule_flush()
        client.connection.schedule_flush()  # asked twice in one pass: queued once
        if n == 0:  # queued after the first connection asked: a callback per connection would run after it
            loop.call_soon(count_written)
    assert grpc_server.to_flush == [client.connection for client in clients]
    loop.run_until_complete(asyncio.sleep(0))
    assert written == [0, 8]  # nothing written before the one flush, all 8 after it
    assert grpc_server.to_flush == []
    assert all(client.transport.written and not client.connection.flush_scheduled for client in clients)


@needs_http2
def test_many_connections_each_get_their_own_answer(grpc_server: native_server.NativeGrpcServer) -> None:
    clients = [MemoryClient(grpc_server) for _ in range(8)]
    streams = [client.call(f"{SERVICE}ModelInfer", simple_bytes(request_id=f"c{i}"))
               for i, client in enumerate(clients)]

    def answered() -> bool:
        for client in clients:
            client.read()
        return all(any(isinstance(e, StreamEnded) for e in client.of(stream_id))
                   for client, stream_id in zip(clients, streams, strict=True))

    run_server_loop(grpc_server, clients[0], answered)
    for i, (client, stream_id) in enumerate(zip(clients, streams, strict=True)):
        body = b"".join(e.data for e in client.of(stream_id) if isinstance(e, DataReceived))
        assert _codec.decode_infer_response(body[5:]).id == f"c{i}"
        assert client.connection.streams == {}

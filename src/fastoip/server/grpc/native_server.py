"""The native gRPC frontend: libnghttp2 (through :mod:`._http2`) on a uvloop event loop, no thread per call.

Rules:
- One asyncio Protocol per connection; socket bytes go into the HTTP/2 session,
  its events become calls (:mod:`.native_calls`), answers go back out as
  HEADERS + DATA + trailers.  Model execution happens on the Core's workers.
- The loop runs in one thread of its own (the way the HTTP frontend runs its
  uvloop loop), so ``start`` / ``stop`` look like grpcio's to the server process.
- Shutdown is a drain: GOAWAY notice, a PING round trip, the final GOAWAY,
  streams in flight finish within the grace, then connections close.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from time import monotonic
from typing import Any, Final, cast

from ...core import Core, start_in_bursts
from . import _http2
from . import protocol as wire  # gRPC over HTTP/2 rules (fastoip.wire is the codecs)
from ._http2 import MessageReceived, RequestEnded, RequestReceived, StreamClosed
from .intake import MessageIntake
from .limits import RequestBudget, ServerLimits
from .native_calls import Call, Dispatcher, deadline_from
from .native_head import AcceptedHead, read_head
from .native_options import NativeGrpcOptions
from .native_timers import ConnectionTimers

log = logging.getLogger("fastoip.grpc")

#: Responses waiting for a peer's flow-control window, per connection, above which its new requests are refused
#: (a client that sends but never opens its window must not grow the server's memory without bound; the
#: server-wide bound, checked as responses are queued, is limits.QUEUED_LIMIT).
QUEUED_LIMIT = 256 * 1024 * 1024
#: RST_STREAM's ENHANCE_YOUR_CALM: gRPC clients read it as RESOURCE_EXHAUSTED.
ENHANCE_YOUR_CALM = 0xB
#: The socket read size: the loop reads into one buffer of this size that every connection shares (each read
#: is consumed by nghttp2 before the next), so received bytes are not first copied into a bytes object.
READ_BUFFER = 256 * 1024


class StreamRecord:
    """What the connection keeps about one stream with a call: the one place its per-stream state lives.

    The HTTP/2 side of the stream (framing, queued output) is the session's; everything the connection
    needs besides the call goes here, and ``GrpcConnection.forget`` drops all of it at once.
    """

    __slots__ = ("call", "encoding", "deadline", "idle_seen", "idle_since")

    def __init__(self, call: Call, encoding: bytes, now: float) -> None:
        self.call = call
        #: grpc-encoding of the request's compressed messages (identity: none).
        self.encoding = encoding
        #: The grpc-timeout timer, when the request has one.
        self.deadline: asyncio.TimerHandle | None = None
        #: DATA bytes received when the idle sweep last looked, and since when that count stands still;
        #: idle_seen is -1 once the request side ended (nothing more to wait for).
        self.idle_seen = 0
        self.idle_since = now


class GrpcConnection(asyncio.BufferedProtocol):
    """One client connection: socket bytes <-> the HTTP/2 session, its events -> the streams' calls.

    Jobs, each in its own place: transport events (this class's first section), the session's events
    (``on_*``: a request's own by type in ``receive``, the rest through ``EVENT_HANDLERS``), head checks
    (:func:`.native_head.read_head`), request messages (:class:`.intake.MessageIntake`: flag, one-message rule,
    inflation; back through ``deliver_*``), the streams' records (:class:`StreamRecord`), answering (the calls'
    Responder), output and backpressure (``flush``), server-wide bounds (:class:`.limits.ServerLimits`), clocks
    (:class:`.native_timers.ConnectionTimers`) and the drain.
    """

    def __init__(self, server: NativeGrpcServer) -> None:
        self.server = server
        self.options = server.options
        self.loop = server.loop
        self.dispatcher = server.dispatcher
        self.session = _http2.Http2Session(
            self.options.max_message_size,
            max_concurrent_streams=self.options.max_concurrent_streams,
            stream_window=self.options.stream_window,
            connection_window=self.options.connection_window,
        )
        #: stream id -> its record, for every stream whose call has not finished.
        self.streams: dict[int, StreamRecord] = {}
        #: The last accepted request head and the header fields it was read from: a client repeats its heads
        #: (``read_head`` is a pure function of them), and the session reuses the repeated pairs' objects.
        self.last_head: AcceptedHead | None = None
        self.last_head_fields: list[tuple[bytes, bytes]] = []
        #: Streams whose responses are compressed (--grpc-infer-response-compression-level) -> the algorithm.
        self.response_encodings: dict[int, bytes] = {}
        # issue 27: server-wide limits (limits.py): connection count, handshake and idle timeouts, queued bytes
        self.limits: ServerLimits = server.limits
        #: This connection's unsent response bytes as last counted in limits.queued_total.
        self.accounted = 0
        self.admitted = False
        #: The client's address (its host): the cap's per-peer share counts by it (issue 37).
        self.peer = ""
        self.timers = ConnectionTimers(self.loop, self.options, self, self.limits)
        # issue 27: request messages are checked and inflated (off the loop when large) by the intake
        self.intake = MessageIntake(self, self.options.max_message_size)
        self.transport: asyncio.Transport | None = None
        #: The peer's host (registrations are bounded per client); set when the connection is made.
        self.peer = ""
        self.paused = False
        self.reading_paused = False
        self.flush_scheduled = False
        self.closed = False
        self.draining = False

    # -- transport events -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio subclasses
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        # issue 27/37: over --grpc-max-connections the connection cheapest to lose makes room, if any (limits.py)
        limits = self.limits
        if not limits.admit(self.peer) and not limits.replace_idle(self.peer, self.server.connections, monotonic()):
            if self.limits.refused == 1 or self.limits.refused % 1000 == 0:
                log.warning("gRPC connection refused: %d connections open (--grpc-max-connections)", self.limits.open)
            self.closed = True
            self.transport.abort()
            return
        self.admitted = True
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and peername:
            self.peer = str(peername[0])
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server.connections.add(self)
        self.timers.start()
        if self.server.draining:
            self.drain()
        self.flush()  # our SETTINGS go first

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.receive(self.server.read_buffer[:nbytes])

    def receive(self, data: memoryview) -> None:
        # one read of every readable connection per loop pass (h2load's -c 64 -m 1 is 64 of them): the per-read
        # work stays small: the timers' stamps inline, and a write only when the read produced output
        timers = self.timers
        timers.last_read = monotonic()
        timers.bytes_in += len(data)
        session = self.session
        try:
            events = session.receive(data)
        except _http2.Http2Error as exc:
            # nghttp2 queued a GOAWAY naming the error: send it, then close.
            log.debug("gRPC connection closed on a protocol error: %s", exc)
            self.flush()
            self.close()
            return
        for event in events:
            # a request's own events by direct (compiled) calls; the rare ones through the table
            if type(event) is RequestReceived:
                self.on_request(event)
            elif type(event) is MessageReceived:
                self.on_message(event)
            elif type(event) is RequestEnded:
                self.on_request_ended(event)
            elif type(event) is StreamClosed:
                self.on_closed(event)
            else:
                EVENT_HANDLERS[type(event)](self, event)
        if session.want_write():
            self.flush()  # SETTINGS/PING acks, WINDOW_UPDATEs, early answers: out now
        elif not session.want_read() and not self.closed:
            self.close()  # the peer's GOAWAY with nothing left in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.admitted:
            return
        self.limits.leave(self)
        self.server.connections.discard(self)
        self.timers.cancel()
        for stream_id in list(self.streams):
            self.end_call(stream_id).cancel()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    # -- the session's events (EVENT_HANDLERS) --------------------------------------------------
    def on_request(self, event: _http2.RequestReceived) -> None:
        stream_id = event.stream_id
        fields = event.headers
        head = self.last_head
        if head is None or fields != self.last_head_fields:  # (the same pair objects: compared by identity)
            verdict = read_head(fields, self.dispatcher.restricted)
            if not isinstance(verdict, AcceptedHead):
                self.session.send_headers_only(stream_id, verdict, reset=True)
                return
            head = self.last_head = verdict
            self.last_head_fields = fields
        if self.over_queued_limit(stream_id):
            return
        call = self.dispatcher.new_call(head.path, stream_id, self, deadline_from(head.timeout_ns))
        if call is None:
            self.answer_early(stream_id, wire.UNIMPLEMENTED, "Method not found!")  # grpc-core's words
            return
        call.headers = head.fields  # read by the Core only for a traced request (W3C traceparent)
        record = self.streams[stream_id] = StreamRecord(call, head.encoding, self.timers.last_read)
        level = self.options.response_compression_level
        if level != "none" and head.path in (self.dispatcher.infer_path, self.dispatcher.stream_path):
            # Triton's --grpc-infer-response-compression-level: an algorithm the client accepts, for the level
            chosen = wire.response_encoding(level, head.fields.get(b"grpc-accept-encoding"))
            if chosen is not None:
                self.response_encodings[stream_id] = chosen
        self.timers.call_started()
        if head.timeout_ns is not None:
            record.deadline = self.timers.deadline(stream_id, head.timeout_ns)

    def on_message(self, event: _http2.MessageReceived) -> None:
        stream_id = event.stream_id
        record = self.streams.get(stream_id)
        if record is None or self.over_queued_limit(stream_id):
            return
        self.timers.last_message = self.timers.last_read  # issue 37: the cap tells silent connections by it
        # issue 27: the intake checks the flag and the one-message rule and inflates (off the loop when large)
        self.intake.message(stream_id, record.call.streaming, event.data, event.flag, record.encoding)

    def deliver_message(self, stream_id: int, data: wire.Payload) -> None:
        """A request message, checked and inflated by the intake."""
        record = self.streams.get(stream_id)
        if record is None:
            return
        call = record.call
        call.on_message(data)
        if call.finished:
            self.forget(stream_id)

    def refuse_message(self, stream_id: int, code: int, message: str) -> None:
        """The intake refused a request message: the call ends with ``code``."""
        self.abort_call(stream_id, code, message)

    def on_request_ended(self, event: _http2.RequestEnded) -> None:
        record = self.streams.get(event.stream_id)
        if record is None:
            return
        record.idle_seen = -1  # the request side is complete: nothing to wait for
        self.intake.end(event.stream_id, event.leftover)  # -> deliver_end, after any message still inflating

    def deliver_end(self, stream_id: int, leftover: int) -> None:
        record = self.streams.get(stream_id)
        if record is None:
            return
        if leftover:
            self.abort_call(stream_id, wire.INTERNAL, "the request stream ended inside a gRPC message "
                                                      f"({leftover} bytes of it arrived)")
            return
        call = record.call
        call.on_end()
        if call.finished:
            self.forget(stream_id)

    def on_too_large(self, event: _http2.MessageTooLarge) -> None:
        limit = self.options.max_message_size
        self.abort_call(event.stream_id, wire.RESOURCE_EXHAUSTED,
                        f"SERVER: Received message larger than max ({event.declared} vs. {limit})")

    def on_closed(self, event: _http2.StreamClosed) -> None:
        """The stream is gone before its answer went out whole (reset by the client): a call still running is
        cancelled.  (One closed normally after its trailers is not reported: its call ended when it answered.)"""
        if event.stream_id in self.streams:
            self.end_call(event.stream_id).cancel()
        if self.draining and self.session.open_streams() == 0:
            self.schedule_flush()

    def on_ping_ack(self, event: _http2.PingAcknowledged) -> None:
        self.timers.ping_acknowledged()

    # -- the timers' requests (TimerOwner) ------------------------------------------------------
    def on_deadline(self, stream_id: int) -> None:
        record = self.streams.get(stream_id)
        if record is None:
            return
        record.deadline = None
        self.abort_call(stream_id, wire.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self.schedule_flush()

    def sweep_idle_streams(self, limit_s: float) -> None:
        """Answer the streams whose open request side got no DATA for ``limit_s`` (one timer a connection).

        A ModelStreamInfer stream between messages is not idle (clients keep them open between requests);
        one stalled inside a message is, as is a unary call that never ends its request.
        """
        now = time.monotonic()
        expired = []
        for stream_id, record in self.streams.items():
            if record.idle_seen < 0:
                continue  # the request side ended
            received, partial = self.session.progress(stream_id)
            if received != record.idle_seen or (record.call.streaming and not partial):
                record.idle_seen = received
                record.idle_since = now
            elif now - record.idle_since >= limit_s:
                expired.append(stream_id)
        for stream_id in expired:
            # after the trailers (or Trailers-Only), a reset stops the client's side too
            self.abort_call(stream_id, wire.DEADLINE_EXCEEDED,
                            f"no request data on this stream for {limit_s:g} s (--grpc-stream-idle-timeout)",
                            reset=True)
        if expired:
            self.flush()

    def ping(self) -> None:
        self.session.ping()
        self.flush()

    # -- answering (the calls' Responder) -----------------------------------------------------
    def send_headers(self, stream_id: int) -> None:
        self.timers.data_sent()
        encoding = self.response_encodings.get(stream_id)
        if encoding is None:
            self.session.send_headers(stream_id, wire.RESPONSE_HEADERS)
        else:
            self.session.send_headers(stream_id, [*wire.RESPONSE_HEADERS, (b"grpc-encoding", encoding)])

    def send_message(self, stream_id: int, message: bytes | list[bytes | memoryview]) -> None:
        self.timers.data_sent()
        # a response is never refused for its size alone: one queued while nothing else waits always goes
        others_waiting = self.limits.queued_total > 0
        encoding = self.response_encodings.get(stream_id)
        if encoding is not None:  # compressed: one message (copy: the parts joined, then deflated)
            whole = message if type(message) is bytes else b"".join(message)  # type: ignore[arg-type]
            self.session.send_message(stream_id, wire.compress(whole, encoding), True)
        elif type(message) is list:  # a large response in parts: its outputs go out from their arrays
            self.session.send_message_parts(stream_id, message)
        else:
            self.session.send_message(stream_id, message)  # type: ignore[arg-type]  # bytes here
        if self.limits.account(self) and others_waiting:  # issue 27: unsent responses bounded server-wide
            self.over_server_queued_limit(stream_id)
        self.schedule_flush()

    def answer(self, stream_id: int, message: bytes | list[bytes | memoryview]) -> None:
        """A unary call's answer (headers, message, OK trailers): ``send_headers``, ``send_message`` and
        ``finish(OK)`` of a call whose headers were not sent, with one lookup and one flush scheduled."""
        self.timers.data_sent()
        others_waiting = self.limits.queued_total > 0
        session = self.session
        encoding = self.response_encodings.get(stream_id) if self.response_encodings else None
        if encoding is None:
            # (a large response's outputs, in parts, go out from their arrays)
            session.answer(stream_id, RESPONSE_HEADERS, message, OK_TRAILERS)
        else:  # compressed: one message (copy: the parts joined, then deflated)
            session.send_headers(stream_id, [*RESPONSE_HEADERS, (b"grpc-encoding", encoding)])
            whole = message if type(message) is bytes else b"".join(message)  # type: ignore[arg-type]
            session.send_message(stream_id, wire.compress(whole, encoding), True)
            session.send_trailers(stream_id, OK_TRAILERS)
        if self.limits.account(self) and others_waiting:  # issue 27: unsent responses bounded server-wide
            self.over_server_queued_limit(stream_id)  # (the stream is reset: its answer is dropped)
        else:
            self.forget(stream_id)
        self.schedule_flush()

    def finish(self, stream_id: int, code: int, message: str = "") -> None:
        record = self.streams.get(stream_id)
        if record is not None and not record.call.headers_sent:
            self.session.send_headers_only(stream_id, wire.trailers_only(code, message))
        else:
            self.session.send_trailers(stream_id, wire.trailers(code, message))
        self.forget(stream_id)
        self.schedule_flush()

    def answer_early(self, stream_id: int, code: int, message: str) -> None:
        """Answer a stream that has no call (Trailers-Only), and reset it: its request is not wanted."""
        self.session.send_headers_only(stream_id, wire.trailers_only(code, message), reset=True)

    def abort_call(self, stream_id: int, code: int, message: str, reset: bool = False) -> Call | None:
        """Cancel a call still running and answer it ``code`` (Trailers-Only and a reset, or trailers after its
        messages, then a reset too when ``reset``)."""
        record = self.streams.get(stream_id)
        if record is None:
            return None
        call = self.end_call(stream_id)
        call.cancel()
        if call.headers_sent:
            self.session.send_trailers(stream_id, wire.trailers(code, message), reset=reset)
        else:
            self.session.send_headers_only(stream_id, wire.trailers_only(code, message), reset=True)
        return call

    def end_call(self, stream_id: int) -> Call:
        call = self.streams[stream_id].call
        self.forget(stream_id)
        return call

    def forget(self, stream_id: int) -> None:
        """Drop a stream's record (its call finished or was cancelled) and its deadline."""
        record = self.streams.pop(stream_id, None)
        if self.response_encodings:
            self.response_encodings.pop(stream_id, None)
        if record is not None:
            self.timers.call_ended()
            if record.deadline is not None:
                record.deadline.cancel()
        self.intake.forget(stream_id)

    # -- output ---------------------------------------------------------------------------------
    def schedule_flush(self) -> None:
        """Coalesce the answers finished in one loop iteration into one write (the server flushes every
        connection that asked, in one callback per pass: not one callback per connection)."""
        if not self.flush_scheduled and not self.closed:
            self.flush_scheduled = True
            self.server.flush_soon(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.closed or self.transport is None:
            return
        session = self.session
        try:
            if not self.paused:
                chunks = session.data_to_send()
                if chunks:
                    self.transport.writelines(chunks)  # one writev; large DATA as views of the responses
            if self.paused is not self.reading_paused:
                self.limit_reading()
        except _http2.Http2Error as exc:
            log.debug("gRPC connection closed: %s", exc)
            self.close()
            return
        # issue 27: what went out leaves the server-wide count (nothing to record while nothing waits anywhere)
        if self.admitted and (self.limits.queued_total or session.queued_bytes()):
            self.limits.account(self)
        if not session.want_read() and not session.want_write():
            self.close()  # GOAWAY sent and nothing left in flight (or the session failed)

    def limit_reading(self) -> None:
        """Backpressure: while the socket does not drain (the peer does not read), read no more requests.

        Only a full socket pauses reading: the peer's WINDOW_UPDATEs, which release responses held by
        HTTP/2 flow control, must still be read (that case is bounded by QUEUED_LIMIT instead).
        """
        assert self.transport is not None
        if self.paused and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        elif self.reading_paused and not self.paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def over_queued_limit(self, stream_id: int) -> bool:
        """Whether responses held by flow control passed QUEUED_LIMIT; if so the stream is answered and reset."""
        if self.session.queued_bytes() <= QUEUED_LIMIT and not self.limits.over_for(self):
            return False
        message = f"more than {QUEUED_LIMIT} bytes of responses on this connection wait for the client to read them"
        if stream_id in self.streams:
            self.abort_call(stream_id, wire.RESOURCE_EXHAUSTED, message)
        else:
            self.answer_early(stream_id, wire.RESOURCE_EXHAUSTED, message)
        return True

    # -- server-wide limits (issue 27, limits.py) ------------------------------------------------
    def queued_bytes(self) -> int:
        return self.session.queued_bytes()

    def over_server_queued_limit(self, stream_id: int) -> None:
        """The server holds more unsent responses than it may: this stream, which just queued more, goes."""
        log.warning("gRPC: %d bytes of responses wait for clients to read them (limit %d); resetting a stream",
                    self.limits.queued_total, self.limits.queued_limit)
        if stream_id in self.streams:
            self.end_call(stream_id).cancel()
        self.session.reset(stream_id, ENHANCE_YOUR_CALM)

    def has_calls(self) -> bool:
        return bool(self.streams)

    # -- as the connection cap sees it (limits.Replaceable) -----------------------------------
    @property
    def calls(self) -> dict[int, StreamRecord]:
        return self.streams

    @property
    def last_call(self) -> float:
        """When a call last started or ended, or a message last came or went."""
        timers = self.timers
        return timers.last_call if timers.last_call > timers.last_message else timers.last_message

    def waits_on_client(self) -> bool:
        """Every open call waits on its client: its request side is open and no request of it is in flight."""
        for record in self.streams.values():
            if record.idle_seen < 0 or record.call.working():
                return False
        return True

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    # -- drain ----------------------------------------------------------------------------------
    def drain(self) -> None:
        """Graceful GOAWAY: notice now, final GOAWAY after a PING round trip; streams in flight finish."""
        if self.draining or self.closed:
            return
        self.draining = True
        self.session.shutdown_notice()
        self.session.ping()
        self.timers.wait_for_drain_ping()
        self.flush()

    def final_goaway(self) -> None:
        self.session.goaway()
        self.flush()


RESPONSE_HEADERS: Final = wire.RESPONSE_HEADERS  # (Final: C statics once compiled, not module attribute reads)
OK_TRAILERS: Final = wire.OK_TRAILERS
#: The session's event types -> the connection's handler for each (``receive`` calls a request's own four
#: directly, by type, before it looks here).
EVENT_HANDLERS: Final[dict[type, Callable[[GrpcConnection, Any], None]]] = {  # (Final: a C static once compiled)
    _http2.MessageReceived: GrpcConnection.on_message,
    _http2.RequestReceived: GrpcConnection.on_request,
    _http2.RequestEnded: GrpcConnection.on_request_ended,
    _http2.StreamClosed: GrpcConnection.on_closed,
    _http2.MessageTooLarge: GrpcConnection.on_too_large,
    _http2.PingAcknowledged: GrpcConnection.on_ping_ack,
}


class NativeGrpcServer:
    """The native frontend on its own uvloop loop thread; ``start`` / ``stop`` as grpc.Server's."""

    def __init__(self, core: Core, host: str, port: int, options: NativeGrpcOptions) -> None:
        self.core = core
        self.host = host
        self.options = options
        self.connections: set[GrpcConnection] = set()
        self.limits = ServerLimits(options.max_connections, options.max_connection_idle_ms / 1000,
                                   options.handshake_timeout_ms / 1000, options.max_queued_response_bytes,
                                   RequestBudget(options.max_stream_request_bytes, options.max_queued_request_bytes),
                                   options.max_connection_quiet_ms / 1000, options.max_connections_per_peer)
        self.draining = False
        self.executor = ThreadPoolExecutor(max_workers=options.control_threads, thread_name_prefix="fastoip-grpc-ctl")
        self.sock = _bind(host, port)
        self.port: int = self.sock.getsockname()[1]
        self.ssl_context = _ssl_context(options) if options.use_ssl else None
        self.loop: asyncio.AbstractEventLoop = _new_loop()
        self.read_buffer = memoryview(bytearray(READ_BUFFER))
        #: Connections with answers to write this pass of the loop, flushed by one callback (``flush_soon``).
        self.to_flush: list[GrpcConnection] = []
        self.dispatcher = Dispatcher(core, self.loop, self.executor, options.restricted_protocols,
                                     options.forward_header_pattern)
        self.dispatcher.core_calls.budget = self.limits.requests  # issue 27: stream messages held, bounded
        self.dispatcher.core_calls.mlserver_streams = options.mlserver_streams
        self._listener: asyncio.AbstractServer | None = None
        # not `_thread`: mypyc names its C field `__thread`, a C keyword
        self._loop_thread: threading.Thread | None = None

    def flush_soon(self, connection: GrpcConnection) -> None:
        """Write ``connection``'s output later in this pass of the loop, with every other connection's."""
        if not self.to_flush:
            self.loop.call_soon(self.flush_all)
        self.to_flush.append(connection)

    def flush_all(self) -> None:
        """One callback per pass writes every connection that asked (each its own writev)."""
        connections, self.to_flush = self.to_flush, []
        for connection in connections:
            if connection.flush_scheduled:
                try:
                    connection.flush()
                except Exception:  # one connection's failure must not leave the others unwritten
                    log.exception("gRPC connection flush failed")

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            start_in_bursts(self.loop)  # one wake-up of a model's batcher per pass of the loop, not per request
            try:
                self._listener = self.loop.run_until_complete(self.loop.create_server(
                    lambda: GrpcConnection(self), sock=self.sock, ssl=self.ssl_context, backlog=1024))
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                self.loop.run_forever()
            finally:
                self.loop.close()

        self._loop_thread = threading.Thread(target=run, name="fastoip-grpc-loop", daemon=True)
        self._loop_thread.start()
        ready.wait()
        if failure:
            raise OSError(f"the native gRPC server failed to start: {failure[0]}")

    def stop(self, grace: float | None = None) -> threading.Event:
        """Drain: refuse new connections, GOAWAY, calls in flight get ``grace`` seconds; set when stopped."""
        stopped = threading.Event()
        thread = self._loop_thread
        if thread is None or not thread.is_alive():
            stopped.set()
            return stopped

        async def drain() -> None:
            self.draining = True
            if self._listener is not None:
                self._listener.close()
            for connection in list(self.connections):
                connection.drain()
            deadline = time.monotonic() + (grace or 0.0)
            while self.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.abort()
            await asyncio.sleep(0)

        def finish() -> None:
            try:
                asyncio.run_coroutine_threadsafe(drain(), self.loop).result((grace or 0.0) + 10)
            except Exception:
                log.exception("native gRPC drain failed")
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join(10)
            self.executor.shutdown(wait=False)
            stopped.set()

        threading.Thread(target=finish, name="fastoip-grpc-stop", daemon=True).start()
        return stopped


def create_native_server(core: Core, host: str, port: int, options: NativeGrpcOptions) -> tuple[NativeGrpcServer, int]:
    """A ready (not yet started) native server and the port it bound."""
    server = NativeGrpcServer(core, host, port, options)
    return server, server.port


def _new_loop() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"could not bind gRPC to {host}:{port}: {exc}") from None
    return sock


def _ssl_context(options: NativeGrpcOptions) -> ssl.SSLContext:
    """TLS with ALPN h2 (gRPC clients require it); mutual TLS checks client certs against the root cert."""
    if not options.server_cert or not options.server_key:
        raise OSError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.server_cert, options.server_key)
    context.set_alpn_protocols(["h2"])
    if options.use_ssl_mutual:
        if not options.root_cert:
            raise OSError("--grpc-use-ssl-mutual needs --grpc-root-cert")
        context.load_verify_locations(options.root_cert)
        context.verify_mode = ssl.CERT_REQUIRED
    elif options.root_cert:
        context.load_verify_locations(options.root_cert)
    return context

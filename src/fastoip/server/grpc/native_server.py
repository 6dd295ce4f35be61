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
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from ...core import Core
from . import _http2, wire
from .intake import MessageIntake
from .limits import HANDSHAKE_BYTES, ServerLimits
from .native_calls import Call, Dispatcher, deadline_from
from .native_options import NativeGrpcOptions

log = logging.getLogger("fastoip.grpc")

#: Responses waiting for a peer's flow-control window, per connection, above which its new requests are refused
#: (a client that sends but never opens its window must not grow the server's memory without bound; the
#: server-wide bound, checked as responses are queued, is limits.QUEUED_LIMIT).
QUEUED_LIMIT = 256 * 1024 * 1024
#: RST_STREAM's ENHANCE_YOUR_CALM: gRPC clients read it as RESOURCE_EXHAUSTED.
ENHANCE_YOUR_CALM = 0xB
#: How long the final GOAWAY waits for the PING that follows the notice (one round trip, bounded).
GOAWAY_PING_WAIT = 1.0
#: The socket read size: the loop reads into one buffer of this size that every connection shares (each read
#: is consumed by nghttp2 before the next), so received bytes are not first copied into a bytes object.
READ_BUFFER = 256 * 1024


class GrpcConnection(asyncio.BufferedProtocol):
    """One client connection: the HTTP/2 session, its calls, keepalive and drain."""

    def __init__(self, server: NativeGrpcServer) -> None:
        self.server = server
        self.options = server.options
        self.loop = server.loop
        self.session = _http2.Http2Session(
            self.options.max_message_size,
            max_concurrent_streams=self.options.max_concurrent_streams,
            stream_window=self.options.stream_window,
            connection_window=self.options.connection_window,
        )
        self.calls: dict[int, Call] = {}
        self.encodings: dict[int, bytes] = {}
        #: Streams whose responses are compressed (--grpc-infer-response-compression-level) -> the algorithm.
        self.response_encodings: dict[int, bytes] = {}
        #: Keepalive PINGs sent since a HEADERS or DATA frame was last sent (--grpc-http2-max-pings-without-data).
        self.pings_without_data = 0
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self.reading_paused = False
        self.flush_scheduled = False
        self.closed = False
        self.draining = False
        self.reset_after_flush: list[int] = []
        self.last_read = time.monotonic()
        self.keepalive: asyncio.TimerHandle | None = None
        self.ping_wait: asyncio.TimerHandle | None = None
        self.goaway_wait: asyncio.TimerHandle | None = None
        self.age_timer: asyncio.TimerHandle | None = None
        #: Streams whose request side is open -> (DATA bytes received when last seen, when that changed).
        self.open_requests: dict[int, tuple[int, float]] = {}
        self.idle_sweep: asyncio.TimerHandle | None = None
        # issue 27: request messages are checked and inflated (off the loop when large) by the intake
        self.intake = MessageIntake(self, self.options.max_message_size)
        # issue 27: server-wide limits (limits.py): connection count, handshake and idle timeouts, queued bytes
        self.limits: ServerLimits = server.limits
        self.admitted = False
        self.bytes_in = 0
        self.last_call = time.monotonic()
        self.handshake_timer: asyncio.TimerHandle | None = None
        self.no_calls_timer: asyncio.TimerHandle | None = None

    # -- transport events -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio subclasses
        if not self.limits.admit():  # issue 27: over --grpc-max-connections
            if self.limits.refused == 1 or self.limits.refused % 1000 == 0:
                log.warning("gRPC connection refused: %d connections open (--grpc-max-connections)", self.limits.open)
            self.closed = True
            self.transport.abort()
            return
        self.admitted = True
        self.start_limit_timers()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server.connections.add(self)
        if self.options.keepalive_time_ms > 0:
            self.keepalive = self.loop.call_later(self.options.keepalive_time_ms / 1000, self.check_idle)
        if self.options.max_connection_age_ms > 0:
            self.age_timer = self.loop.call_later(self.options.max_connection_age_ms / 1000, self.on_max_age)
        if self.options.stream_idle_timeout_ms > 0:
            self.idle_sweep = self.loop.call_later(self.idle_sweep_interval(), self.sweep_idle_streams)
        if self.server.draining:
            self.drain()
        self.flush()  # our SETTINGS go first

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.receive(self.server.read_buffer[:nbytes])

    def receive(self, data: memoryview) -> None:
        self.last_read = time.monotonic()
        self.bytes_in += len(data)
        try:
            events = self.session.receive(data)
        except _http2.Http2Error as exc:
            # nghttp2 queued a GOAWAY naming the error: send it, then close.
            log.debug("gRPC connection closed on a protocol error: %s", exc)
            self.flush()
            self.close()
            return
        for kind, stream_id, payload, number in events:
            if kind == _http2.MESSAGE:
                self.on_message(stream_id, cast(wire.Payload, payload), number)
            elif kind == _http2.REQUEST:
                self.on_request(stream_id, cast(wire.Headers, payload))
            elif kind == _http2.END_STREAM:
                self.on_end_stream(stream_id, number)
            elif kind == _http2.CLOSED:
                self.on_closed(stream_id, number)
            elif kind == _http2.TOO_LARGE:
                self.on_too_large(stream_id, number)
            elif kind == _http2.PING_ACK:
                self.on_ping_ack()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.admitted:
            return
        self.limits.leave(self)
        for timer in (self.handshake_timer, self.no_calls_timer):
            if timer is not None:
                timer.cancel()
        self.server.connections.discard(self)
        for handle in (self.keepalive, self.ping_wait, self.goaway_wait, self.age_timer, self.idle_sweep):
            if handle is not None:
                handle.cancel()
        for stream_id in list(self.calls):
            self.end_call(stream_id).cancel()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    # -- HTTP/2 events --------------------------------------------------------------------------
    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        fields = dict(headers)
        if fields.get(b":method") != b"POST":
            self.session.send_headers_only(stream_id, [(b":status", b"405"), (b"allow", b"POST")])
            self.reset_after_flush.append(stream_id)
            return
        content_type = fields.get(b"content-type", b"")
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+",
                                                                                  b"application/grpc;"))):
            # gRPC over HTTP/2: a content-type that is not gRPC gets HTTP 415.
            self.session.send_headers_only(stream_id, [(b":status", b"415"), (b"content-type", b"text/plain")])
            self.reset_after_flush.append(stream_id)
            return
        timeout = fields.get(b"grpc-timeout")
        timeout_ns = None
        if timeout is not None:
            timeout_ns = wire.parse_timeout(timeout)
            if timeout_ns is None:
                self.answer_early(stream_id, wire.INVALID_ARGUMENT, f"malformed grpc-timeout {timeout!r}")
                return
        if self.over_queued_limit(stream_id, False):
            return
        path = fields.get(b":path", b"")
        if self.server.dispatcher.restricted and (refusal := self.server.dispatcher.refusal(path, headers)):
            self.answer_early(stream_id, wire.UNAVAILABLE, refusal)  # Triton's --grpc-restricted-protocol
            return
        call = self.server.dispatcher.new_call(path, stream_id, self, deadline_from(timeout_ns))
        if call is None:
            self.answer_early(stream_id, wire.UNIMPLEMENTED, "Method not found!")  # grpc-core's words
            return
        self.calls[stream_id] = call
        self.last_call = time.monotonic()
        call.headers = fields  # read by the Core only for a traced request (W3C traceparent)
        self.open_requests[stream_id] = (0, time.monotonic())
        encoding = fields.get(b"grpc-encoding", b"identity")
        if encoding != b"identity":
            self.encodings[stream_id] = encoding
        level = self.options.response_compression_level
        if level != "none" and path in (self.server.dispatcher.infer_path, self.server.dispatcher.stream_path):
            chosen = wire.response_encoding(level, fields.get(b"grpc-accept-encoding"))
            if chosen is not None:
                self.response_encodings[stream_id] = chosen
        if timeout_ns is not None:
            self.timers[stream_id] = self.loop.call_later(timeout_ns / 1e9, self.on_deadline, stream_id)

    def on_message(self, stream_id: int, data: wire.Payload, compressed: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or self.over_queued_limit(stream_id, call.headers_sent):
            return
        self.intake.message(stream_id, call.streaming, data, compressed,
                            self.encodings.get(stream_id, b"identity"))  # -> deliver_message / refuse_message

    def deliver_message(self, stream_id: int, data: wire.Payload) -> None:
        """A request message, checked and inflated by the intake."""
        call = self.calls.get(stream_id)
        if call is None:
            return
        call.on_message(data)
        self.forget_if_finished(stream_id, call)

    def refuse_message(self, stream_id: int, code: int, message: str) -> None:
        """The intake refused a request message: the call ends with ``code``."""
        call = self.calls.get(stream_id)
        if call is None:
            return
        self.end_call(stream_id).cancel()
        self.answer_early(stream_id, code, message, call.headers_sent)

    def on_end_stream(self, stream_id: int, leftover: int) -> None:
        self.open_requests.pop(stream_id, None)
        self.intake.end(stream_id, leftover)  # -> deliver_end, after any message still inflating

    def deliver_end(self, stream_id: int, leftover: int) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        if leftover:
            self.end_call(stream_id).cancel()
            self.answer_early(stream_id, wire.INTERNAL,
                              f"the request stream ended inside a gRPC message ({leftover} bytes of it arrived)",
                              call.headers_sent)
            return
        call.on_end()
        self.forget_if_finished(stream_id, call)

    def on_too_large(self, stream_id: int, declared: int) -> None:
        self.abort_call(stream_id, wire.RESOURCE_EXHAUSTED,
                        f"SERVER: Received message larger than max ({declared} vs. {self.options.max_message_size})")

    def on_closed(self, stream_id: int, error_code: int) -> None:
        """The stream is gone (answered, or reset by the client): a call still running is cancelled."""
        call = self.calls.get(stream_id)
        if call is not None:
            self.end_call(stream_id).cancel()
        if self.draining and self.session.open_streams() == 0:
            self.schedule_flush()

    def on_deadline(self, stream_id: int) -> None:
        self.timers.pop(stream_id, None)
        call = self.calls.get(stream_id)
        if call is None:
            return
        self.end_call(stream_id).cancel()
        self.answer_early(stream_id, wire.DEADLINE_EXCEEDED, "Deadline Exceeded", call.headers_sent)
        self.schedule_flush()

    # -- answering (the calls' Responder) -----------------------------------------------------
    def send_headers(self, stream_id: int) -> None:
        self.pings_without_data = 0
        encoding = self.response_encodings.get(stream_id)
        if encoding is None:
            self.session.send_headers(stream_id, wire.RESPONSE_HEADERS)
        else:
            self.session.send_headers(stream_id, [*wire.RESPONSE_HEADERS, (b"grpc-encoding", encoding)])

    def send_message(self, stream_id: int, message: bytes) -> None:
        self.pings_without_data = 0
        encoding = self.response_encodings.get(stream_id)
        if encoding is None:
            self.session.send_message(stream_id, message)
        else:
            self.session.send_message(stream_id, wire.compress(message, encoding), True)
        if self.limits.account(self):  # issue 27: unsent responses bounded across the server, as they queue
            self.over_server_queued_limit(stream_id)
        self.schedule_flush()

    def finish(self, stream_id: int, code: int, message: str = "") -> None:
        call = self.calls.get(stream_id)
        if call is not None and not call.headers_sent:
            self.session.send_headers_only(stream_id, wire.trailers_only(code, message))
        else:
            self.session.send_trailers(stream_id, wire.trailers(code, message))
        self.forget(stream_id)
        self.schedule_flush()

    def answer_early(self, stream_id: int, code: int, message: str, headers_sent: bool = False) -> None:
        """End a call before its request did: Trailers-Only then RST_STREAM(NO_ERROR) to stop the upload;
        a stream that already answered messages gets its trailers after them instead."""
        if headers_sent:
            self.session.send_trailers(stream_id, wire.trailers(code, message))
            return
        self.session.send_headers_only(stream_id, wire.trailers_only(code, message))
        self.reset_after_flush.append(stream_id)

    def abort_call(self, stream_id: int, code: int, message: str) -> Call | None:
        """Cancel a call still running and answer it ``code`` (Trailers-Only, or trailers after its messages)."""
        call = self.calls.get(stream_id)
        if call is not None:
            self.end_call(stream_id).cancel()
            self.answer_early(stream_id, code, message, call.headers_sent)
        return call

    def end_call(self, stream_id: int) -> Call:
        call = self.calls[stream_id]
        self.forget(stream_id)
        return call

    def forget(self, stream_id: int) -> None:
        if self.calls.pop(stream_id, None) is not None:
            self.last_call = time.monotonic()
        self.open_requests.pop(stream_id, None)
        self.encodings.pop(stream_id, None)
        self.response_encodings.pop(stream_id, None)
        self.intake.forget(stream_id)
        timer = self.timers.pop(stream_id, None)
        if timer is not None:
            timer.cancel()

    def forget_if_finished(self, stream_id: int, call: Call) -> None:
        if call.finished:
            self.forget(stream_id)

    # -- output ---------------------------------------------------------------------------------
    def schedule_flush(self) -> None:
        """Coalesce the answers finished in one loop iteration into one write."""
        if not self.flush_scheduled and not self.closed:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.closed or self.transport is None:
            return
        try:
            if not self.paused:
                chunks = self.session.data_to_send()
                if self.reset_after_flush:
                    for stream_id in self.reset_after_flush:
                        self.session.reset(stream_id, _http2.NO_ERROR)
                    self.reset_after_flush.clear()
                    chunks += self.session.data_to_send()
                if chunks:
                    self.transport.writelines(chunks)  # one writev; large DATA as views of the responses
            self.limit_reading()
        except _http2.Http2Error as exc:
            log.debug("gRPC connection closed: %s", exc)
            self.close()
            return
        if self.admitted:
            self.limits.account(self)  # issue 27: what went out leaves the server-wide count
        if not self.session.want_read() and not self.session.want_write():
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

    def over_queued_limit(self, stream_id: int, headers_sent: bool) -> bool:
        if self.session.queued_bytes() <= QUEUED_LIMIT and not self.limits.over_for(self):
            return False
        call = self.calls.get(stream_id)
        if call is not None:
            self.end_call(stream_id).cancel()
        self.answer_early(stream_id, wire.RESOURCE_EXHAUSTED,
                          f"more than {QUEUED_LIMIT} bytes of responses on this connection wait for the client "
                          "to read them", headers_sent)
        return True

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    # -- idle streams ---------------------------------------------------------------------------
    def idle_sweep_interval(self) -> float:
        return max(self.options.stream_idle_timeout_ms / 4000, 0.01)

    def sweep_idle_streams(self) -> None:
        """Answer the streams whose open request side got no DATA for the idle timeout (one timer a connection).

        A ModelStreamInfer stream between messages is not idle (clients keep them open between requests);
        one stalled inside a message is, as is a unary call that never ends its request.
        """
        now = time.monotonic()
        limit = self.options.stream_idle_timeout_ms / 1000
        expired = []
        for stream_id, (seen, since) in self.open_requests.items():
            received, partial = self.session.progress(stream_id)
            call = self.calls.get(stream_id)
            if received != seen or (call is not None and call.streaming and not partial):
                self.open_requests[stream_id] = (received, now)
            elif now - since >= limit:
                expired.append(stream_id)
        for stream_id in expired:
            self.open_requests.pop(stream_id, None)
            call = self.abort_call(stream_id, wire.DEADLINE_EXCEEDED,
                                   f"no request data on this stream for {limit:g} s (--grpc-stream-idle-timeout)")
            if call is not None and call.headers_sent:
                self.reset_after_flush.append(stream_id)  # after the trailers: stop the client's side too
        if expired:
            self.flush()
        if not self.closed:
            self.idle_sweep = self.loop.call_later(self.idle_sweep_interval(), self.sweep_idle_streams)

    # -- server-wide limits (issue 27, limits.py) ------------------------------------------------
    def queued_bytes(self) -> int:
        return self.session.queued_bytes()

    def over_server_queued_limit(self, stream_id: int) -> None:
        """The server holds more unsent responses than it may: this stream, which just queued more, goes."""
        log.warning("gRPC: %d bytes of responses wait for clients to read them (limit %d); resetting a stream",
                    self.limits.queued_total, self.limits.queued_limit)
        call = self.calls.get(stream_id)
        if call is not None:
            self.end_call(stream_id).cancel()
        self.session.reset(stream_id, ENHANCE_YOUR_CALM)

    def start_limit_timers(self) -> None:
        if self.limits.handshake_timeout_s > 0:
            self.handshake_timer = self.loop.call_later(self.limits.handshake_timeout_s, self.check_handshake)
        if self.limits.idle_timeout_s > 0:
            self.no_calls_timer = self.loop.call_later(self.limits.idle_timeout_s, self.check_no_calls)

    def check_handshake(self) -> None:
        if self.bytes_in < HANDSHAKE_BYTES and not self.closed:
            log.debug("gRPC connection closed: no HTTP/2 preface within --grpc-handshake-timeout")
            self.close()

    def check_no_calls(self) -> None:
        if self.closed:
            return
        idle = time.monotonic() - self.last_call
        if not self.calls and idle >= self.limits.idle_timeout_s:
            log.debug("gRPC connection without calls for %.0f s (--grpc-max-connection-idle): GOAWAY", idle)
            self.drain()
            return
        wait = self.limits.idle_timeout_s - idle if not self.calls else self.limits.idle_timeout_s
        self.no_calls_timer = self.loop.call_later(max(wait, 0.01), self.check_no_calls)

    # -- keepalive, age and drain ---------------------------------------------------------------
    def check_idle(self) -> None:
        idle = time.monotonic() - self.last_read
        interval = self.options.keepalive_time_ms / 1000
        if idle >= interval and self.ping_wait is None and self.may_ping():
            self.pings_without_data += 1
            self.session.ping()
            self.ping_wait = self.loop.call_later(self.options.keepalive_timeout_ms / 1000, self.on_ping_timeout)
            self.flush()
        self.keepalive = self.loop.call_later(max(interval - idle, 0.001) if idle < interval else interval,
                                              self.check_idle)

    def may_ping(self) -> bool:
        """Triton's keepalive policy: --grpc-http2-max-pings-without-data, --grpc-keepalive-permit-without-calls."""
        limit = self.options.max_pings_without_data
        if limit > 0 and self.pings_without_data >= limit:
            return False
        return self.options.keepalive_without_calls or bool(self.calls)

    def on_ping_timeout(self) -> None:
        log.info("gRPC keepalive: no PING ACK within %d ms, closing the connection", self.options.keepalive_timeout_ms)
        self.ping_wait = None
        self.close()

    def on_ping_ack(self) -> None:
        if self.ping_wait is not None:
            self.ping_wait.cancel()
            self.ping_wait = None
        if self.goaway_wait is not None:
            self.goaway_wait.cancel()
            self.final_goaway()

    def on_max_age(self) -> None:
        log.debug("gRPC connection reached --grpc-max-connection-age: GOAWAY")
        self.drain()
        grace = self.options.max_connection_age_grace_ms
        if grace > 0:
            self.age_timer = self.loop.call_later(grace / 1000, self.close)

    def drain(self) -> None:
        """Graceful GOAWAY: notice now, final GOAWAY after a PING round trip; streams in flight finish."""
        if self.draining or self.closed:
            return
        self.draining = True
        self.session.shutdown_notice()
        self.session.ping()
        self.goaway_wait = self.loop.call_later(GOAWAY_PING_WAIT, self.final_goaway)
        self.flush()

    def final_goaway(self) -> None:
        self.goaway_wait = None
        self.session.goaway()
        self.flush()


class NativeGrpcServer:
    """The native frontend on its own uvloop loop thread; ``start`` / ``stop`` as grpc.Server's."""

    def __init__(self, core: Core, host: str, port: int, options: NativeGrpcOptions) -> None:
        self.core = core
        self.host = host
        self.options = options
        self.connections: set[GrpcConnection] = set()
        self.limits = ServerLimits(options.max_connections, options.max_connection_idle_ms / 1000,
                                   options.handshake_timeout_ms / 1000, options.max_queued_response_bytes)
        self.draining = False
        self.executor = ThreadPoolExecutor(max_workers=options.control_threads, thread_name_prefix="fastoip-grpc-ctl")
        self.sock = _bind(host, port)
        self.port: int = self.sock.getsockname()[1]
        self.ssl_context = _ssl_context(options) if options.use_ssl else None
        self.loop: asyncio.AbstractEventLoop = _new_loop()
        self.read_buffer = memoryview(bytearray(READ_BUFFER))
        self.dispatcher = Dispatcher(core, self.loop, self.executor, options.restricted_protocols,
                                     options.forward_header_pattern)
        self._listener: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
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

        self._thread = threading.Thread(target=run, name="fastoip-grpc-loop", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise OSError(f"the native gRPC server failed to start: {failure[0]}")

    def stop(self, grace: float | None = None) -> threading.Event:
        """Drain: refuse new connections, GOAWAY, calls in flight get ``grace`` seconds; set when stopped."""
        stopped = threading.Event()
        thread = self._thread
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

"""uvicorn's httptools protocol with limits: head size and field count, and the timeouts a server needs.

Rules:
- httptools parses; this class only counts and times what the parser is fed.  A request head (request
  line and headers) larger than ``max_header_bytes`` or with more than ``max_header_count`` fields is
  answered 431 and the connection closed.  The parser buffers a partial header itself, so the bytes fed
  while a head is incomplete are counted too: at most one read past the limit is ever held.
- ``header_timeout``: the whole head must arrive within it, from its first byte (slowloris); else 408.
  ``body_timeout``: a body being read must not stall longer than it between reads; else 408.
  ``body_min_rate`` (issue 27): after ``body_rate_grace`` (20 s) from its first byte a body must have come at that
  average rate (each ``body_min_rate`` bytes buy one more second, Apache mod_reqtimeout's MinRate); else 408,
  so a byte every few seconds cannot hold a connection for ever.  Only the body's own bytes count (issue 37: the
  head's bytes, read with the body's first ones, bought it time).
  ``keep_alive_timeout``: a connection with no request in progress (a fresh one included) is closed after it.
  Time while the server itself has stopped reading (flow control, pipelining) does not count against the client.
- Connections (issue 27): at most ``max_connections`` at once (0: a quarter of the open-file limit, at least 64;
  the native gRPC frontend takes half), so idle clients cannot take every file descriptor of the process.  A
  connection accepted past the cap closes the connection cheapest to lose (issue 37), in this order: one of a
  client address holding more than ``max_connections_per_peer`` (a quarter of the cap by default, so one address
  cannot hold it), then the one idle longest (no request in progress: nginx reuses idle keep-alive connections the
  same way), then one whose request body has been arriving for ``SLOW_BODY_S`` or more, slowest first (the
  client's debt, not the server's work).  A connection whose request the server is working on is never closed for
  a newcomer, unless its address holds more than its share and the newcomer's does not; when nothing can go, the
  new one is closed at once.  Fresh and idle connections are closed after
  ``keep_alive_timeout``; uvicorn's ``limit_concurrency`` only answers 503 and keeps the socket, so it does not fit.
- Graceful shutdown (uvicorn calls ``shutdown`` once the listeners are closed): a connection with no request in
  progress is not closed at once but after ``DRAIN_LINGER_S``, and a request that arrives on it meanwhile is
  answered with ``connection: close``.  A client of a keep-alive connection may have written its next request
  just as the server closed the connection: that request was lost (``HTTPConnectionClosed``, which clients do not
  retry); now it is answered, and the client's next connection is refused (retryable).
- Every refusal the server writes itself (limits, timeouts, framing errors the parser finds) is
  ``{"error": "..."}`` JSON with ``connection: close``, as the router answers everything else.
- A connection that ends with its request's body still arriving (a 413 on Content-Length to a client that sent
  ``connection: close``, as urllib does) is half-closed and reads and drops the rest (nginx's lingering close),
  so that a client that writes its whole body before reading gets the answer, not a reset; bounded by
  ``LINGER_AFTER_REFUSAL_S`` of quiet, ``LINGER_MAX_S`` and ``LINGER_MAX_BYTES``.  Such a connection counts as
  idle (its answer is complete): the connection cap may close it to admit a new one.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP connection may send, and how slowly."""

    #: Request line plus headers, in bytes (nginx and Node allow 8-16 KiB per line or in all).
    max_header_bytes: int = 64 * 1024
    #: Header fields per request (Apache's LimitRequestFields).
    max_header_count: int = 100
    #: Seconds an idle connection is kept open (above the 60 s idle timeout of common load balancers).
    keep_alive_timeout: float = 75.0
    #: Seconds the whole request head may take to arrive, from its first byte.
    header_timeout: float = 30.0
    #: Seconds a request body may go without a byte arriving (nginx's client_body_timeout).
    body_timeout: float = 60.0
    #: Bytes a second a body must average after body_rate_grace (0: no minimum; mod_reqtimeout's MinRate default).
    body_min_rate: float = 500.0
    #: Seconds a body may take before ``body_min_rate`` applies (mod_reqtimeout's body=20).
    body_rate_grace: float = 20.0
    #: Connections at once (0: ``default_max_connections()``).
    max_connections: int = 0
    #: Connections one client address may hold before its own are the first to go at the cap (0: a quarter of it).
    max_connections_per_peer: int = 0


def default_max_connections() -> int:
    """A quarter of the open-file limit (at least 64): gRPC takes half, models, metrics and logs the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 32768
    return max(64, soft // 4)


#: Seconds a request body must have been arriving before the cap may close its connection for a newcomer.
SLOW_BODY_S = 1.0

#: Seconds an idle connection stays open after the listeners closed, for a request already on its way.
DRAIN_LINGER_S = 1.0


#: How long a refused connection still reads (and drops) what its client sends before it is closed.
LINGER_AFTER_REFUSAL_S = 2.0
#: An answer that ends the connection before its request's body was read (a 413 on Content-Length) keeps reading
#: and dropping the body, as nginx's lingering close, so that a client that sends the whole body before it reads
#: (Python's urllib) gets the answer, not a reset: until the body stops (LINGER_AFTER_REFUSAL_S without bytes),
#: and at most this long and this many bytes.
LINGER_MAX_S = 30.0
LINGER_MAX_BYTES = 1 << 30


class _CloseAfterBody:
    """The transport a request's cycle writes to: its ``close`` lingers while the request's body still arrives."""

    def __init__(self, protocol: LimitedHttpToolsProtocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    def write(self, data: bytes) -> None:  # the per-request calls, without __getattr__'s detour
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_after_body()


class _Refused(Exception):
    """Raised inside a parser callback; httptools wraps it, data_received answers ``refusal``."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection: uvicorn's protocol, counting and timing what the parser is fed."""

    limits = HttpLimits()
    #: The cap in force (``limits.max_connections`` resolved by ``protocol_with``) and one address's share of it.
    max_connections = 64
    per_peer = 16
    #: Open connections by client address (one dict per server: ``protocol_with`` gives each class its own).
    peers: dict[str, int] = {}
    #: Connections closed to admit a new one / new ones closed because every connection was busy.
    evicted = 0
    refused_at_cap = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]  # uvicorn types it int; call_later takes float
        #: True from the end of one request (or the connection's start) until the next head is complete.
        self.reading_head = True
        self.head_started = 0.0
        #: Bytes fed while the head was incomplete (chunks: an upper bound of the head's size).
        self.head_bytes_fed = 0
        #: The head's size and field count as the parser reports them (exact).
        self.head_size = 0
        self.head_fields = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_seen = 0.0
        self.body_timer: asyncio.TimerHandle | None = None
        #: When the current body's first bytes came (None: no body in progress), and its bytes since then.
        self.body_started: float | None = None
        self.body_bytes = 0
        self.refusal: tuple[int, str] | None = None
        self.refused = False
        #: Set by ``shutdown``: every request from now on is the connection's last.
        self.draining = False
        self.drain_timer: asyncio.TimerHandle | None = None
        self.last_active = 0.0
        #: The lingering close after an answer that came before its body (``close_after_body``).
        self.linger_timer: asyncio.TimerHandle | None = None
        self.linger_until = 0.0
        self.linger_bytes = 0
        #: When the request in progress had its head (its body's clock, if no body byte came yet).
        self.request_started = 0.0
        self.peer = ""
        #: Whether ``peers`` counts this connection.
        self.counted = False

    # -- connection ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows the transport type too
        super().connection_made(transport)
        self.last_active = self.loop.time()
        self.peer = self.client[0] if self.client else ""
        if len(self.connections) > self.max_connections and not self._make_room():
            type(self).refused_at_cap += 1
            self.refused = True
            transport.close()
            return
        self.peers[self.peer] = self.peers.get(self.peer, 0) + 1
        self.counted = True
        # uvicorn arms its keep-alive timer only after a response: a connection that never sends is idle too.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _make_room(self) -> bool:
        """Close the connection cheapest to lose (the module's rules) when the open ones are over the cap; False
        when none may go.  Scanned only at the cap, never per request."""
        now = self.loop.time()
        peers = self.peers
        share = self.per_peer
        newcomer_under = peers.get(self.peer, 0) < share
        live = 0
        victim: LimitedHttpToolsProtocol | None = None
        best_rank, best_key = 4, 0.0
        for other in self.connections:
            if other.transport.is_closing():
                continue  # closed already, not yet gone from the set
            live += 1
            if other is self or not isinstance(other, LimitedHttpToolsProtocol):
                continue
            over = peers.get(other.peer, 0) > share
            if other.idle():
                rank, key = 1, other.last_active
            elif other.receiving_since(now) >= SLOW_BODY_S:
                rank, key = 2, other.body_rate(now)
            elif over and newcomer_under:
                rank, key = 3, other.last_active
            else:
                continue
            if over and rank < 3:
                rank = 0
            if rank < best_rank or (rank == best_rank and key < best_key):
                victim, best_rank, best_key = other, rank, key
        if live <= self.max_connections:
            return True
        if victim is None:
            return False
        type(self).evicted += 1
        victim.refused = True
        victim.transport.close()
        return True

    def receiving_since(self, now: float) -> float:
        """Seconds the request in progress has waited on its client's body (0: none is arriving)."""
        cycle = self.cycle
        if self.reading_head or cycle is None or not cycle.more_body or cycle.response_complete:
            return 0.0
        return now - (self.body_started if self.body_started is not None else self.request_started)

    def body_rate(self, now: float) -> float:
        """Bytes a second the body in progress has come at so far."""
        started = self.body_started if self.body_started is not None else self.request_started
        return self.body_bytes / max(now - started, 1.0)

    def idle(self) -> bool:
        """No request in progress: between requests, or before the first (a partial head included)."""
        return self.cycle is None or self.cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None
        if self.counted:
            self.counted = False
            held = self.peers.get(self.peer, 0) - 1
            if held > 0:
                self.peers[self.peer] = held
            else:
                self.peers.pop(self.peer, None)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self.draining = True
        if self.cycle is None or self.cycle.response_complete:
            self.drain_timer = self.loop.call_later(DRAIN_LINGER_S, self._close_when_idle)
        else:
            self.cycle.keep_alive = False

    def _close_when_idle(self) -> None:
        self.drain_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:  # a request came in while lingering: it closes the connection when answered
            self.cycle.keep_alive = False

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        self._unset_keepalive_if_required()
        if self.refused:
            if self.linger_timer is not None:  # a body read and dropped after its answer: bounded in bytes
                self.linger_bytes += len(data)
                if self.linger_bytes > LINGER_MAX_BYTES:
                    self.transport.close()
            return
        if self.reading_head:
            if self.head_bytes_fed == 0:
                self.head_started = self.loop.time()
            self.head_bytes_fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no websockets here: uvicorn's answer
            return
        except httptools.HttpParserError as exc:
            if self.refusal is not None:
                self.refuse(*self.refusal)
            else:
                self.refuse(400, f"malformed HTTP request: {exc}")
            return
        if self.reading_head:
            if self.head_bytes_fed > self.limits.max_header_bytes:
                self.refuse(431, self._head_too_large())
            elif self.head_timer is None and self.head_bytes_fed:
                self.head_timer = self.loop.call_at(self.head_started + self.limits.header_timeout,
                                                    self._head_timed_out)
        elif self.cycle is not None and self.cycle.more_body and not self.cycle.response_complete:
            # a body still to come: its clock runs from the end of the head (what on_body counted is its own)
            self.body_seen = self.loop.time()
            if self.body_started is None:
                self.body_started = self.request_started
            if self.body_timer is None:
                self.body_timer = self.loop.call_at(self._body_due(), self._body_stalled)

    # -- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_size = 0
        self.head_fields = 0

    def on_url(self, url: bytes) -> None:
        self.head_size += len(url)
        if self.head_size > self.limits.max_header_bytes:
            self._refuse_in_parser(431, self._head_too_large())
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_fields += 1
        self.head_size += len(name) + len(value) + 4  # ": " and CRLF
        if self.head_fields > self.limits.max_header_count:
            self._refuse_in_parser(
                431, f"too many header fields: more than {self.limits.max_header_count} (--http-max-header-count)"
            )
        if self.head_size > self.limits.max_header_bytes:
            self._refuse_in_parser(431, self._head_too_large())
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.reading_head = False
        self.head_bytes_fed = 0
        self.request_started = self.loop.time()
        self.body_bytes = 0
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _CloseAfterBody(self, self.transport)  # type: ignore[assignment]  # duck-typed
        if self.draining and self.cycle is not None:
            self.cycle.keep_alive = False  # answered with connection: close

    def close_after_body(self) -> None:
        """Close now, or, with the request's body still arriving, half-close and read and drop the rest first."""
        cycle = self.cycle
        transport = self.transport
        if cycle is None or not cycle.more_body or transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        self.refused = True  # data_received drops what comes from now on
        self._cancel_timers()
        transport.write_eof()
        self.flow.resume_reading()
        self.linger_until = self.loop.time() + LINGER_MAX_S
        self.linger_bytes = 0
        self.linger_timer = self.loop.call_later(LINGER_AFTER_REFUSAL_S, self._linger_check)

    def _linger_check(self) -> None:
        self.linger_timer = None
        now = self.loop.time()
        quiet_since = self.last_active
        if now >= self.linger_until or now - quiet_since >= LINGER_AFTER_REFUSAL_S:
            self.transport.close()
        else:
            self.linger_timer = self.loop.call_later(
                min(self.linger_until, quiet_since + LINGER_AFTER_REFUSAL_S) - now, self._linger_check)

    def on_body(self, body: bytes) -> None:
        # the body's own bytes, as the parser hands them over (issue 37: a read's head bytes are not the body's)
        self.body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.reading_head = True
        self.body_started = None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        super().on_message_complete()

    # -- refusals ----------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        self.refuse(400, msg)

    def refuse(self, status: int, message: str) -> None:
        """Answer ``{"error": message}`` with ``status`` (unless a response is under way) and close."""
        self.refused = True
        self._cancel_timers()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:  # a response is half-written: closing is all that is left
                self.transport.close()
                return
            cycle.disconnected = True  # the request's task must not answer after this one
            cycle.message_event.set()
        body = orjson.dumps({"error": message})
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        if not self.transport.is_closing():
            self.transport.write(head.encode("latin-1") + body)
            if self.transport.can_write_eof():
                # Lingering close (nginx's): half-close, drop what the client still sends, close a moment later.
                # Closing with its unread bytes here would answer them with a reset that can destroy the answer.
                self.transport.write_eof()
                self.loop.call_later(LINGER_AFTER_REFUSAL_S, self.transport.close)
            else:
                self.transport.close()

    def _refuse_in_parser(self, status: int, message: str) -> None:
        self.refusal = (status, message)
        raise _Refused(message)

    def _head_too_large(self) -> str:
        return (
            f"the request line and headers exceed {self.limits.max_header_bytes} bytes (--http-max-header-size)"
        )

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.flow.read_paused:  # the server stopped reading (pipelining): the client is not the slow one
            self.head_started = self.loop.time()
            self.head_timer = self.loop.call_at(self.head_started + self.limits.header_timeout, self._head_timed_out)
            return
        if self.reading_head and self.head_bytes_fed:
            self.refuse(408, f"the request headers did not arrive within {self.limits.header_timeout:g} s "
                             "(--http-header-timeout)")

    def _body_stalled(self) -> None:
        self.body_timer = None
        cycle = self.cycle
        if self.reading_head or cycle is None or not cycle.more_body:
            return
        if self.flow.read_paused:  # the application has not taken what arrived: the client is not the slow one
            self.body_seen = self.loop.time()
            self.body_started, self.body_bytes = self.body_seen, 0
        due = self._body_due()
        if self.loop.time() < due:  # bytes came since the timer was set: wait for the rest of the gap
            self.body_timer = self.loop.call_at(due, self._body_stalled)
            return
        if self.loop.time() >= self.body_seen + self.limits.body_timeout:
            self.refuse(408, f"the request body stalled: no bytes for {self.limits.body_timeout:g} s "
                             "(--http-body-timeout)")
            return
        self.refuse(408, f"the request body arrives slower than {self.limits.body_min_rate:g} bytes/s "
                         "(--http-body-min-rate)")

    def _body_due(self) -> float:
        """When the body in progress is late: a pause past body_timeout, or behind the minimum rate."""
        due = self.body_seen + self.limits.body_timeout
        if self.limits.body_min_rate > 0 and self.body_started is not None:
            allowed = self.limits.body_rate_grace + self.body_bytes / self.limits.body_min_rate
            due = min(due, self.body_started + allowed)
        return due

    def _cancel_timers(self) -> None:
        for timer in (self.head_timer, self.body_timer, self.drain_timer):
            if timer is not None:
                timer.cancel()
        self.head_timer = self.body_timer = self.drain_timer = None


def protocol_with(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for one server's limits (uvicorn instantiates the class it is given)."""
    cap = limits.max_connections if limits.max_connections > 0 else default_max_connections()
    share = limits.max_connections_per_peer if limits.max_connections_per_peer > 0 else max(1, cap // 4)
    return type("HttpToolsProtocolWithLimits", (LimitedHttpToolsProtocol,),
                {"limits": limits, "max_connections": cap, "per_peer": share, "peers": {}, "evicted": 0,
                 "refused_at_cap": 0})

"""The clocks of one native gRPC connection: keepalive, maximum age, idle streams, the drain's PING, deadlines.

Rules:
- Every timer a connection arms lives here, so ``cancel`` stops them all when
  the connection goes and a new bound (a handshake timeout, an idle-connection
  timeout) is one more timer beside these.
- The timers decide *when*; the connection decides *what* (send a PING, close,
  drain, answer a stream): they call it through :class:`TimerOwner`.
- One keepalive timer, one age timer and one idle sweep per connection, not
  one per stream; a stream's grpc-timeout is its own handle (kept in the
  stream's record, cancelled when the stream is forgotten).
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic
from typing import Protocol

from .limits import HANDSHAKE_BYTES, ServerLimits
from .native_options import NativeGrpcOptions

log = logging.getLogger("fastoip.grpc")

#: How long the final GOAWAY waits for the PING that follows the notice (one round trip, bounded).
GOAWAY_PING_WAIT = 1.0


class TimerOwner(Protocol):
    """What the timers ask of their connection."""

    def ping(self) -> None:
        """Send a PING now (keepalive)."""

    def close(self) -> None: ...

    def drain(self) -> None:
        """Start a graceful GOAWAY (maximum age reached)."""

    def final_goaway(self) -> None:
        """Send the final GOAWAY (the notice's PING came back, or waiting for it took too long)."""

    def sweep_idle_streams(self, limit_s: float) -> None:
        """Answer the streams whose request side got no data for ``limit_s`` seconds."""

    def on_deadline(self, stream_id: int) -> None:
        """A stream's grpc-timeout passed."""

    def has_calls(self) -> bool:
        """Whether a call is open on the connection (the no-call timeout waits while one is)."""


class ConnectionTimers:
    """Keepalive PINGs (Triton's --grpc-keepalive-*), maximum age (--grpc-max-connection-age*), the idle-stream
    sweep (--grpc-stream-idle-timeout), the drain's PING wait, per-stream deadlines, and the server-wide limits'
    handshake and no-call timeouts (issue 27, limits.py), for one connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: NativeGrpcOptions, owner: TimerOwner,
                 limits: ServerLimits | None = None) -> None:
        self.loop = loop
        self.options = options
        self.owner = owner
        self.limits = limits
        #: When the connection last received bytes (monotonic seconds); keepalive measures idleness from it.
        self.last_read = monotonic()
        #: Bytes received so far (the handshake timeout reads it).
        self.bytes_in = 0
        #: When a call last started or ended (the no-call timeout measures from it).
        self.last_call = self.last_read
        #: When a request message last arrived or a response went out (issue 37: the cap's quiet test).
        self.last_message = self.last_read
        self.keepalive: asyncio.TimerHandle | None = None
        #: Keepalive PINGs sent since HEADERS or DATA last went out (--grpc-http2-max-pings-without-data).
        self.pings_without_data = 0
        self.ping_wait: asyncio.TimerHandle | None = None
        self.goaway_wait: asyncio.TimerHandle | None = None
        self.age: asyncio.TimerHandle | None = None
        self.idle_sweep: asyncio.TimerHandle | None = None
        self.handshake: asyncio.TimerHandle | None = None
        self.no_calls: asyncio.TimerHandle | None = None
        self.stopped = False

    def start(self) -> None:
        """Arm the connection-wide timers the options ask for (at connection_made)."""
        options = self.options
        if options.keepalive_time_ms > 0:
            self.keepalive = self.loop.call_later(options.keepalive_time_ms / 1000, self.check_keepalive)
        if options.max_connection_age_ms > 0:
            self.age = self.loop.call_later(options.max_connection_age_ms / 1000, self.on_max_age)
        if options.stream_idle_timeout_ms > 0:
            self.idle_sweep = self.loop.call_later(self.idle_sweep_interval(), self.on_idle_sweep)
        if self.limits is not None and self.limits.handshake_timeout_s > 0:
            self.handshake = self.loop.call_later(self.limits.handshake_timeout_s, self.check_handshake)
        if self.limits is not None and self.limits.idle_timeout_s > 0:
            self.no_calls = self.loop.call_later(self.limits.idle_timeout_s, self.check_no_calls)

    def cancel(self) -> None:
        """The connection is gone: stop every timer (stream deadlines are cancelled with their records)."""
        self.stopped = True
        for handle in (self.keepalive, self.ping_wait, self.goaway_wait, self.age, self.idle_sweep, self.handshake,
                       self.no_calls):
            if handle is not None:
                handle.cancel()

    def bytes_received(self, count: int) -> None:
        self.last_read = monotonic()
        self.bytes_in += count

    def call_started(self) -> None:
        self.last_call = self.last_read  # (the read that brought the call's headers, this pass: no clock read)

    def call_ended(self) -> None:
        self.last_call = monotonic()

    # -- per stream ---------------------------------------------------------------------------
    def deadline(self, stream_id: int, timeout_ns: int) -> asyncio.TimerHandle:
        """A stream's grpc-timeout: the owner's ``on_deadline(stream_id)`` when it passes."""
        return self.loop.call_later(timeout_ns / 1e9, self.owner.on_deadline, stream_id)

    # -- keepalive ------------------------------------------------------------------------------
    def check_keepalive(self) -> None:
        idle = monotonic() - self.last_read
        interval = self.options.keepalive_time_ms / 1000
        if idle >= interval and self.ping_wait is None and self.may_ping():
            self.pings_without_data += 1
            self.ping_wait = self.loop.call_later(self.options.keepalive_timeout_ms / 1000, self.on_ping_timeout)
            self.owner.ping()
        if not self.stopped:
            self.keepalive = self.loop.call_later(max(interval - idle, 0.001) if idle < interval else interval,
                                                  self.check_keepalive)

    def may_ping(self) -> bool:
        """Triton's keepalive policy: --grpc-http2-max-pings-without-data (PINGs sent while no HEADERS or DATA
        went out), --grpc-keepalive-permit-without-calls (false: only while calls are open)."""
        limit = self.options.max_pings_without_data
        if limit > 0 and self.pings_without_data >= limit:
            return False
        return self.options.keepalive_without_calls or self.owner.has_calls()

    def data_sent(self) -> None:
        """HEADERS or DATA went out: keepalive PINGs may be sent again."""
        self.pings_without_data = 0
        self.last_message = self.last_read

    def on_ping_timeout(self) -> None:
        log.info("gRPC keepalive: no PING ACK within %d ms, closing the connection", self.options.keepalive_timeout_ms)
        self.ping_wait = None
        self.owner.close()

    def ping_acknowledged(self) -> None:
        """A PING ACK arrived: keepalive is answered, and a drain waiting for its PING goes on."""
        if self.ping_wait is not None:
            self.ping_wait.cancel()
            self.ping_wait = None
        if self.goaway_wait is not None:
            self.goaway_wait.cancel()
            self.goaway_wait = None
            self.owner.final_goaway()

    # -- drain and age --------------------------------------------------------------------------
    def wait_for_drain_ping(self) -> None:
        """The GOAWAY notice and its PING went out: the final GOAWAY at the ACK, or after GOAWAY_PING_WAIT."""
        self.goaway_wait = self.loop.call_later(GOAWAY_PING_WAIT, self.on_drain_ping_timeout)

    def on_drain_ping_timeout(self) -> None:
        self.goaway_wait = None
        self.owner.final_goaway()

    def on_max_age(self) -> None:
        log.debug("gRPC connection reached --grpc-max-connection-age: GOAWAY")
        self.age = None
        self.owner.drain()
        grace = self.options.max_connection_age_grace_ms
        if grace > 0:
            self.age = self.loop.call_later(grace / 1000, self.owner.close)

    # -- handshake and no-call timeouts (issue 27, limits.py) ------------------------------------
    def check_handshake(self) -> None:
        self.handshake = None
        if self.bytes_in < HANDSHAKE_BYTES and not self.stopped:
            log.debug("gRPC connection closed: no HTTP/2 preface within --grpc-handshake-timeout")
            self.owner.close()

    def check_no_calls(self) -> None:
        """A connection with no call for the idle timeout gets a graceful GOAWAY (grpc's max connection idle)."""
        if self.stopped or self.limits is None:
            return
        limit = self.limits.idle_timeout_s
        idle = monotonic() - self.last_call
        busy = self.owner.has_calls()
        if not busy and idle >= limit:
            log.debug("gRPC connection without calls for %.0f s (--grpc-max-connection-idle): GOAWAY", idle)
            self.no_calls = None
            self.owner.drain()
            return
        self.no_calls = self.loop.call_later(max(limit - idle if not busy else limit, 0.01), self.check_no_calls)

    # -- idle streams ---------------------------------------------------------------------------
    def idle_sweep_interval(self) -> float:
        return max(self.options.stream_idle_timeout_ms / 4000, 0.01)

    def on_idle_sweep(self) -> None:
        self.owner.sweep_idle_streams(self.options.stream_idle_timeout_ms / 1000)
        if not self.stopped:
            self.idle_sweep = self.loop.call_later(self.idle_sweep_interval(), self.on_idle_sweep)

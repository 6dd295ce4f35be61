"""Server-wide bounds of the native gRPC frontend (issue 27): connections, idle time, unsent responses.

Rules:
- At most ``max_connections`` connections at once (default: half the process's
  open-file limit, so the HTTP frontend, metrics and model files keep theirs).
  One more closes the connection that is cheapest to lose (issue 37), in this
  order: one of a peer address that holds more than ``per_peer`` connections
  (so one address cannot hold the cap), then one with no call open (idle or
  never handshaken; nginx reuses idle keep-alive connections the same way),
  then one whose open calls all wait on their client (a stream with no request
  in flight) and that moved no message for ``quiet_s`` (a stream opened and
  left silent holds nothing but a slot), oldest activity first.  A connection
  working on a request is never closed for a newcomer, unless its address holds
  more than its share and the newcomer's does not.  When nothing can go, the
  new one is closed as soon as it is accepted, before anything is read.
- A connection whose client has not sent the HTTP/2 preface and its SETTINGS
  within ``handshake_timeout_s`` is closed.
- A connection with no stream open for ``idle_timeout_s`` gets a graceful
  GOAWAY (grpc's ``GRPC_ARG_MAX_CONNECTION_IDLE_MS``): gRPC clients reconnect
  on their next call.
- Response bytes waiting for the clients' flow-control windows are counted
  across all connections as they are queued.  Above ``queued_limit`` the
  stream that queues more is reset with ENHANCE_YOUR_CALM (gRPC clients read
  RESOURCE_EXHAUSTED) and its queued bytes are dropped, and a connection that
  still holds queued bytes gets no new calls until the total is under again.
  A decoupled model's responses are queued the same way, each as it is produced.
- ModelStreamInfer request messages received but not yet answered (queued in
  the Core or running) are counted per stream and across the server
  (``RequestBudget``): a message that would take its stream past
  ``stream_limit`` or the server past ``server_limit`` ends the stream with
  RESOURCE_EXHAUSTED (its queued requests are cancelled).  A stream that holds
  nothing may always send one message (up to the message size limit), so a
  large request is never refused for its size alone on a quiet server.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable, Sized
from typing import Protocol

#: Response bytes waiting for clients' windows, all connections together (--grpc-max-queued-response-bytes).
QUEUED_LIMIT = 1024 * 1024 * 1024
#: Stream request bytes received and not yet answered, per stream (--grpc-max-stream-request-bytes).
STREAM_REQUEST_LIMIT = 256 * 1024 * 1024
#: The same, all streams of the server together (--grpc-max-queued-request-bytes).
QUEUED_REQUEST_LIMIT = 1024 * 1024 * 1024
#: Seconds without a message after which a connection whose calls all wait on their client counts as idle at
#: the cap (--grpc-max-connection-quiet).
QUIET_S = 10.0
#: The client's preface + SETTINGS: 24 + 9 bytes at least.
HANDSHAKE_BYTES = 33


def default_max_connections() -> int:
    """Half the open-file limit (at least 64): the rest stays for HTTP, metrics, models and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft // 2)


class RequestBudget:
    """Bytes of ModelStreamInfer messages received and not yet answered (touched on the loop thread only)."""

    def __init__(self, stream_limit: int = STREAM_REQUEST_LIMIT, server_limit: int = QUEUED_REQUEST_LIMIT) -> None:
        self.stream_limit = stream_limit
        self.server_limit = server_limit
        self.held_total = 0
        self.refused = 0

    def take(self, stream_held: int, size: int) -> str | None:
        """Count ``size`` more bytes for a stream that holds ``stream_held``; a refusal message when over."""
        if stream_held > 0:
            if stream_held + size > self.stream_limit:
                self.refused += 1
                return (f"the stream holds {stream_held} bytes of requests not yet answered; {size} more would pass "
                        f"{self.stream_limit} (--grpc-max-stream-request-bytes)")
            if self.held_total + size > self.server_limit:
                self.refused += 1
                return (f"the server holds {self.held_total} bytes of stream requests not yet answered; {size} "
                        f"more would pass {self.server_limit} (--grpc-max-queued-request-bytes)")
        self.held_total += size
        return None

    def give(self, size: int) -> None:
        self.held_total -= size


class Counted(Protocol):
    """A connection, as the limits see it: ``accounted`` is its part of ``queued_total``, kept on the connection
    (a field read per answer, where a dict keyed by connection cost an insert and a delete per request)."""

    accounted: int
    peer: str

    def queued_bytes(self) -> int: ...


class Replaceable(Protocol):
    """A connection, as the cap sees it: its peer address, its open calls, when it last moved a call or message."""

    closed: bool
    peer: str

    @property
    def last_call(self) -> float: ...

    @property
    def calls(self) -> Sized: ...

    def waits_on_client(self) -> bool:
        """Whether every open call waits on its client (no request of it being worked on)."""

    def close(self) -> None: ...


class ServerLimits:
    """The counts that are shared by every connection of one server (touched on its loop thread only)."""

    def __init__(self, max_connections: int, idle_timeout_s: float, handshake_timeout_s: float,
                 queued_limit: int = QUEUED_LIMIT, requests: RequestBudget | None = None,
                 quiet_s: float = QUIET_S, per_peer: int = 0) -> None:
        self.max_connections = max_connections if max_connections > 0 else default_max_connections()
        #: Connections one peer address may hold before its own are the first to go at the cap (0: a quarter).
        self.per_peer = per_peer if per_peer > 0 else max(1, self.max_connections // 4)
        self.quiet_s = quiet_s
        #: Open connections by peer address.
        self.peers: dict[str, int] = {}
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.queued_limit = queued_limit
        #: Stream request messages held (the native calls count them).
        self.requests = requests or RequestBudget()
        self.open = 0
        self.refused = 0
        self.replaced = 0
        #: Every connection's ``accounted`` together.
        self.queued_total = 0

    def admit(self, peer: str) -> bool:
        """Count a new connection from ``peer``; False (and not counted) when the server has its maximum."""
        if self.open >= self.max_connections:
            return False
        self.enter(peer)
        return True

    def enter(self, peer: str) -> None:
        self.open += 1
        self.peers[peer] = self.peers.get(peer, 0) + 1

    def replace_idle(self, peer: str, connections: Iterable[Replaceable], now: float) -> bool:
        """At the cap: close the connection cheapest to lose (the module's rules) and count ``peer``'s new one.

        False (nothing closed, the new one not counted, ``refused`` counts it) when none may go.  The closed one
        leaves the count when its transport reports it lost.
        """
        victim = self.victim(peer, connections, now)
        if victim is None:
            self.refused += 1
            return False
        victim.close()
        self.replaced += 1
        self.enter(peer)
        return True

    def victim(self, peer: str, connections: Iterable[Replaceable], now: float) -> Replaceable | None:
        """The connection to close for a newcomer from ``peer`` (scanned at the cap only, never per call)."""
        peers = self.peers
        share = self.per_peer
        newcomer_under = peers.get(peer, 0) < share
        best: Replaceable | None = None
        best_rank = 4
        best_time = 0.0
        for connection in connections:
            if connection.closed:
                continue
            over = peers.get(connection.peer, 0) > share
            last = connection.last_call
            if not len(connection.calls):
                rank = 1  # no call open
            elif now - last >= self.quiet_s and connection.waits_on_client():
                rank = 2  # calls open and silent
            elif over and newcomer_under:
                rank = 3  # busy, but its address holds more than its share and the newcomer's does not
            else:
                continue
            if over and rank < 3:
                rank = 0
            if rank < best_rank or (rank == best_rank and last < best_time):
                best, best_rank, best_time = connection, rank, last
        return best

    def leave(self, connection: Counted) -> None:
        self.open -= 1
        held = self.peers.get(connection.peer, 0) - 1
        if held > 0:
            self.peers[connection.peer] = held
        else:
            self.peers.pop(connection.peer, None)
        self.queued_total -= connection.accounted
        connection.accounted = 0

    def account(self, connection: Counted) -> bool:
        """Record ``connection``'s queued response bytes now; True when the server-wide total is over the limit."""
        now = connection.queued_bytes()
        before = connection.accounted
        if now != before:
            self.queued_total += now - before
            connection.accounted = now
        return self.queued_total > self.queued_limit

    def over_for(self, connection: Counted) -> bool:
        """Whether ``connection`` must get no new calls: the total is over and it holds some of it."""
        return self.queued_total > self.queued_limit and connection.accounted > 0

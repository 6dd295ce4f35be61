"""Server-wide bounds of the native gRPC frontend (issue 27): connections, idle time, unsent responses.

Rules:
- At most ``max_connections`` connections at once (default: half the process's
  open-file limit, so the HTTP frontend, metrics and model files keep theirs);
  one more is closed as soon as it is accepted, before anything is read.
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
"""

from __future__ import annotations

import resource
from typing import Protocol

#: Response bytes waiting for clients' windows, all connections together (--grpc-max-queued-response-bytes).
QUEUED_LIMIT = 1024 * 1024 * 1024
#: The client's preface + SETTINGS: 24 + 9 bytes at least.
HANDSHAKE_BYTES = 33


def default_max_connections() -> int:
    """Half the open-file limit (at least 64): the rest stays for HTTP, metrics, models and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft // 2)


class Counted(Protocol):
    """A connection, as the limits see it."""

    def queued_bytes(self) -> int: ...


class ServerLimits:
    """The counts that are shared by every connection of one server (touched on its loop thread only)."""

    def __init__(self, max_connections: int, idle_timeout_s: float, handshake_timeout_s: float,
                 queued_limit: int = QUEUED_LIMIT) -> None:
        self.max_connections = max_connections if max_connections > 0 else default_max_connections()
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.queued_limit = queued_limit
        self.open = 0
        self.refused = 0
        self._queued: dict[Counted, int] = {}
        self.queued_total = 0

    def admit(self) -> bool:
        """Count a new connection; False (and not counted) when the server has its maximum."""
        if self.open >= self.max_connections:
            self.refused += 1
            return False
        self.open += 1
        return True

    def leave(self, connection: Counted) -> None:
        self.open -= 1
        self.queued_total -= self._queued.pop(connection, 0)

    def account(self, connection: Counted) -> bool:
        """Record ``connection``'s queued response bytes now; True when the server-wide total is over the limit."""
        now = connection.queued_bytes()
        before = self._queued.get(connection, 0)
        if now != before:
            self.queued_total += now - before
            if now:
                self._queued[connection] = now
            else:
                self._queued.pop(connection, None)
        return self.queued_total > self.queued_limit

    def over_for(self, connection: Counted) -> bool:
        """Whether ``connection`` must get no new calls: the total is over and it holds some of it."""
        return self.queued_total > self.queued_limit and self._queued.get(connection, 0) > 0

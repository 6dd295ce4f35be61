"""Claim the listening ports before the models load, so a port in use fails in a second, not after every load.

Rules:
- Each fixed port (> 0) is bound (not listened on) at start-up, before anything slow happens; a port
  another process holds is an ``OSError`` naming the flag, the address and what to do.
- The claims are held while models load (nobody else can take the port meanwhile) and released just
  before each frontend binds for real; a connection attempt during loading is refused, as before.
- Port 0 (pick a free one) and -1 (off) claim nothing.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field


@dataclass
class PortClaims:
    """Bound, not listening, sockets on the ports the frontends will listen on."""

    sockets: dict[str, socket.socket] = field(default_factory=dict)

    def release(self, flag: str) -> None:
        """Release one claim (just before its frontend binds the port itself)."""
        sock = self.sockets.pop(flag, None)
        if sock is not None:
            sock.close()

    def release_all(self) -> None:
        for flag in list(self.sockets):
            self.release(flag)


def claim_ports(wanted: list[tuple[str, str, int]]) -> PortClaims:
    """Bind each (flag, host, port) with a fixed port; OSError naming the first one that is taken."""
    claims = PortClaims()
    try:
        for flag, host, port in wanted:
            if port <= 0:
                continue
            claims.sockets[flag] = _claim(flag, host, port)
    except OSError:
        claims.release_all()
        raise
    return claims


def _claim(flag: str, host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise OSError(f"{flag}: cannot resolve bind address {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # As the frontends bind: a port left in TIME_WAIT by a previous run is free, a listening one is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = (
            "another process listens there (a fastoip or tritonserver still running?): stop it, or pick "
            f"another port with {flag} N (0 picks a free one, -1 turns it off)"
            if exc.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise OSError(f"{flag} {port}: cannot bind {host}:{port}: {exc.strerror}; {hint}") from None
    return sock

"""Raw-socket checks the connection-bound tests share (HTTP, gRPC, metrics ports)."""

from __future__ import annotations

import socket
import time


def closed_within(sock: socket.socket, wait_s: float) -> bool:
    """Whether the peer closed ``sock`` (end of stream or a reset) within ``wait_s`` seconds.

    What arrives before the close is read and discarded; the socket's own timeout is left as it was.
    """
    deadline = time.monotonic() + wait_s
    timeout = sock.gettimeout()
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(1 << 16):
                return True
        return False
    except TimeoutError:
        return False
    except OSError:  # reset by the peer
        return True
    finally:
        sock.settimeout(timeout)

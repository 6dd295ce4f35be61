"""Servers the bench starts itself: a local fastoip (no URL given) and the ceiling server.

Both run as child processes that print ``<name>: grpc listening on HOST:PORT``
when they are up.  Rules:

- They bind 127.0.0.1 and an ephemeral port (``--grpc-port 0``).
- Pinning, where the machine allows (at least 2 CPUs in our affinity mask):
  the server gets the first allowed CPU, the client (this process and its
  worker processes) the others, the peers lab's method.  ``--no-pin`` turns it off.
- Starting, output, stopping: :mod:`fastoip.launcher` (SIGTERM, wait, SIGKILL after a
  timeout; SIGTERM from the kernel if the bench dies first; only the PID the bench
  started is ever signalled).
"""

from __future__ import annotations

import os
import sys

from ..launcher import ChildProcess, LaunchError


def cpu_split() -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, client CPUs), or (None, None) when fewer than 2 CPUs are allowed."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def pin_current_process(cpus: set[int]) -> None:
    """Every thread of this process (and the threads it starts later) onto ``cpus``."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


class ChildServer(ChildProcess):
    """A server child of the bench (the shared launcher); a failure to start is a BenchError of stage "server"."""

    def __init__(self, argv: list[str], cpus: set[int] | None = None, want: tuple[str, ...] = ("grpc",)) -> None:
        super().__init__(argv, want=want, cpus=cpus, keep_lines=200)

    def start(self, timeout: float = 120.0) -> ChildServer:
        try:
            super().start(timeout)
        except LaunchError as exc:
            from .target import BenchError

            raise BenchError(str(exc), stage="server") from None
        return self


def fastoip_server(protocol: str, cpus: set[int] | None, log_level: str = "WARNING") -> ChildServer:
    """``python -m fastoip.cli serve`` on the built-in demo repository, loopback, ephemeral ports."""
    argv = [
        sys.executable,
        "-m",
        "fastoip.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--http-port",
        "0" if protocol == "http" else "-1",
        "--metrics-port",
        "-1",
        "--shutdown-grace",  # nothing routes to this private server: stop at once
        "0",
        "--log-level",
        log_level,
    ]
    return ChildServer(argv, cpus, want=("grpc", "http") if protocol == "http" else ("grpc",))

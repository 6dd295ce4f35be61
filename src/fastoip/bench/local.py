"""Servers the bench starts itself: a local fastoip (no URL given) and the ceiling server.

Both run as child processes that print ``<name>: grpc listening on HOST:PORT``
when they are up.  Rules:

- They bind 127.0.0.1 and an ephemeral port (``--grpc-port 0``).
- Pinning, where the machine allows (at least 2 CPUs in our affinity mask):
  the server gets the first allowed CPU, the client (this process and its
  worker processes) the others, the peers lab's method.  ``--no-pin`` turns it off.
- Stopping: SIGTERM, wait, SIGKILL after a timeout, wait again; the child also
  gets SIGTERM from the kernel if the bench dies first (PR_SET_PDEATHSIG).
  Only the PID the bench started is ever signalled.
- No ``preexec_fn`` (see :data:`LAUNCHER`): children are started with vfork.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

LISTEN = re.compile(r"(\S+): (grpc|http) listening on (\S+):(\d+)")


def cpu_split() -> tuple[Optional[set[int]], Optional[set[int]]]:
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


def process_cpu_seconds(pid: int) -> Optional[float]:
    """utime + stime of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


#: Runs in the child before the server: pin, ask for SIGTERM if the bench dies (both survive
#: execve), then exec the server in place (same PID).  A launcher instead of Popen's preexec_fn:
#: preexec_fn makes CPython fork() instead of vfork(), and fork() in a process with live gRPC
#: runs gRPC's fork handlers, whose restarted poller can abort the child before exec
#: (grpc/grpc#43055: "epoll_wait error: Bad file descriptor").
LAUNCHER = (
    "import ctypes, os, sys\n"
    "cpus = [int(c) for c in sys.argv[1].split(',') if c]\n"
    "if cpus:\n"
    "    os.sched_setaffinity(0, cpus)\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "except Exception:\n"
    "    pass\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class ChildServer:
    """A server child process whose ports are read from its output."""

    def __init__(self, argv: list[str], cpus: Optional[set[int]] = None, want: tuple[str, ...] = ("grpc",)) -> None:
        self.argv = argv
        self.cpus = cpus
        self.want = want
        self.proc: Optional[subprocess.Popen] = None
        self.ports: dict[str, int] = {}
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self._listening = threading.Event()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> "ChildServer":
        cpus = ",".join(str(c) for c in sorted(self.cpus or ()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, cpus, *self.argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a Ctrl-C reaches the bench, which stops the server itself
        )
        threading.Thread(target=self._pump, name="fastoip-bench-child-output", daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                why = f"exited with code {code}" if code is not None else f"did not listen within {timeout:.0f} s"
                from .target import BenchError

                raise BenchError(
                    f"{' '.join(self.argv[:4])} ... {why}; its last output:\n" + self.output(30), stage="server"
                )
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = LISTEN.search(line)
            if match:
                self.ports[match.group(2)] = int(match.group(4))
                if all(w in self.ports for w in self.want):
                    self._listening.set()

    def output(self, last: int = 50) -> str:
        return "\n".join(list(self.lines)[-last:])

    def cpu_seconds(self) -> Optional[float]:
        return process_cpu_seconds(self.pid) if self.proc is not None else None

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        """SIGTERM, wait ``timeout``, then SIGKILL; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        return self.proc.returncode


def fastoip_server(protocol: str, cpus: Optional[set[int]], log_level: str = "WARNING") -> ChildServer:
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

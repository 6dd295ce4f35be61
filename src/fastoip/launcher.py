"""Start, watch and stop server child processes: one launcher for the tests, the benchmarks and ``fastoip bench``.

Users: ``tests/helpers/serverproc.py`` (``fastoip serve`` for the end-to-end tests), ``benchmarks/_harness.py`` and
``benchmarks/bench_python_model.py`` (a pinned ``fastoip serve``), ``benchmarks/lab.py`` (fastoip and the peer
servers), ``fastoip.bench.local`` (the bench's local fastoip and its ceiling server). Standard library only, so
the lab's driver can import it from outside fastoip's virtualenv.

Rules:

- Servers say where they listen with a line ``<name>: <kind> listening on <host>:<port>`` (kind ``grpc``,
  ``http``, ``openai`` or ``metrics``; ``fastoip serve`` prints one per endpoint). :meth:`ChildProcess.start` waits for
  the kinds it is asked for, and fails with the child's last output when it exits or the time is up first.
- The child is started through a small Python trampoline (:data:`TRAMPOLINE`) that pins it to its CPUs, asks
  the kernel for SIGTERM when the parent dies (PR_SET_PDEATHSIG), then execs the server in place (same PID).
  Not Popen's ``preexec_fn``: that makes CPython fork() instead of vfork(), and fork() in a process with live
  gRPC runs gRPC's fork handlers, whose restarted poller can abort the child before exec (grpc/grpc#43055,
  "epoll_wait error: Bad file descriptor"). PR_SET_PDEATHSIG fires when the *thread* that started the child
  exits: start children from a thread that outlives them (the main thread, in every user above).
- The child runs in a session of its own (a Ctrl-C reaches the parent, which stops the child itself), so its
  PID is also its process group's, and ``stop(group=True)`` reaches the workers a server may have started.
- Output (stdout and stderr merged) is read line by line on a daemon thread, kept in :attr:`ChildProcess.lines`
  (all of it, or at least the last ``keep_lines``) and, with ``log_path``, written to a file as it comes.
- Only what was started is signalled: the child's PID, or with ``group=True`` its own process group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

_Child = TypeVar("_Child", bound="ChildProcess")

#: ``<name>: <kind> listening on <host>:<port>``; groups: name, kind, host, port.
LISTEN_LINE = re.compile(r"(\S+): (grpc|http|openai|metrics) listening on (\S+):(\d+)")

#: Runs in the child before the server (argv: CPU list, PDEATHSIG flag, then the server's argv): pin, ask for
#: SIGTERM when the parent dies, give SIGINT back its default action (a shell running the parent in the background
#: ignores it, and an ignored signal stays ignored across exec: the lab's first stop signal would be lost), then
#: exec the server in place. All three survive execve.
TRAMPOLINE = (
    "import ctypes, os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "cpus = [int(c) for c in sys.argv[1].split(',') if c]\n"
    "if cpus:\n"
    "    os.sched_setaffinity(0, cpus)\n"
    "if sys.argv[2] == '1':\n"
    "    try:\n"
    "        ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "    except Exception:\n"
    "        pass\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


class LaunchError(RuntimeError):
    """The child exited, or did not print its listening lines in time; the message carries its last output."""


def parse_cpu_list(text: str) -> set[int]:
    """``"0"``, ``"0,2"`` or ``"0-3,6"`` (taskset's list format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_group_members(pgid: int) -> list[int]:
    """PIDs of the live processes whose process group is ``pgid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # field 5 of stat: pgrp; a zombie is already gone
            members.append(int(entry))
    return members


class ChildProcess:
    """A server in a child process: started pinned, its output captured, its ports read from its output."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        want: Iterable[str] = ("grpc",),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        cpus: Collection[int] | None = None,
        log_path: str | Path | None = None,
        keep_lines: int | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """``want``: the listening kinds :meth:`start` waits for (none: it returns once the child is started);
        ``env``: the child's whole environment (default: this process's); ``keep_lines``: :attr:`lines` keeps at
        least that many of the last output lines, at most twice as many (default: all)."""
        self.argv = list(argv)
        self.want = tuple(want)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.cpus = set(cpus) if cpus else None
        self.log_path = Path(log_path) if log_path is not None else None
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[str] | None = None
        self.ports: dict[str, int] = {}
        self.lines: list[str] = []  # the output, line by line, newlines kept
        self.keep_lines = keep_lines
        self.started_at: float | None = None
        self._changed = threading.Condition()
        self._eof = False
        self._pump_thread: threading.Thread | None = None
        self._log: IO[str] | None = None

    # --------------------------------------------------------------------------- start
    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the child process was not started")
        return self.proc.pid

    def spawn(self: _Child) -> _Child:
        """Start the child; do not wait for anything."""
        if self.proc is not None:
            raise RuntimeError("the child process was already started")
        cpus = ",".join(str(c) for c in sorted(self.cpus or ()))
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "w", encoding="utf-8")
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TRAMPOLINE, cpus, "1" if self.die_with_parent else "0", *self.argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._pump_thread = threading.Thread(target=self._pump, name=f"child-{self.proc.pid}-output", daemon=True)
        self._pump_thread.start()
        return self

    def start(self: _Child, timeout: float = 60.0) -> _Child:
        """Start the child and wait (at most ``timeout`` s) until it listens on every kind in ``want``."""
        self.spawn()
        if self.want:
            self.wait_listening(self.want, timeout)
        return self

    def wait_listening(self, want: Iterable[str], timeout: float) -> dict[str, int]:
        """Wait until the child has printed a listening line for every kind in ``want``; return the ports."""
        wanted = set(want)
        deadline = time.monotonic() + timeout
        with self._changed:
            while not wanted <= set(self.ports):
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._changed.wait(min(left, 0.5))
        if not wanted <= set(self.ports):
            code = self.proc.poll() if self.proc is not None else None
            if code is None and self._eof:  # output closed: it is exiting
                try:
                    code = self.proc.wait(5) if self.proc is not None else None
                except subprocess.TimeoutExpired:
                    pass
            self.stop()
            why = f"exited with code {code}" if code is not None else f"did not listen within {timeout:.0f} s"
            raise LaunchError(f"{' '.join(self.argv[:4])} ... {why}; its last output:\n" + self.output(30))
        return {kind: self.ports[kind] for kind in wanted}

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.keep_lines is not None and len(self.lines) > 2 * self.keep_lines:
                del self.lines[: -self.keep_lines]  # trimmed in batches: O(1) a line on average
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            match = LISTEN_LINE.search(line)
            if match:
                with self._changed:
                    self.ports[match.group(2)] = int(match.group(4))
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    # --------------------------------------------------------------------------- watch
    def output(self, last: int | None = None) -> str:
        """The captured output (the last ``last`` lines)."""
        lines = list(self.lines)
        return "".join(lines[-last:] if last else lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def cpu_seconds(self, group: bool = False) -> float | None:
        """CPU time (user + system) of the child, or with ``group`` of every live process in its group."""
        if self.proc is None:
            return None
        if not group:
            return process_cpu_seconds(self.proc.pid)
        return sum(process_cpu_seconds(pid) or 0.0 for pid in self.group_pids())

    def group_pids(self) -> list[int]:
        """The live processes of the child's process group (the child and whatever it started)."""
        return process_group_members(self.proc.pid) if self.proc is not None else []

    # --------------------------------------------------------------------------- stop
    def send_signal(self, signum: int, group: bool = False) -> None:
        """``signum`` to the child (or to its process group); nothing if it is gone."""
        if self.proc is None:
            return
        try:
            if group:
                os.killpg(self.proc.pid, signum)
            elif self.proc.poll() is None:
                self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        if self.proc is None:
            raise RuntimeError("the child process was not started")
        return self.proc.wait(timeout)

    def wait_output_end(self, timeout: float) -> bool:
        """Wait until the output is read to its end (every process holding it, the child's own children too, has
        closed it); False if ``timeout`` passed first.  After ``wait`` the last lines may still be in the pipe."""
        with self._changed:
            return self._changed.wait_for(lambda: self._eof, timeout)

    def stop(self, timeout: float = 20.0, *, first_signal: int = signal.SIGTERM, group: bool = False) -> int | None:
        """Stop the child; returns its exit code (None if it was never started).

        ``first_signal`` to the child and ``timeout`` s to exit; then SIGKILL. With ``group``, SIGTERM to its
        whole process group (10 s) comes between the two, and what is left of the group gets the SIGKILL.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.send_signal(first_signal)
            self._wait_quietly(timeout)
        if group:
            if self.proc.poll() is None or self.group_pids():
                self.send_signal(signal.SIGTERM, group=True)
                self._wait_quietly(10.0)
                self._wait_group_gone(5.0)
            if self.group_pids():
                self.send_signal(signal.SIGKILL, group=True)
        elif self.proc.poll() is None:
            self.send_signal(signal.SIGKILL)
        self._wait_quietly(10.0)
        if group:
            self._wait_group_gone(10.0)
        if self._pump_thread is not None:
            self._pump_thread.join(2.0)
        if self._log is not None and (self._pump_thread is None or not self._pump_thread.is_alive()):
            self._log.close()
            self._log = None
        return self.proc.returncode

    def _wait_quietly(self, timeout: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def _wait_group_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self: _Child) -> _Child:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

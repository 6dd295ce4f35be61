"""Start and stop real ``fastoip serve`` processes on ephemeral loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from fastoip.launcher import ChildProcess


class ServerProcess:
    """A fastoip server in its own process; ports are read from its stdout."""

    def __init__(
        self,
        repository: Path | None,
        *extra: str,
        http: bool = False,
        metrics: bool = False,
        env: dict | None = None,
        grpc_frontend: str | None = None,
    ) -> None:
        args = [sys.executable, "-m", "fastoip.cli", "serve", "--host", "127.0.0.1", "--grpc-port", "0"]
        args += frontend_args(grpc_frontend)
        if repository is not None:
            args += ["--model-repository", str(repository)]
        args += ["--http-port", "0" if http else "-1", "--metrics-port", "0" if metrics else "-1"]
        args += ["--shutdown-grace", "0"]  # tests stop servers often; a test that wants a grace passes one
        args += list(extra)
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.grpc_frontend = grpc_frontend
        self.proc: subprocess.Popen | None = None
        self.child: ChildProcess | None = None
        self.grpc_port = 0
        self.http_port = 0
        self.metrics_port = 0
        self.lines: list[str] = []
        self._want = {"grpc", *(["http"] if http else []), *(["metrics"] if metrics else [])}

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        # the shared launcher (fastoip.launcher) starts it, reads the listening lines, captures the output
        self.child = ChildProcess(self.args, want=self._want, env=self.env)
        self.lines = self.child.lines
        try:
            self.child.start(timeout)
        finally:
            self.proc = self.child.proc
        for kind, port in self.child.ports.items():
            setattr(self, f"{kind}_port", port)
        return self

    def output(self) -> str:
        return "".join(self.lines)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code, once the server exited and its output (its workers' too) was read to the end."""
        assert self.proc is not None and self.child is not None
        code = self.proc.wait(timeout)
        self.child.wait_output_end(timeout)
        return code

    def stop(self, timeout: float = 30.0) -> int | None:
        return None if self.child is None else self.child.stop(timeout)  # SIGTERM, then SIGKILL after timeout

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@cache
def serve_help() -> str:
    """``fastoip serve --help`` of this build: which flags it has, and how they are spelled."""
    return subprocess.run(
        [sys.executable, "-m", "fastoip.cli", "serve", "--help"], capture_output=True, text=True, timeout=120
    ).stdout


def server_knows_frontend_flag() -> bool:
    """Whether this build's ``fastoip serve`` has ``--grpc-frontend`` (servers before the native frontend do not)."""
    return "--grpc-frontend" in serve_help()


def frontend_args(grpc_frontend: str | None) -> list[str]:
    """The serve flags that pick a gRPC frontend.

    ``native`` always names itself.  ``grpcio`` is named only where the flag exists: a server without the
    flag has only grpcio, and one with it may default to native, so the flag must then be explicit.
    """
    if grpc_frontend is None:
        return []
    if grpc_frontend == "native" or server_knows_frontend_flag():
        return ["--grpc-frontend", grpc_frontend]
    if grpc_frontend != "grpcio":
        raise ValueError(f"unknown gRPC frontend {grpc_frontend!r}: expected 'native' or 'grpcio'")
    return []


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds, asked every ``interval``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False

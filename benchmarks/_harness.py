"""Small helpers the single-purpose benchmark scripts share: a pinned fastoip, a pinned client command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the launcher, also when this runs outside fastoip's venv
from fastoip.launcher import ChildProcess, parse_cpu_list  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
SERVER_CPUS = os.environ.get("SERVER_CPUS", "0")
CLIENT_CPUS = os.environ.get("CLIENT_CPUS", "1")


def free_port() -> int:
    """A loopback TCP port free now, for a server that must be told its port (another server, an older tree)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


class Fastoip(ChildProcess):
    """``fastoip serve`` pinned to SERVER_CPUS on ephemeral ports, started by the shared launcher; its output goes to
    a temporary log file."""

    def __init__(self, repository: Path | None, *args: str, http: bool = False) -> None:
        argv = [PYTHON, "-m", "fastoip.cli", "serve", "--grpc-port", "0", "--http-port", "0" if http else "-1",
                "--metrics-port", "-1", "--log-level", "WARNING", *args]
        if repository is not None:
            argv += ["--model-repository", str(repository)]
        log = tempfile.NamedTemporaryFile("w+", prefix="fastoip-bench-", suffix=".log", delete=False)
        log.close()
        super().__init__(argv, want=("grpc", "http") if http else ("grpc",), env=env(),
                         cpus=parse_cpu_list(SERVER_CPUS), log_path=log.name)
        self.start(timeout=120)

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    def stop(self, timeout: float = 30.0, *, first_signal: int = signal.SIGTERM, group: bool = True) -> int | None:
        return super().stop(timeout, first_signal=first_signal, group=group)  # the server and what it started


def fastoip_bench(url: str, *args: str, timeout: float = 600) -> dict:
    """Run ``fastoip bench`` pinned to CLIENT_CPUS and return its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    argv = ["taskset", "-c", CLIENT_CPUS, PYTHON, "-m", "fastoip.cli", "bench", url, "--quiet", "--no-pin",
            "--json", path, *args]
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"fastoip bench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result = json.loads(Path(path).read_text())
    os.unlink(path)
    return result


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)

"""Small helpers the single-purpose benchmark scripts share: a pinned fastoip, a pinned client command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
SERVER_CPUS = os.environ.get("SERVER_CPUS", "0")
CLIENT_CPUS = os.environ.get("CLIENT_CPUS", "1")
LISTEN = re.compile(r"fastoip: (grpc|http) listening on [\d.]+:(\d+)")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


class Fastoip:
    """``fastoip serve`` pinned to SERVER_CPUS on ephemeral ports."""

    def __init__(self, repository: Path | None, *args: str, http: bool = False) -> None:
        argv = ["taskset", "-c", SERVER_CPUS, PYTHON, "-m", "fastoip.cli", "serve", "--grpc-port", "0",
                "--http-port", "0" if http else "-1", "--metrics-port", "-1", "--log-level", "WARNING", *args]
        if repository is not None:
            argv += ["--model-repository", str(repository)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="fastoip-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env(), start_new_session=True)
        self.ports: dict[str, int] = {}
        deadline = time.monotonic() + 120
        want = {"grpc", "http"} if http else {"grpc"}
        while time.monotonic() < deadline and set(self.ports) != want:
            if self.proc.poll() is not None:
                raise RuntimeError("fastoip exited:\n" + Path(self.log.name).read_text())
            for match in LISTEN.finditer(Path(self.log.name).read_text()):
                self.ports[match.group(1)] = int(match.group(2))
            time.sleep(0.1)
        if set(self.ports) != want:
            self.stop()
            raise RuntimeError("fastoip did not start:\n" + Path(self.log.name).read_text())

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def __enter__(self) -> Fastoip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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

"""The README's user sections run as written: every ```bash and ```python block between the ``user-doc`` markers.

Each bash block runs with ``bash -e`` in a fresh folder (the install block in a copy of the repository's tracked
files), as a new user would paste it; a section's Python snippets run (in this venv, which has the client
dependency README's install line names) while its server is up: before the block's closing ``kill %1``, as the
README says. The only change made to the text: the ports, so that tests never take 8000-8002 (the server reads
``FASTOIP_*_PORT``; ``localhost:8000`` and ``127.0.0.1:8001`` in the commands become the free ports).
Bounded: each block has a time limit, and whatever a block left running is ended with its process group.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _blocks(language: str) -> list[tuple[str, str]]:
    """(section title, text) of each ```<language> block of the user sections."""
    text = README.read_text()
    start, end = text.index("<!-- user-doc: start"), text.index("<!-- user-doc: end -->")
    blocks = []
    title = ""
    for match in re.finditer(rf"^## ([^\n]+)$|^```{language}\n(.*?)^```$", text[start:end], re.M | re.S):
        if match.group(1):
            title = match.group(1)
        else:
            blocks.append((title, match.group(2)))
    return blocks


def user_blocks() -> list[tuple[str, str]]:
    """(section title, bash text) of each ```bash block of the user sections."""
    return _blocks("bash")


def with_python_snippets(title: str, script: str) -> str:
    """The section's bash block with its Python snippets run before the closing ``kill %1`` (server still up)."""
    snippets = "".join(f"python - <<'PY'\n{code}PY\n" for section, code in _blocks("python") if section == title)
    head, kill, tail = script.rpartition("kill %1\n")
    return f"{head}{snippets}{kill}{tail}" if kill else script + snippets


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    ports = {name: _free_port() for name in ("GRPC", "HTTP", "METRICS")}
    env = {**os.environ, **{f"FASTOIP_{name}_PORT": str(port) for name, port in ports.items()}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's fastoip
    script = script.replace("localhost:8000", f"localhost:{ports['HTTP']}")
    script = script.replace("127.0.0.1:8001", f"127.0.0.1:{ports['GRPC']}")
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a server the block left running, if any
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_the_user_sections_have_the_blocks_a_user_needs() -> None:
    titles = [title for title, _ in user_blocks()]
    assert titles == ["Install", "Serve your own ONNX model", "Serve your own Python model"]
    # each Python snippet belongs to a section whose bash block runs a server, and needs what install names
    assert {title for title, _ in _blocks("python")} <= set(titles[1:])
    install = user_blocks()[0][1]
    for _, code in _blocks("python"):
        if "tritonclient" in code:
            assert "pip install '.[client]'" in install, "the install line must name the client dependency"


@pytest.mark.parametrize("index", [1, 2], ids=["onnx", "python"])
def test_serving_blocks_run_as_written(index: int, tmp_path: Path) -> None:
    title, script = user_blocks()[index]
    done = _run(with_python_snippets(title, script), tmp_path, timeout=180)
    assert done.returncode == 0, f"{title}:\n{done.stdout[-3000:]}"
    if "ONNX" in title:
        assert '"model_name":"mymodel"' in done.stdout and '"data":[0.0,1.0,2.0' in done.stdout
        # the tritonclient snippet's output (numpy's print of the identity's OUTPUT0)
        assert "[[ 0.  1.  2.  3." in done.stdout, done.stdout[-3000:]
    else:
        assert '"data":[11.0,22.0]' in done.stdout, done.stdout[-3000:]


@pytest.mark.timeout(900)
def test_the_install_block_runs_in_a_copy_of_the_repository(tmp_path: Path) -> None:
    """A fresh venv and ``pip install .`` from the tracked files: slow (it compiles the extensions)."""
    title, script = user_blocks()[0]
    assert title == "Install"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    copy = tmp_path / "fastoip"
    for name in tracked.decode().split("\0"):
        if name and (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    env_script = "unset PYTHONPATH VIRTUAL_ENV\n" + script
    done = _run(env_script, copy, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "fastoip 0." in done.stdout

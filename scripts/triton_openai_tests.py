#!/usr/bin/env python3
"""Run Triton's own OpenAI-frontend tests against fastoip, through a launcher shim (``make test-triton-openai``).

Usage: ``python scripts/triton_openai_tests.py SOURCE [--out DIR] [pytest args...]``

SOURCE is Triton's server repository: a checkout, a bare git directory (its HEAD is read), or nothing, and then
``git clone --depth 1`` of ``TRITON_SERVER_REF`` (default ``main``) from GitHub.  Triton's files are read from there
at run time into a scratch folder, never copied into this project.  In that folder:

- ``openai_frontend/main.py`` (what Triton's ``tests/utils.py`` starts as ``python3 main.py <args>``) is replaced
  by a launcher that translates Triton's frontend flags into ``fastoip serve`` flags and execs it: the OpenAI port
  (default 9000), ``--model-repository``, ``--model-control-mode``, ``--load-model``,
  ``--openai-restricted-api``, ``--http-max-input-size``, and ``--model-control-allow-code`` (Triton loads Python
  models through the API, fastoip only when the operator allows it); ``--enable-kserve-frontends`` opens HTTP
  and gRPC on the KServe ports (free ports unless given); the flags that pick Triton's engine
  (``--tokenizer``, ``--backend``, ``--tool-call-parser``, ...) are accepted and unused.
- ``engine/triton_engine.py`` and a ``tritonserver`` module are stubs: Triton's test helpers import them (for
  the in-process tests, which need Triton itself and are not run), and the real ones need Triton's C API.
- ``@pytest.mark.asyncio`` tests run on one event loop per test class (a small plugin; no pytest-asyncio).

The tests run are ``test_model_management.py``, ``test_openai_restricted_apis.py`` and ``test_openai_client.py``
with Triton's ``mock_llm`` model (``TEST_BACKEND=vllm``, ``TEST_MODEL=mock_llm``); the summary of what passed
is printed and written to ``DIR/summary.txt``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

TESTS = ["tests/test_model_management.py", "tests/test_openai_restricted_apis.py", "tests/test_openai_client.py"]
REPOSITORY_URL = "https://github.com/triton-inference-server/server"

LAUNCHER = '''"""fastoip's stand-in for Triton's OpenAI frontend: Triton's flags -> ``fastoip serve``."""
import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--model-repository", required=True)
parser.add_argument("--model-control-mode", default="none")
parser.add_argument("--load-model", action="append", default=[])
parser.add_argument("--openai-port", type=int, default=9000)
parser.add_argument("--openai-restricted-api", nargs=3, action="append", default=[])
parser.add_argument("--http-max-input-size", type=int, default=None)
parser.add_argument("--enable-kserve-frontends", action="store_true")
# Triton's defaults are 8000 / 8001; the tests never call them, and fixed ports collide on a shared machine
parser.add_argument("--kserve-http-port", type=int, default=0)
parser.add_argument("--kserve-grpc-port", type=int, default=0)
for unused in ("--tokenizer", "--backend", "--lora-separator", "--tritonserver-log-verbose-level", "--host",
               "--tool-call-parser", "--max-tool-call-parse-bytes", "--chat-template", "--default-max-tokens",
               "--uvicorn-log-level"):
    parser.add_argument(unused)
args = parser.parse_args()
command = [sys.executable, "-m", "fastoip.cli", "serve", "--host", "127.0.0.1",
           "--model-repository", args.model_repository, "--model-control-mode", args.model_control_mode,
           "--openai-port", str(args.openai_port), "--metrics-port", "-1", "--shutdown-grace", "0",
           # Triton loads Python models through its API; fastoip only when the operator allows it
           "--model-control-allow-code",
           # Triton's frontend starts tritonserver.Server, whose exit_on_error is true: a --load-model that fails
           # stops the start
           "--exit-on-error", "true"]
for model in args.load_model:
    command += ["--load-model", model]
for apis, key, value in args.openai_restricted_api:
    command += ["--openai-restricted-api", apis, key, value]
if args.http_max_input_size is not None:
    command += ["--http-max-input-size", str(args.http_max_input_size)]
if args.enable_kserve_frontends:
    command += ["--http-port", str(args.kserve_http_port), "--grpc-port", str(args.kserve_grpc_port)]
else:
    command += ["--http-port", "-1", "--allow-grpc", "false"]
os.execv(sys.executable, command)
'''

ENGINE_STUB = '''"""Stub: Triton's engine needs Triton's C API; only the subprocess tests run against fastoip."""


class TritonLLMEngine:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("Triton's in-process engine is not part of the fastoip run")
'''

TRITONSERVER_STUB = '''"""Stub of Triton's in-process Python API: its test helpers import it, the tests run do not."""
import enum


class ModelControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class Server:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("Triton's in-process server is not part of the fastoip run")
'''

ASYNCIO_PLUGIN = '''"""``@pytest.mark.asyncio`` tests, a class's on one event loop (no pytest-asyncio needed)."""
import asyncio
import inspect

import pytest

_loops = {}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    key = pyfuncitem.cls or pyfuncitem.module
    loop = _loops.setdefault(key, asyncio.new_event_loop())
    names = pyfuncitem._fixtureinfo.argnames
    loop.run_until_complete(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
'''


def extract(source: str | None, into: Path) -> None:
    """Triton's ``python/openai`` folder into ``into``."""
    if source is None:
        clone = into / "clone"
        ref = os.environ.get("TRITON_SERVER_REF", "main")
        subprocess.run(["git", "clone", "--depth", "1", "--branch", ref, REPOSITORY_URL, str(clone)], check=True)
        source = str(clone)
    path = Path(source)
    if (path / "python" / "openai").is_dir():
        shutil.copytree(path / "python" / "openai", into / "python" / "openai")
        return
    archive = subprocess.run(["git", "--git-dir", str(path), "archive", "--format=tar", "HEAD", "python/openai"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="Triton server checkout or bare git directory")
    parser.add_argument("--out", type=Path, default=None, help="where summary.txt goes (default: the scratch folder)")
    args, pytest_args = parser.parse_known_args()
    scratch = Path(tempfile.mkdtemp(prefix="triton-openai-"))
    extract(args.source, scratch)
    root = scratch / "python" / "openai"
    (root / "openai_frontend" / "main.py").write_text(LAUNCHER)
    (root / "openai_frontend" / "engine" / "triton_engine.py").write_text(ENGINE_STUB)
    stubs = scratch / "stubs"
    (stubs / "tritonserver").mkdir(parents=True)
    (stubs / "tritonserver" / "__init__.py").write_text(TRITONSERVER_STUB)
    (stubs / "fastoip_asyncio_shim.py").write_text(ASYNCIO_PLUGIN)
    # test_openai_client counts the models: a repository with mock_llm alone
    client_repository = scratch / "mock_llm_only"
    shutil.copytree(root / "tests" / "test_models" / "mock_llm", client_repository / "mock_llm")
    project_src = Path(__file__).resolve().parent.parent / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(stubs), str(project_src), os.environ.get("PYTHONPATH", "")]),
        # Triton's helper starts "python3 main.py": this interpreter, which has fastoip
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "TEST_BACKEND": "vllm", "TEST_MODEL": "mock_llm", "TEST_TOKENIZER": "unused",
        "TEST_MODEL_REPOSITORY": str(client_repository),
    }
    out = args.out or scratch
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fastoip_asyncio_shim", "-rA",
               "-o", "addopts=", "--timeout=600", *TESTS, *pytest_args]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    summary = [line for line in result.stdout.splitlines()
               if line.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")) or " passed" in line
               or " failed" in line]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    (out / "pytest.log").write_text(result.stdout + result.stderr)
    print("\n".join(summary))
    print(f"(the whole log: {out / 'pytest.log'})")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())

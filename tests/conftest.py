"""Shared fixtures: a demo repository on disk, a real server process on it, and the gRPC frontend to test.

``FASTOIP_TEST_GRPC_FRONTENDS`` (comma separated, e.g. ``native,grpcio``) picks the gRPC frontends that
frontend-parametrised tests run against; by default both where the native frontend was built, else grpcio.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

# tests/helpers holds what several test modules share (server processes, models, raw HTTP/2, PKI); the two rooms
# are tests/unit (no socket, no process) and tests/e2e (real processes and clients).
sys.path.insert(0, str(Path(__file__).parent / "helpers"))

import bytecode  # noqa: E402
import compiled  # noqa: E402
from schedule import longest_modules_first  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

# PYTHONDONTWRITEBYTECODE: the test modules' compiled forms are written while collecting, and only then (bytecode.py)
WRITES_FORBIDDEN = bytecode.writes_forbidden()
if WRITES_FORBIDDEN:
    bytecode.allow_writes_while_collecting()

# setup.py compiles the per-call path's modules (mypyc); a .py edited after that build would be shadowed by the old
# compiled module: the tests would run the old code.  Refuse, and say how to rebuild.
STALE = compiled.stale_modules()
if STALE:
    raise pytest.UsageError(
        f"compiled modules older than their source: {', '.join(STALE)}; rebuild them (`make build`, or "
        "`python setup.py build_ext --inplace`), or delete their .so files to run the interpreted code"
    )

KNOWN_FRONTENDS = ("native", "grpcio")

# tests/isolated: modules that need a process of their own (see its README); test_isolated_suites.py runs them
collect_ignore = [] if os.environ.get("FASTOIP_TEST_ISOLATED") else ["isolated"]


def native_frontend_built() -> bool:
    """Whether the native HTTP/2 engine of the native gRPC frontend imports in this environment."""
    try:
        importlib.import_module("fastoip.server.grpc._http2")
    except ImportError:
        return False
    return True


def selected_frontends() -> list[str]:
    raw = os.environ.get("FASTOIP_TEST_GRPC_FRONTENDS", "")
    if not raw.strip():
        return ["native", "grpcio"] if native_frontend_built() else ["grpcio"]
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in KNOWN_FRONTENDS]
    if unknown:
        raise pytest.UsageError(f"FASTOIP_TEST_GRPC_FRONTENDS: unknown frontend(s) {unknown}; known: {KNOWN_FRONTENDS}")
    if "native" in names and not native_frontend_built():
        raise pytest.UsageError(
            "FASTOIP_TEST_GRPC_FRONTENDS asks for native, but fastoip.server.grpc._http2 does not import (not built)"
        )
    return names


GRPC_FRONTENDS = selected_frontends()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long or memory-hungry; see the test's docstring for when it runs")
    # pytest-xdist's --dist loadfile would otherwise hand out modules by their number of tests, the longest last
    # (tests/helpers/schedule.py): keep the order pytest_collection_modifyitems makes
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if WRITES_FORBIDDEN and not hasattr(config, "workerinput"):  # the controller (or a serial run), once
        bytecode.compile_fastoip()


def pytest_collection_finish(session: pytest.Session) -> None:
    if WRITES_FORBIDDEN:
        bytecode.forbid_writes_again()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first, so that ``make test``'s workers finish together (tests/helpers/schedule.py)."""
    longest_modules_first(items, Path(__file__).parent)


@pytest.fixture(scope="module", params=GRPC_FRONTENDS)
def grpc_frontend(request: pytest.FixtureRequest) -> str:
    """The gRPC frontend a test's server runs; module scope so a module starts one server per frontend."""
    return str(request.param)


@pytest.fixture(scope="session")
def native_frontend() -> str:
    """For tests only the native frontend can pass (TLS flags, event-driven streams): skip when absent."""
    if "native" not in GRPC_FRONTENDS:
        pytest.skip("native gRPC frontend not selected (FASTOIP_TEST_GRPC_FRONTENDS) or not built")
    return "native"


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastoip.demo import write_repository

    return write_repository(tmp_path_factory.mktemp("demo-repo"))


@pytest.fixture(scope="session")
def server(demo_repo: Path):  # type: ignore[no-untyped-def]
    """One fastoip on the demo repository (server's default gRPC frontend), shared by read-only end-to-end tests."""
    with ServerProcess(demo_repo, http=False) as proc:
        yield proc


@pytest.fixture(scope="module")
def frontend_server(demo_repo: Path, grpc_frontend: str):  # type: ignore[no-untyped-def]
    """One fastoip on the demo repository per selected gRPC frontend, for the modules parametrised over it."""
    with ServerProcess(demo_repo, http=False, grpc_frontend=grpc_frontend) as proc:
        yield proc


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A throwaway CA with server and client certificates, for the TLS tests of either frontend."""
    from pki import make_pki  # cryptography: only where a TLS test runs (make test-compat's venv lacks it)

    return make_pki(tmp_path_factory.mktemp("pki"))

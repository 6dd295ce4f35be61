"""Shared fixtures: a demo repository on disk and a real server process on it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serverproc import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastoip.demo import write_repository

    return write_repository(tmp_path_factory.mktemp("demo-repo"))


@pytest.fixture(scope="session")
def server(demo_repo: Path):  # type: ignore[no-untyped-def]
    """One fastoip on the demo repository, shared by the read-only end-to-end tests."""
    with ServerProcess(demo_repo, http=False) as proc:
        yield proc

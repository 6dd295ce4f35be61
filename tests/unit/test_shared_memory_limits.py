"""Registrations bounded per client and in total (issue 36): the SIGBUS guard's mapping table is never exhausted."""

from __future__ import annotations

import os

import pytest

from fastoip.errors import ResourceExhausted
from fastoip.shared_memory import REGION_LIMIT, REGION_LIMIT_PER_CLIENT, SharedMemoryRegistry

#: The SIGBUS guard's table (_shmguard.h SHMGUARD_SLOTS).
GUARD_SLOTS = 4096


@pytest.fixture
def key():  # type: ignore[no-untyped-def]
    name = f"limits_{os.getpid()}"
    with open(os.path.join("/dev/shm", name), "wb") as f:
        f.truncate(4096)
    yield name
    os.unlink(os.path.join("/dev/shm", name))


def test_the_bounds_leave_the_guard_table_room() -> None:
    assert REGION_LIMIT_PER_CLIENT < REGION_LIMIT <= GUARD_SLOTS // 2


def test_per_client_then_total(key: str) -> None:
    registry = SharedMemoryRegistry(limit=5, limit_per_client=2)
    registry.register("a1", key, 0, 64, client="10.0.0.1")
    registry.register("a2", key, 0, 64, client="10.0.0.1")
    with pytest.raises(ResourceExhausted, match="already has 2 regions registered, the most one client may"):
        registry.register("a3", key, 0, 64, client="10.0.0.1")
    registry.register("b1", key, 0, 64, client="10.0.0.2")  # another client is not held up by the first
    registry.register("b2", key, 0, 64, client="10.0.0.2")
    registry.register("c1", key, 0, 64, client="10.0.0.3")
    with pytest.raises(ResourceExhausted, match="the server holds 5 shared memory regions, the most it takes"):
        registry.register("c2", key, 0, 64, client="10.0.0.3")
    registry.unregister("a1")  # given back: room for its client again, and in total
    registry.register("a3", key, 0, 64, client="10.0.0.1")
    registry.unregister()  # all: every count goes back to zero
    for index in range(2):
        registry.register(f"again{index}", key, 0, 64, client="10.0.0.1")
    assert len(registry.status()) == 2


def test_the_bounds_are_flags_checked_at_start() -> None:
    from fastoip.cli import serve_options
    from fastoip.triton_flags import FlagError

    options = serve_options(["--shared-memory-max-regions", "3", "--shared-memory-max-regions-per-client", "2"])
    assert (options.shared_memory_max_regions, options.shared_memory_max_regions_per_client) == (3, 2)
    defaults = serve_options([])
    assert (defaults.shared_memory_max_regions, defaults.shared_memory_max_regions_per_client) == (
        REGION_LIMIT, REGION_LIMIT_PER_CLIENT)
    for bad in (["--shared-memory-max-regions", "0"], ["--shared-memory-max-regions", str(GUARD_SLOTS)],
                ["--shared-memory-max-regions", "10", "--shared-memory-max-regions-per-client", "11"],
                ["--shared-memory-max-regions-per-client", "0"]):
        with pytest.raises(FlagError, match="--shared-memory-max-regions"):
            serve_options(bad)

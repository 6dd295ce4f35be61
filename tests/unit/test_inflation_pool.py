"""The inflation pool's turns, queue bound and server-wide budget (issue 37, server/inflate.py).

Before: the pool was a ThreadPoolExecutor: a message waited for every bomb ahead of it to finish (a 602 KB
request waited 7.5 s behind 8 bombs), its queue had no bound, and a lone bomb inflated to the 2 GiB message limit.
"""

from __future__ import annotations

import gzip
import threading
import zlib

import pytest

from fastoip.server.inflate import STEP_BYTES, InflateError, Inflation, InflationPool

GZIP = 31
MIB = 1024 * 1024


def bomb(inflated: int) -> bytes:
    return zlib.compress(b"\0" * inflated, 9)


class Outcomes:
    """What ``done`` got, in the order messages finished."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.results: dict[str, bytearray | InflateError] = {}
        self.all_done = threading.Event()
        self.expected = 0
        self.lock = threading.Lock()

    def done_for(self, name: str):  # type: ignore[no-untyped-def]
        def done(outcome: bytearray | InflateError) -> None:
            with self.lock:
                self.order.append(name)
                self.results[name] = outcome
                if len(self.order) == self.expected:
                    self.all_done.set()
        return done


def test_a_small_message_takes_its_turn_between_bombs_steps() -> None:
    pool = InflationPool(threads=1, budget=1 << 40, max_waiting=16)
    outcomes = Outcomes()
    names = [f"bomb{i}" for i in range(4)]
    outcomes.expected = 5
    packed = bomb(64 * MIB)  # (made before any is submitted: making one takes longer than inflating it)
    small = bytes(range(256)) * 2400  # 600 KB
    packed_small = gzip.compress(small)
    for name in names:
        assert pool.submit(Inflation(packed, 15, 1 << 31, "deflate"), outcomes.done_for(name)) is None
    assert pool.submit(Inflation(packed_small, GZIP, 1 << 31, "gzip"), outcomes.done_for("small")) is None
    assert outcomes.all_done.wait(60)
    assert outcomes.order[0] == "small", outcomes.order  # one step of each bomb ahead of it, not whole bombs
    assert outcomes.results["small"] == small
    assert all(len(outcomes.results[name]) == 64 * MIB for name in names)  # type: ignore[arg-type]
    assert pool.held == 0


def test_a_lone_bomb_stops_at_the_budget() -> None:
    pool = InflationPool(threads=1, budget=8 * MIB)
    with pytest.raises(InflateError) as info:
        pool.run_here(Inflation(bomb(256 * MIB), 15, 1 << 31, "deflate"))
    assert info.value.kind == "over_budget", info.value.message
    assert "--max-inflated-request-bytes" in info.value.message
    assert pool.held == 0


def test_over_the_budget_the_largest_holder_is_refused() -> None:
    pool = InflationPool(threads=2, budget=24 * MIB)
    outcomes = Outcomes()
    outcomes.expected = 3
    pool.submit(Inflation(bomb(512 * MIB), 15, 1 << 31, "deflate"), outcomes.done_for("bomb"))
    data = b"x" * (12 * MIB)
    pool.submit(Inflation(zlib.compress(data), 15, 1 << 31, "deflate"), outcomes.done_for("a"))
    pool.submit(Inflation(zlib.compress(data), 15, 1 << 31, "deflate"), outcomes.done_for("b"))
    assert outcomes.all_done.wait(60)
    refused = outcomes.results["bomb"]
    assert isinstance(refused, InflateError) and refused.kind in ("busy", "over_budget"), refused
    assert outcomes.results["a"] == data and outcomes.results["b"] == data
    assert pool.held == 0


def test_a_full_pool_refuses_at_once() -> None:
    pool = InflationPool(threads=1, budget=1 << 40, max_waiting=2)
    outcomes = Outcomes()
    outcomes.expected = 2
    packed = bomb(256 * MIB)
    for name in ("one", "two"):
        assert pool.submit(Inflation(packed, 15, 1 << 31, "deflate"), outcomes.done_for(name)) is None
    refusal = pool.submit(Inflation(packed, 15, 1 << 31, "deflate"), outcomes.done_for("three"))
    assert refusal is not None and refusal.kind == "busy", refusal
    assert outcomes.all_done.wait(60)
    assert "three" not in outcomes.results
    assert pool.held == 0
    assert STEP_BYTES <= 1 * MIB

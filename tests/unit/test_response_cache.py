"""The response cache on its own: keys, LRU within a byte budget, one execution for identical requests."""

from __future__ import annotations

import numpy as np
import pytest

from fastoip.response_cache import CacheSettings, ResponseCache, request_key
from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput


def request(values: list[int], request_id: str = "", outputs: list[str] | None = None) -> InferRequest:
    data = np.array([values], dtype=np.int32)
    return InferRequest(
        "m",
        "",
        request_id,
        inputs=[InferInput("INPUT0", "INT32", data.shape, data)],
        outputs=[RequestedOutput(name) for name in outputs or []],
    )


def response(req: InferRequest, nbytes: int = 64) -> InferResponse:
    data = np.zeros(nbytes // 4, dtype=np.int32)
    return InferResponse(req.model_name, "1", req.id, outputs=[InferOutput("OUTPUT0", "INT32", data.shape, data)])


def test_key_depends_on_every_part_of_the_request() -> None:
    base = request_key(request([1, 2]), "m", "1")
    assert base == request_key(request([1, 2], request_id="other id"), "m", "1")
    assert base != request_key(request([1, 3]), "m", "1")
    assert base != request_key(request([1, 2]), "m", "2")
    assert base != request_key(request([1, 2]), "n", "1")
    assert base != request_key(request([1, 2], outputs=["OUTPUT0"]), "m", "1")


def test_bytes_elements_are_length_prefixed() -> None:
    def bytes_request(items: list[bytes]) -> InferRequest:
        data = np.array(items, dtype=object)
        return InferRequest("m", inputs=[InferInput("T", "BYTES", data.shape, data)])

    assert request_key(bytes_request([b"ab", b"c"]), "m", "1") != request_key(bytes_request([b"a", b"bc"]), "m", "1")


def test_hit_returns_an_owned_copy_with_the_callers_id() -> None:
    cache = ResponseCache(1 << 20)
    first = request([1, 2], "a")
    key = request_key(first, "m", "1")
    assert cache.claim(key, first, lambda r, e: None) is True
    live = response(first)
    assert cache.complete(key, live, None) == []
    live.outputs[0].data[:] = 7  # the live buffer is reused by the next batch
    hit = cache.claim(key, request([1, 2], "b"), lambda r, e: None)
    assert isinstance(hit, InferResponse)
    assert hit.id == "b"
    assert not hit.outputs[0].data.any()
    assert not hit.outputs[0].data.flags.writeable


def test_identical_requests_in_flight_run_once() -> None:
    cache = ResponseCache(1 << 20)
    leader = request([5], "leader")
    key = request_key(leader, "m", "1")
    assert cache.claim(key, leader, lambda r, e: None) is True
    got: list[tuple[str, InferResponse | None, BaseException | None]] = []
    for i in range(3):
        follower = request([5], f"f{i}")
        assert cache.claim(key, follower, lambda r, e, i=i: got.append((f"f{i}", r, e))) is False
    for waiter, answer, error in cache.complete(key, response(leader), None):
        waiter(answer, error)
    expected = [("f0", "f0", None), ("f1", "f1", None), ("f2", "f2", None)]
    assert [(name, r.id if r else None, e) for name, r, e in got] == expected


def test_a_failure_is_not_stored_and_reaches_the_waiters() -> None:
    cache = ResponseCache(1 << 20)
    leader = request([9])
    key = request_key(leader, "m", "1")
    cache.claim(key, leader, lambda r, e: None)
    errors: list[BaseException | None] = []
    cache.claim(key, request([9]), lambda r, e: errors.append(e))
    boom = RuntimeError("backend failed")
    for waiter, answer, error in cache.complete(key, None, boom):
        waiter(answer, error)
    assert errors == [boom]
    assert len(cache) == 0
    assert cache.claim(key, leader, lambda r, e: None) is True  # the next one runs again


def test_a_leaders_own_error_hands_the_key_to_the_first_waiter() -> None:
    """Issue 37: a leader cancelled or past its deadline failed every identical request waiting on it."""
    from fastoip.errors import Cancelled
    from fastoip.response_cache import TAKE_OVER

    cache = ResponseCache(1 << 20)
    leader = request([7], "leader")
    key = request_key(leader, "m", "1")
    assert cache.claim(key, leader, lambda r, e: None) is True
    got: list[tuple[str, InferResponse | None, BaseException | None]] = []
    for i in range(3):
        assert cache.claim(key, request([7], f"f{i}"), lambda r, e, i=i: got.append((f"f{i}", r, e))) is False
    for waiter, answer, error in cache.complete(key, None, Cancelled("request cancelled by the client"), True):
        waiter(answer, error)
    assert got == [("f0", None, TAKE_OVER)]  # f0 runs now; f1 and f2 wait on it
    assert cache.claim(key, request([7], "late"), lambda r, e: got.append(("late", r, e))) is False
    for waiter, answer, error in cache.complete(key, response(request([7], "f0")), None):
        waiter(answer, error)
    assert [(name, r.id if r else None, e) for name, r, e in got[1:]] == [
        ("f1", "f1", None), ("f2", "f2", None), ("late", "late", None)]


def test_least_recently_used_goes_first_within_the_budget() -> None:
    cache = ResponseCache(256)
    keys = []
    for i in range(4):
        req = request([i])
        key = request_key(req, "m", "1")
        keys.append(key)
        cache.claim(key, req, lambda r, e: None)
        cache.complete(key, response(req, 64), None)
    assert len(cache) == 4 and cache.used_bytes == 256
    assert isinstance(cache.claim(keys[0], request([0]), lambda r, e: None), InferResponse)  # 0 is now recent
    extra = request([99])
    extra_key = request_key(extra, "m", "1")
    cache.claim(extra_key, extra, lambda r, e: None)
    cache.complete(extra_key, response(extra, 64), None)
    assert cache.evictions == 1
    assert cache.claim(keys[1], request([1]), lambda r, e: None) is True  # 1 was the least recently used
    assert isinstance(cache.claim(keys[0], request([0]), lambda r, e: None), InferResponse)


def test_an_entry_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(32)
    req = request([1])
    key = request_key(req, "m", "1")
    cache.claim(key, req, lambda r, e: None)
    cache.complete(key, response(req, 64), None)
    assert len(cache) == 0 and cache.used_bytes == 0


def test_cache_config_parses_tritons_spelling() -> None:
    assert CacheSettings.parse(["local,size=1048576"]).size_bytes == 1048576
    assert not CacheSettings.parse([]).enabled
    for bad in ("redis,host=x", "local,capacity=5", "local,size=lots", "local,size=-1"):
        with pytest.raises(ValueError, match="cache-config"):
            CacheSettings.parse([bad])

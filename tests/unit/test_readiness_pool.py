"""core/readiness_pool.py: readiness questions that may wait on a model are bounded, and one more is refused."""

from __future__ import annotations

import threading

import pytest

from fastoip.core.readiness_pool import ReadinessPool
from fastoip.errors import ResourceExhausted


def test_past_its_bound_a_question_is_refused_at_once_and_answered_ones_make_room() -> None:
    pool = ReadinessPool(threads=1, max_waiting=2)
    model_answers = threading.Event()
    try:
        held = [pool.submit(model_answers.wait, 30) for _ in range(2)]  # one asking, one queued: both count
        with pytest.raises(ResourceExhausted) as refused:
            pool.submit(lambda: True)
        assert refused.value.retry_after == 1 and refused.value.http_status == 503
        assert "readiness requests are waiting" in refused.value.message
        model_answers.set()
        assert all(f.result(timeout=30) for f in held)
        assert pool.submit(lambda: "ready").result(timeout=30) == "ready"  # room again
    finally:
        model_answers.set()
        pool.shutdown(wait=True)


def test_a_question_that_fails_gives_its_place_back() -> None:
    pool = ReadinessPool(threads=1, max_waiting=1)
    try:
        def fails() -> bool:
            raise RuntimeError("the model's check failed")

        with pytest.raises(RuntimeError):
            pool.submit(fails).result(timeout=30)
        assert pool.submit(lambda: True).result(timeout=30) is True
    finally:
        pool.shutdown(wait=True)

"""BLS call chains and the Core's wait graph (scheduling/call_chain.py; issue 36): a request that every instance of
its model waits for is refused, whether the wait is on its own chain or through other requests' calls in flight."""

from __future__ import annotations

from fastoip.scheduling.call_chain import WaitGraph, chain_of_call, reentry_refusal


def _e(model: str, index: int = 0) -> tuple[str, str, int]:
    return (model, "1", index)


def test_a_call_chain_is_the_held_chains_then_the_caller() -> None:
    held = [(_e("a"),), (_e("x"), _e("a")), ()]
    assert chain_of_call(_e("b"), held) == (_e("a"), _e("x"), _e("b"))
    assert chain_of_call(_e("b"), [(_e("b"), _e("a"))]) == (_e("a"), _e("b"))  # the caller last, once


def test_a_model_with_an_instance_off_the_chain_is_not_refused() -> None:
    assert reentry_refusal("a", "1", 1, (_e("a"),)) is not None
    assert reentry_refusal("a", "1", 2, (_e("a"),)) is None
    assert "all 2 of its instances" in (reentry_refusal("a", "1", 2, (_e("a", 0), _e("b"), _e("a", 1))) or "")
    assert reentry_refusal("a", "2", 1, (_e("a"),)) is None  # another version is another model
    message = reentry_refusal("a", "1", 1, (_e("a"), _e("b"))) or ""
    assert "model 'b' sent a BLS request to model 'a' that waits for itself ('a' -> 'b' -> 'a')" in message


def test_two_requests_entering_one_cycle_from_both_ends() -> None:
    graph = WaitGraph()
    assert graph.enter("b", "1", 1, (_e("a"),)) is None  # a0 calls b (b0 busy with another request)
    message = graph.enter("a", "1", 1, (_e("b"),))  # b0 calls a: a0 waits on b0
    assert message is not None and "whose own BLS call waits for this one's caller" in message
    graph.leave("b", "1", (_e("a"),))
    assert graph.enter("a", "1", 1, (_e("b"),)) is None  # a0's call ended: b0's may wait for a0


def test_a_model_with_a_free_instance_still_runs_it() -> None:
    graph = WaitGraph()
    assert graph.enter("b", "1", 2, (_e("a"),)) is None  # a0 calls b, which has two instances
    assert graph.enter("a", "1", 1, (_e("b", 0),)) is None  # a0 waits on b, but b1 may answer it


def test_a_wait_through_three_models_is_found() -> None:
    graph = WaitGraph()
    assert graph.enter("b", "1", 1, (_e("a"),)) is None  # a0 -> b
    assert graph.enter("a", "1", 1, (_e("c"),)) is None  # c0 -> a (a0 waits on b0, which waits on nobody)
    message = graph.enter("c", "1", 1, (_e("b"),))  # b0 -> c: c0 waits on a0, which waits on b0
    assert message is not None and "refused" in message
    for _ in range(3):  # leaving more often than entering is harmless
        graph.leave("a", "1", (_e("c"),))
    assert graph.enter("c", "1", 1, (_e("b"),)) is None

"""Held wake-ups (``scheduling/wakeups.py``): a thread that queues a burst wakes each batcher once, at its end.

The module's own rules first (thread-local, once per scheduler, ``schedule`` once per burst), then a real
``DynamicBatcher`` with its instance thread: jobs queued while wake-ups are held run after ``release``,
with one wake-up for the whole burst; a thread that holds nothing still wakes at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
from test_scheduling_batcher import RowModel, job, make_batcher

from fastoip.scheduling import wakeups
from fastoip.scheduling.batcher import INLINE_MAX_BYTES, INLINE_MAX_NS, DynamicBatcher
from fastoip.scheduling.job import Job


@pytest.fixture
def held() -> Iterator[list[int]]:
    """This thread holds its wake-ups for the test; the list counts the calls of ``schedule``."""
    scheduled: list[int] = []
    wakeups.hold(lambda: scheduled.append(1))
    try:
        yield scheduled
    finally:
        wakeups.release()
        wakeups._held.pending = None  # back to a thread that holds nothing
        wakeups._held.schedule = None


def test_a_thread_that_holds_nothing_wakes_at_once() -> None:
    assert wakeups.wake_later(lambda: None) is False


def test_held_wake_ups_run_once_each_in_order_at_release(held: list[int]) -> None:
    ran: list[str] = []

    def first() -> None:
        ran.append("first")

    def second() -> None:
        ran.append("second")

    assert wakeups.wake_later(first) and wakeups.wake_later(second) and wakeups.wake_later(first)
    assert ran == [] and held == [1]  # one release asked for the whole burst
    wakeups.release()
    assert ran == ["first", "second"]
    wakeups.release()  # nothing left
    assert ran == ["first", "second"]
    assert wakeups.wake_later(first)  # the next burst asks for its own release
    assert held == [1, 1]


def test_the_hold_belongs_to_the_thread_that_asked(held: list[int]) -> None:
    seen: list[bool] = []
    other = threading.Thread(target=lambda: seen.append(wakeups.wake_later(lambda: None)))
    other.start()
    other.join(5)
    assert seen == [False] and held == []


def threaded_batcher(model: RowModel) -> DynamicBatcher:
    plain = make_batcher(time.monotonic_ns, model, delay_us=0, threads=False)  # type: ignore[arg-type]
    return DynamicBatcher(plain.context, plain.instances, None, clock=time.monotonic_ns)  # type: ignore[arg-type]


def count_held_wake_ups() -> list[int]:
    """Wrap each wake-up this thread holds now so that it counts its calls (the batcher is a compiled class: its
    ``wake`` cannot be overridden by a test's subclass)."""
    calls: list[int] = []
    pending = wakeups._held.pending
    assert pending is not None

    def counted(wake: Callable[[], object]) -> Callable[[], object]:
        return lambda: (calls.append(1), wake())

    wakeups._held.pending = {counted(wake): None for wake in pending}
    return calls


DONE: dict[int, threading.Event] = {}


def watched(j: Job) -> Job:
    """``j`` with an event set when it finishes (registered before it is queued)."""
    event = DONE[id(j)] = threading.Event()
    j.on_done(lambda _: event.set())
    return j


def finished_within(jobs: list[Job], seconds: float = 10) -> bool:
    """Whether every watched job finished within ``seconds``."""
    deadline = time.monotonic() + seconds
    return all(DONE[id(j)].wait(max(deadline - time.monotonic(), 0)) for j in jobs)


def test_a_burst_queued_while_held_runs_after_one_wake_up(held: list[int]) -> None:
    model = RowModel()
    batcher = threaded_batcher(model)
    try:
        burst = [watched(job(1)) for _ in range(8)]
        for j in burst:
            batcher.enqueue(j)
        assert held == [1] and list(wakeups._held.pending or {}) == [batcher.wake]  # one wake-up, not yet run
        wakes = count_held_wake_ups()
        wakeups.release()
        assert wakes == [1]
        assert finished_within(burst)
        for j in burst:
            np.testing.assert_array_equal(j.wait().output("SUM").data, [[3.0]])
        assert sum(size for size, _ in model.batches) == 8
    finally:
        batcher.stop()


def test_another_thread_queues_and_wakes_at_once_while_this_one_holds(held: list[int]) -> None:
    model = RowModel()
    batcher = threaded_batcher(model)
    try:
        queued = watched(job(1))
        other = threading.Thread(target=batcher.enqueue, args=(queued,))
        other.start()
        other.join(5)
        assert finished_within([queued])
        np.testing.assert_array_equal(queued.wait().output("SUM").data, [[3.0]])
        assert wakeups._held.pending == {} and held == []  # notified directly, nothing held here
    finally:
        batcher.stop()


class ThreadNoting(RowModel):
    """A RowModel that notes the thread each batch ran on, and can take ``cpu_ns`` of CPU time a batch."""

    def __init__(self, cpu_ns: int = 0) -> None:
        super().__init__()
        self.threads: list[int] = []
        self.cpu_ns = cpu_ns

    def run(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
            destinations: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        self.threads.append(threading.get_ident())
        end = time.thread_time_ns() + self.cpu_ns
        while time.thread_time_ns() < end:
            pass
        return super().run(feeds, output_names, destinations)


def burst(batcher: DynamicBatcher, count: int, width: int = 3) -> list[Job]:
    """``count`` jobs (one row of ``width`` FP32 each) queued while this thread holds its wake-ups, then released."""
    jobs = [watched(job(1, width)) for _ in range(count)]
    for j in jobs:
        batcher.enqueue(j)
    wakeups.release()
    return jobs


def settled(batcher: DynamicBatcher, seconds: float = 10) -> None:
    """Wait until the batcher's last batch is counted and its instance free (that happens just after the batch's
    jobs finish, on the thread that ran it)."""
    deadline = time.monotonic() + seconds
    while (batcher._batch_ns < 0 or batcher._busy) and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_quick_models_burst_runs_on_the_releasing_thread(held: list[int]) -> None:
    """Once a batch was measured quick (``INLINE_MAX_NS`` of CPU time), the thread that releases a burst
    runs it itself (the event loop's, in the server): no hand-off to the instance thread and back."""
    model = ThreadNoting()
    batcher = threaded_batcher(model)
    try:
        first = burst(batcher, 4)
        assert finished_within(first)
        assert model.threads[0] != threading.get_ident()  # nothing measured yet: the instance thread ran it
        settled(batcher)
        if batcher._batch_ns > INLINE_MAX_NS:  # an interpreted build on a busy machine may be this slow
            pytest.skip(f"the first batch took {batcher._batch_ns} ns of CPU: over INLINE_MAX_NS here")
        second = burst(batcher, 5)
        assert all(j.finished for j in second)  # ran inside release(), on this thread
        assert model.threads[-1] == threading.get_ident() and model.batches[-1][0] == 5
        for j in first + second:
            np.testing.assert_array_equal(j.wait().output("SUM").data, [[3.0]])
        stats = batcher.context.stats.snapshot()  # executions are recorded as on the instance thread
        assert (stats["inference_count"], stats["execution_count"]) == (9, len(model.batches))
    finally:
        batcher.stop()


def test_a_slow_models_burst_stays_on_the_instance_thread(held: list[int]) -> None:
    """A model whose batches take more than ``INLINE_MAX_NS`` of CPU never holds the releasing thread."""
    model = ThreadNoting(cpu_ns=INLINE_MAX_NS * 2)
    batcher = threaded_batcher(model)
    try:
        for count in (3, 4):
            assert finished_within(burst(batcher, count))
        assert threading.get_ident() not in model.threads and len(model.threads) >= 2
    finally:
        batcher.stop()


def test_a_quick_models_large_inputs_stay_on_the_instance_thread(held: list[int]) -> None:
    """Batches whose inputs average over ``INLINE_MAX_BYTES`` never hold the releasing thread (an event loop
    would stop reading and writing while the model copies them), however quick the model."""
    model = ThreadNoting()
    batcher = threaded_batcher(model)
    width = INLINE_MAX_BYTES // 4  # one row of FP32 is INLINE_MAX_BYTES: a batch of two is over
    try:
        for count in (2, 3, 2):
            assert finished_within(burst(batcher, count, width))
        assert threading.get_ident() not in model.threads and len(model.threads) >= 3
    finally:
        batcher.stop()


def test_a_batcher_that_waits_out_a_delay_never_runs_on_the_releasing_thread(held: list[int]) -> None:
    """With ``max_queue_delay_microseconds`` the batch may have to wait: only the instance thread waits."""
    model = ThreadNoting()
    plain = make_batcher(time.monotonic_ns, model, delay_us=200, threads=False)  # type: ignore[arg-type]
    batcher = DynamicBatcher(plain.context, plain.instances, None, clock=time.monotonic_ns)  # type: ignore[arg-type]
    try:
        for count in (3, 4, 5):
            assert finished_within(burst(batcher, count))
        assert threading.get_ident() not in model.threads
    finally:
        batcher.stop()

"""The dynamic batcher's decisions, in-process, on a controllable clock (no sleeps, no threads).

Each test queues jobs, then calls ``DynamicBatcher.step()``, which forms at most
one batch at the clock's time and runs it on a tiny deterministic backend that
records every batch it was given.  The rules are Triton's (core
``dynamic_batch_scheduler.cc``, ``GetDynamicBatch``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from fastoip._proto import model_config_pb2 as mc
from fastoip.errors import Cancelled, DeadlineExceeded, InferenceError, InternalError, Unavailable
from fastoip.metrics import VersionCounters
from fastoip.scheduling.batcher import BatchQueue, DynamicBatcher
from fastoip.scheduling.buffers import BufferPool
from fastoip.scheduling.contract import Backend, ExecutionContext, TensorModel
from fastoip.scheduling.direct import DirectScheduler
from fastoip.scheduling.execute import TensorBackend
from fastoip.scheduling.job import Job, input_signature
from fastoip.types import InferInput, InferRequest, ParameterValue

MS = 1_000_000  # ns


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now_ns = 1_000 * MS

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns


class RowModel:
    """Deterministic tensor model: ``SUM`` = row sums of X, ``DOUBLE`` = 2 * X.  Records each batch."""

    on_gpu = False

    def __init__(self) -> None:
        self.batches: list[tuple[int, tuple[str, ...]]] = []
        self.fail_with: Exception | None = None

    def run(
        self,
        feeds: dict[str, np.ndarray],
        output_names: Sequence[str],
        destinations: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        x = feeds["X"]
        self.batches.append((x.shape[0], tuple(output_names)))
        if self.fail_with is not None:
            raise self.fail_with
        computed = {"SUM": x.sum(axis=1, keepdims=True), "DOUBLE": x * 2}
        return [computed[name] for name in output_names]

    def is_ready(self) -> bool:
        return True

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        self.batches.clear()


def make_batcher(
    clock: Clock,
    model: RowModel,
    *,
    max_batch_size: int = 8,
    preferred: Sequence[int] = (),
    delay_us: int = 100_000,
    threads: bool = False,
    **batching: Any,
) -> DynamicBatcher:
    """A batcher on ``model``; without ``threads`` nothing runs but what ``step()`` runs."""
    config = mc.ModelConfig(name="rows", max_batch_size=max_batch_size)
    config.dynamic_batching.CopyFrom(
        mc.ModelDynamicBatching(
            preferred_batch_size=list(preferred), max_queue_delay_microseconds=delay_us, **batching
        )
    )
    context = ExecutionContext(
        name="rows",
        version_str="1",
        config=config,
        batching=max_batch_size > 0,
        output_datatypes={"SUM": "FP32", "DOUBLE": "FP32"},
        stats=VersionCounters("rows", "1"),
        buffers=BufferPool(),
        signature=functools.partial(input_signature, batching=max_batch_size > 0),
    )
    executor = ThreadPoolExecutor(1)
    return DynamicBatcher(context, [TensorBackend(model, context)], executor, clock=clock, start_threads=threads)


def job(
    rows: int,
    width: int = 3,
    outputs: Sequence[str] = ("SUM", "DOUBLE"),
    **parameters: ParameterValue,
) -> Job:
    data = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    request = InferRequest("rows", inputs=[InferInput("X", "FP32", data.shape, data)], parameters=dict(parameters))
    return Job(request, {"X": data}, rows, list(outputs))


def data(j: Job, output: str) -> np.ndarray:
    """The array of one output of a finished job."""
    array = j.wait().output(output).data
    assert array is not None
    return array


def sizes(jobs: Sequence[Job]) -> list[int]:
    return [j.batch_size for j in jobs]


def error_of(j: Job) -> InferenceError:
    with pytest.raises(InferenceError) as caught:
        j.wait()
    return caught.value


def test_the_test_model_and_its_adapter_meet_the_contract() -> None:
    clock = Clock()
    model = RowModel()
    assert isinstance(model, TensorModel)
    batcher = make_batcher(clock, model)
    assert all(isinstance(instance, Backend) for instance in batcher.instances)


def test_a_request_past_the_largest_preferred_size_runs_at_once() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2, 6))
    big = job(7)
    batcher.enqueue(big)
    ran, _ = batcher.step()
    assert ran == [big]
    assert data(big, "SUM").shape == (7, 1)


def test_the_request_that_would_pass_the_largest_preferred_size_waits_for_the_next_batch() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2, 6))
    three, four = job(3), job(4)
    batcher.enqueue(three)
    batcher.enqueue(four)
    ran, _ = batcher.step()
    assert ran == [three]  # 3 + 4 > 6: the 3 runs now, alone
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 100 * MS  # the 4 is below every preferred size: it waits the delay
    clock.advance(100 * MS)
    ran, _ = batcher.step()
    assert ran == [four]
    assert backend.batches == [(3, ("SUM", "DOUBLE")), (4, ("SUM", "DOUBLE"))]


def test_reaching_a_preferred_size_runs_at_once_and_the_largest_found_wins() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2, 6))
    jobs = [job(2), job(2), job(2)]
    for j in jobs:
        batcher.enqueue(j)
    ran, _ = batcher.step()
    assert ran == jobs  # 2 is preferred, 6 is preferred and larger
    assert backend.batches == [(6, ("SUM", "DOUBLE"))]


def test_a_smaller_preferred_size_runs_before_the_delay() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2, 6))
    first, second = job(1), job(1)
    batcher.enqueue(first)
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 100 * MS
    clock.advance(30 * MS)
    batcher.enqueue(second)
    ran, _ = batcher.step()
    assert ran == [first, second]


def test_past_max_batch_size_the_pending_batch_runs_at_once() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, max_batch_size=8)  # preferred defaults to [8]
    five, four = job(5), job(4)
    batcher.enqueue(five)
    batcher.enqueue(four)
    ran, _ = batcher.step()
    assert ran == [five]
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 100 * MS


def test_without_preferred_sizes_a_batch_waits_the_delay_then_runs_whole() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, max_batch_size=8)
    jobs = [job(1), job(2), job(3)]
    for j in jobs:
        batcher.enqueue(j)
        clock.advance(10 * MS)
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 70 * MS  # counted from the oldest request
    clock.advance(wait_ns)
    ran, _ = batcher.step()
    assert ran == jobs


def test_with_no_delay_the_best_preferred_batch_runs_and_the_rest_next() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2, 6), delay_us=0)
    jobs = [job(1), job(1), job(1)]
    for j in jobs:
        batcher.enqueue(j)
    assert sizes(batcher.step()[0]) == [1, 1]
    assert sizes(batcher.step()[0]) == [1]
    assert batcher.step() == ([], -1)


def test_a_request_of_another_shape_closes_the_batch_and_does_not_wait_behind_it() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(4,))
    narrow, wide, narrow_again = job(1, width=3), job(1, width=4), job(1, width=3)
    for j in (narrow, wide, narrow_again):
        batcher.enqueue(j)
    assert batcher.step()[0] == [narrow]  # the wide one closes it
    assert batcher.step()[0] == [wide]  # and runs next, closed in turn by the narrow one behind it
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 100 * MS  # the last one is alone: it waits
    assert data(wide, "DOUBLE").shape == (1, 4)


def test_requests_asking_for_different_outputs_batch_together_and_get_only_theirs() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(3,))
    sums, doubles, both = job(1, outputs=["SUM"]), job(1, outputs=["DOUBLE"]), job(1, outputs=["DOUBLE", "SUM"])
    for j in (sums, doubles, both):
        batcher.enqueue(j)
    assert batcher.step()[0] == [sums, doubles, both]
    assert backend.batches == [(3, ("SUM", "DOUBLE"))]  # one execution computes the union
    assert [o.name for o in sums.wait().outputs] == ["SUM"]
    assert [o.name for o in doubles.wait().outputs] == ["DOUBLE"]
    assert [o.name for o in both.wait().outputs] == ["DOUBLE", "SUM"]
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    np.testing.assert_array_equal(data(sums, "SUM"), x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(data(doubles, "DOUBLE"), x * 2)
    np.testing.assert_array_equal(data(both, "SUM"), x.sum(axis=1, keepdims=True))


def test_higher_priority_runs_first() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, max_batch_size=1, delay_us=0, priority_levels=2, default_priority_level=2)
    low, high = job(1), job(1, priority=1)
    batcher.enqueue(low)
    batcher.enqueue(high)
    assert batcher.step()[0] == [high]
    assert batcher.step()[0] == [low]


def test_queue_timeout_rejects_and_the_wait_wakes_for_it() -> None:
    clock, backend = Clock(), RowModel()
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=10_000)
    batcher = make_batcher(clock, backend, default_queue_policy=policy)
    waiting = job(1)
    batcher.enqueue(waiting)
    ran, wait_ns = batcher.step()
    assert ran == [] and wait_ns == 10 * MS  # the timeout comes before the 100 ms delay
    clock.advance(10 * MS)
    assert batcher.step() == ([], -1)
    error = error_of(waiting)
    assert isinstance(error, Unavailable) and "Request timeout expired" in str(error)
    assert backend.batches == []


def test_queue_timeout_with_delay_action_moves_the_request_behind_the_others() -> None:
    clock, backend = Clock(), RowModel()
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=5_000, timeout_action=mc.ModelQueuePolicy.DELAY)
    batcher = make_batcher(clock, backend, max_batch_size=1, delay_us=0, default_queue_policy=policy)
    late, fresh = job(1), job(1)
    batcher.enqueue(late)
    clock.advance(6 * MS)
    batcher.enqueue(fresh)
    assert batcher.step()[0] == [fresh]
    assert batcher.step()[0] == [late]
    assert late.wait().output("SUM") is not None


def test_timeout_override_from_the_request() -> None:
    clock, backend = Clock(), RowModel()
    policy = mc.ModelQueuePolicy(allow_timeout_override=True)
    batcher = make_batcher(clock, backend, default_queue_policy=policy)
    j = job(1, timeout=2_000)
    batcher.enqueue(j)
    assert batcher.step()[1] == 2 * MS


def test_full_queue_refuses() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, default_queue_policy=mc.ModelQueuePolicy(max_queue_size=1))
    kept, refused = job(1), job(1)
    batcher.enqueue(kept)
    batcher.enqueue(refused)
    error = error_of(refused)
    assert isinstance(error, Unavailable) and "Exceeds maximum queue size" in str(error)
    assert batcher.pending() == 1


def test_cancelled_and_past_deadline_requests_leave_without_running() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend)
    cancelled, late = job(1), job(1)
    late.deadline_ns = clock() + 3 * MS
    batcher.enqueue(cancelled)
    batcher.enqueue(late)
    cancelled.cancel()
    assert batcher.step()[1] == 3 * MS  # wakes for the deadline
    clock.advance(3 * MS)
    assert batcher.step() == ([], -1)
    assert isinstance(error_of(cancelled), Cancelled)
    assert isinstance(error_of(late), DeadlineExceeded)
    assert backend.batches == [] and batcher.pending() == 0


def test_stopping_runs_what_is_queued_without_waiting() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend)
    j = job(1)
    batcher.enqueue(j)
    batcher.stop()
    assert batcher.step()[0] == [j]
    late = job(1)
    batcher.enqueue(late)
    assert "being unloaded" in str(error_of(late))


def test_a_failing_batch_fails_every_job_and_returns_every_pooled_buffer() -> None:
    clock, backend = Clock(), RowModel()
    batcher = make_batcher(clock, backend, preferred=(2,))
    pool = batcher.context.buffers
    backend.fail_with = RuntimeError("the model broke")
    first, second = job(1), job(1)
    batcher.enqueue(first)
    batcher.enqueue(second)
    assert batcher.step()[0] == [first, second]
    for j in (first, second):
        error = error_of(j)
        assert isinstance(error, InternalError) and "the model broke" in str(error)
    assert pool.allocations == 1 and pool.idle() == 1  # the merged input buffer is back
    backend.fail_with = None
    again = [job(1), job(1)]
    for j in again:
        batcher.enqueue(j)
    batcher.step()
    assert pool.allocations == 1 and pool.idle() == 1  # and reused
    assert data(again[1], "SUM").shape == (1, 1)


def test_instance_threads_run_a_due_batch_without_the_clock_moving() -> None:
    """The threaded loop takes the same decisions: a batch due now runs; one that must wait does not."""
    clock, model = Clock(), RowModel()
    batcher = make_batcher(clock, model, preferred=(2, 6), threads=True)
    try:
        finished = threading.Event()
        waiting, due = job(1), job(7)
        waiting.on_done(lambda _: finished.set())
        batcher.enqueue(waiting)  # 1 is below every preferred size: it waits for the (frozen) clock
        ran = threading.Event()
        due.on_done(lambda _: ran.set())
        batcher.enqueue(due)  # 1 + 7 > 6: the 1 runs now, then the 7 (past the largest preferred size)
        assert finished.wait(30) and ran.wait(30)
        assert [size for size, _ in model.batches] == [1, 7]
        lone = job(1)
        batcher.enqueue(lone)
        assert not lone.finished and batcher.pending() == 1  # waits for the delay on the frozen clock
    finally:
        batcher.stop()  # runs what is queued
    assert lone.finished and data(lone, "SUM").shape == (1, 1)


def test_direct_scheduler_runs_on_the_calling_thread() -> None:
    model = RowModel()
    context = make_batcher(Clock(), model).context
    scheduler = DirectScheduler(context, [TensorBackend(model, context)], ThreadPoolExecutor(1))
    j = job(2, outputs=["DOUBLE"])
    j.caller_runs = True  # the caller lends its thread
    scheduler.enqueue(j)
    assert j.finished and scheduler.pending() == 0
    np.testing.assert_array_equal(data(j, "DOUBLE"), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert context.stats.execution_count == 1


def test_a_failing_single_request_fails_alone_and_the_batcher_goes_on() -> None:
    clock, model = Clock(), RowModel()
    batcher = make_batcher(clock, model, delay_us=0)
    model.fail_with = RuntimeError("bad row")
    broken = job(1)
    batcher.enqueue(broken)
    assert batcher.step()[0] == [broken]
    assert "bad row" in str(error_of(broken))
    model.fail_with = None
    fine = job(1)
    batcher.enqueue(fine)
    batcher.step()
    assert data(fine, "SUM").shape == (1, 1)
    assert batcher.context.stats.execution_count == 1  # only the execution that succeeded is counted


def make_queue(
    max_batch_size: int = 8, preferred: Sequence[int] = (), delay_us: int = 100_000, **batching: Any
) -> BatchQueue:
    settings = mc.ModelDynamicBatching(
        preferred_batch_size=list(preferred), max_queue_delay_microseconds=delay_us, **batching
    )
    return BatchQueue("rows", max_batch_size, settings)


def queued(queue: BatchQueue, j: Job, now_ns: int, batching: bool = True) -> bool:
    """Add ``j`` as ``DynamicBatcher.enqueue`` does; whether it wakes an instance."""
    j.signature = input_signature(j, batching)
    assert queue.add(j, now_ns) is None
    return queue.wakes(j)


def test_arrivals_below_the_next_preferred_size_do_not_wake_a_gathering_instance() -> None:
    """Triton's Enqueue: while a batch gathers, only reaching the next preferred size wakes the batcher."""
    clock = Clock()
    queue = make_queue(preferred=(4, 8))
    first = job(1)
    assert queued(queue, first, clock())  # nothing gathers yet: the first arrival wakes an instance
    assert queue.next_batch(clock()) == ([], 100 * MS)  # 1 < 4: it gathers for the delay
    clock.advance(10 * MS)
    rest = [job(1), job(1), job(1)]
    assert [queued(queue, j, clock()) for j in rest] == [False, False, True]  # 2 and 3 sleep on, 4 is preferred
    assert queue.next_batch(clock()) == ([first, *rest], 0)
    assert queued(queue, job(1), clock())  # a new batch starts: the next arrival wakes again


def test_without_preferred_sizes_only_a_full_batch_wakes_a_gathering_instance() -> None:
    clock = Clock()
    queue = make_queue(max_batch_size=4)  # preferred defaults to [4]
    assert queued(queue, job(1), clock())
    assert queue.next_batch(clock())[0] == []
    assert not queued(queue, job(2), clock())
    assert queued(queue, job(1), clock())  # 4 queued: the batch is full
    batch, wait_ns = queue.next_batch(clock())
    assert sizes(batch) == [1, 2, 1] and wait_ns == 0


def test_an_arrival_of_another_shape_wakes_and_the_gathering_batch_runs() -> None:
    clock = Clock()
    queue = make_queue(preferred=(4,))
    narrow = job(1, width=3)
    queued(queue, narrow, clock())
    assert queue.next_batch(clock())[0] == []
    assert queued(queue, job(1, width=4), clock())  # it would close the gathering batch: wake
    assert queue.next_batch(clock()) == ([narrow], 0)


def test_an_arrival_that_expires_before_the_wake_up_wakes() -> None:
    clock = Clock()
    queue = make_queue(preferred=(4,))
    queued(queue, job(1), clock())
    assert queue.next_batch(clock()) == ([], 100 * MS)
    later, sooner = job(1), job(1)
    later.deadline_ns = clock() + 200 * MS
    sooner.deadline_ns = clock() + 50 * MS
    assert not queued(queue, later, clock())
    assert queued(queue, sooner, clock())
    assert queue.next_batch(clock()) == ([], 50 * MS)  # the wait now ends at the sooner deadline
    timed = job(1, timeout=10_000)
    overriding = make_queue(preferred=(4,), default_queue_policy=mc.ModelQueuePolicy(allow_timeout_override=True))
    queued(overriding, job(1), clock())
    assert overriding.next_batch(clock())[0] == []
    assert queued(overriding, timed, clock())  # its 10 ms queue timeout ends before the 100 ms delay


def test_the_queued_size_follows_every_way_out_of_the_queue() -> None:
    clock = Clock()
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=5_000, timeout_action=mc.ModelQueuePolicy.DELAY)
    queue = make_queue(max_batch_size=16, delay_us=0, default_queue_policy=policy)
    cancelled, late, delayed, fresh = job(2), job(3), job(4), job(5)
    late.deadline_ns = clock() + 1 * MS
    for j in (cancelled, late, delayed):
        queued(queue, j, clock())
    assert queue.queued_size == 9
    clock.advance(6 * MS)  # the deadline passes, the 5 ms timeout moves ``delayed`` behind everything
    queued(queue, fresh, clock())
    cancelled.cancel()
    assert queue.next_batch(clock()) == ([fresh, delayed], 0)
    assert queue.queued_size == 0 and len(queue) == 0
    assert isinstance(error_of(late), DeadlineExceeded)


def test_a_job_armed_for_an_asynchronous_caller_finishes_once_and_cannot_be_waited_for() -> None:
    finished: list[Job] = []
    pending = job(1)
    pending.arm(waited=False)  # the caller hears of it through on_done only
    pending.on_done(finished.append)
    assert pending._done is None and pending._claim is not None  # no waiter's lock, still an atomic claim
    with pytest.raises(InternalError, match="armed without a waiter"):
        pending.wait()
    pending.arm()  # a later arm (the scheduler's) changes nothing
    assert pending._done is None
    racers = [threading.Thread(target=pending.fail, args=(Cancelled("gone"),)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert finished == [pending] and isinstance(pending.error, Cancelled)
    with pytest.raises(Cancelled):
        pending.wait()  # finished: wait answers at once

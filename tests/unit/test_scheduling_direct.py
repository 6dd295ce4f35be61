"""The direct scheduler's line and runners, in-process, on a real thread pool.

A model that is held on a gate (a ``threading.Event``) keeps the first job
running while the test queues more; every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_scheduling_batcher import Clock, RowModel, data, job, make_batcher

from fastoip.errors import Cancelled, InferenceError
from fastoip.scheduling import direct
from fastoip.scheduling.direct import DirectScheduler
from fastoip.scheduling.execute import TensorBackend
from fastoip.scheduling.job import Job
from fastoip.types import InferResponse

WAIT_S = 10


class GatedModel(RowModel):
    """RowModel whose runs wait for ``gate``; ``log`` lists what ran, in order (rows of each job)."""

    def __init__(self, log: list[object]) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()
        self.log = log
        self.running = 0
        self.most_at_once = 0
        self._count = threading.Lock()

    def run(
        self,
        feeds: dict[str, np.ndarray],
        output_names: Sequence[str],
        destinations: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        with self._count:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        try:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
            self.log.append(feeds["X"].shape[0])
            return super().run(feeds, output_names, destinations)
        finally:
            with self._count:
                self.running -= 1


def scheduler_on(pool: ThreadPoolExecutor, model: GatedModel, instances: int = 1) -> DirectScheduler:
    context = make_batcher(Clock(), model).context
    return DirectScheduler(context, [TensorBackend(model, context) for _ in range(instances)], pool)


def test_jobs_run_in_arrival_order_one_per_instance() -> None:
    log: list[object] = []
    model = GatedModel(log)
    with ThreadPoolExecutor(4) as pool:
        scheduler = scheduler_on(pool, model)
        jobs = [job(rows) for rows in range(1, 8)]
        for j in jobs:
            scheduler.enqueue(j)
        model.gate.set()
        for rows, j in enumerate(jobs, start=1):
            np.testing.assert_array_equal(data(j, "DOUBLE"), np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * 2)
    assert log == list(range(1, 8))
    assert model.most_at_once == 1
    assert scheduler.pending() == 0


def test_a_busy_model_holds_no_more_pool_threads_than_instances() -> None:
    """Waiting requests wait in the model's line, not on pool threads: other work on the pool goes on."""
    model = GatedModel([])
    with ThreadPoolExecutor(2) as pool:
        scheduler = scheduler_on(pool, model)
        jobs = [job(1) for _ in range(6)]
        for j in jobs:
            scheduler.enqueue(j)
        assert model.started.wait(WAIT_S)
        assert pool.submit(lambda: "other work").result(timeout=WAIT_S) == "other work"
        assert not any(j.finished for j in jobs)  # the model is still held on its gate
        model.gate.set()
        for j in jobs:
            j.wait()
    assert model.most_at_once == 1


def test_two_instances_run_two_jobs_at_once() -> None:
    model = GatedModel([])
    with ThreadPoolExecutor(4) as pool:
        scheduler = scheduler_on(pool, model, instances=2)
        jobs = [job(1) for _ in range(4)]
        for j in jobs:
            scheduler.enqueue(j)
        for _ in range(100):  # both instances get a job while the gate is shut
            if model.running == 2:
                break
            threading.Event().wait(0.05)
        assert model.running == 2
        model.gate.set()
        for j in jobs:
            j.wait()
    assert model.most_at_once == 2


def test_a_runner_makes_way_for_other_work_after_its_turn() -> None:
    log: list[object] = []
    model = GatedModel(log)
    with ThreadPoolExecutor(1) as pool:
        scheduler = scheduler_on(pool, model)
        jobs = [job(1) for _ in range(direct.RUNNER_TURN + 5)]
        for j in jobs:
            scheduler.enqueue(j)
        other = pool.submit(log.append, "other")  # queued behind the runner
        model.gate.set()
        for j in jobs:
            j.wait()
        other.result(timeout=WAIT_S)
    assert log.index("other") == direct.RUNNER_TURN  # after one turn, not after every job
    assert len(log) == len(jobs) + 1


def test_a_job_cancelled_while_it_waits_never_runs() -> None:
    log: list[object] = []
    model = GatedModel(log)
    with ThreadPoolExecutor(1) as pool:
        scheduler = scheduler_on(pool, model)
        first, second, third = job(1), job(2), job(3)
        for j in (first, second, third):
            scheduler.enqueue(j)
        assert model.started.wait(WAIT_S)
        second.cancel()
        model.gate.set()
        first.wait()
        third.wait()
        with pytest.raises(Cancelled):
            second.wait()
    assert log == [1, 3]


def test_jobs_in_line_still_run_when_the_pool_shuts_down() -> None:
    """As the pool runs its queued tasks on shutdown, a runner runs every job in its line."""
    model = GatedModel([])
    pool = ThreadPoolExecutor(1)
    scheduler = scheduler_on(pool, model)
    jobs = [job(1) for _ in range(direct.RUNNER_TURN * 2 + 3)]
    for j in jobs:
        scheduler.enqueue(j)
    assert model.started.wait(WAIT_S)
    pool.shutdown(wait=False)
    model.gate.set()
    for j in jobs:
        j.wait()
    pool.shutdown(wait=True)


def test_a_job_after_the_pool_shut_down_fails_with_a_clear_error() -> None:
    model = GatedModel([])
    pool = ThreadPoolExecutor(1)
    pool.shutdown(wait=True)
    scheduler = scheduler_on(pool, model)
    late = job(1)
    scheduler.enqueue(late)
    with pytest.raises(InferenceError, match="shutdown"):
        late.wait()
    retry = job(1)  # the runner count stayed true: the next job is refused the same way, not stranded
    scheduler.enqueue(retry)
    with pytest.raises(InferenceError, match="shutdown"):
        retry.wait()


class _HandingOver:
    """An instance that only hands its jobs over (as a Python worker process's does): free again at once."""

    def __init__(self, index: int, ran: list[int]) -> None:
        self.chain_entry = ("rows", "1", index)
        self.ran = ran

    def execute(self, jobs: Sequence[Job]) -> tuple[list[object], list[object]]:
        self.ran.append(self.chain_entry[2])
        return [InferResponse("rows", "1", "", {}, []) for _ in jobs], []

    def is_ready(self) -> bool:
        return True

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _HandingOverAtOnce(_HandingOver):
    """One the scheduler may hand a request to on the enqueuing thread (``takes_without_waiting``)."""

    def takes_without_waiting(self, job: Job) -> bool:
        return True


@pytest.mark.parametrize(
    ("caller_runs", "kind"),
    [(True, _HandingOver), (False, _HandingOver), (False, _HandingOverAtOnce)],
    ids=["blocking-caller", "line", "handed-over"],
)
def test_a_bls_request_never_runs_on_an_instance_on_its_call_chain(caller_runs: bool, kind: type) -> None:
    """Instance 0 runs the request waiting for this one (its chain): the request runs on instance 1, though
    instance 0 is free to the scheduler (a worker would run it after the request that waits for it: a wedge)."""
    ran: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        context = make_batcher(Clock(), GatedModel([])).context
        scheduler = DirectScheduler(context, [kind(0, ran), kind(1, ran)], pool)
        for _ in range(6):
            bls = job(1)
            bls.chain = (("caller", "1", 0), ("rows", "1", 0))
            bls.caller_runs = caller_runs
            scheduler.enqueue(bls)
            bls.wait()
        plain = [job(1) for _ in range(4)]
        for j in plain:
            j.caller_runs = True
            scheduler.enqueue(j)
    assert ran[:6] == [1] * 6
    assert sorted(ran[6:]) == [0, 0, 1, 1]  # the others take whichever is free

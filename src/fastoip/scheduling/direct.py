"""The direct scheduler: every request runs on its own, on the first free instance.

A caller that lends its thread (``job.caller_runs``: it would only wait) runs
the model there, with no hand-off at all.  Where an instance that only hands
requests over (a Python worker process: ``takes_without_waiting(job)``, see the
contract) is free and says it takes this one without waiting, it is handed over
on the caller's thread (the event loop), one thread hop less per request.  The
others wait in this scheduler's line and are run on the core's executor by at
most one *runner* per instance.

Rules:
- A runner is one executor task that runs the jobs waiting in line, one after
  the other, for up to ``RUNNER_TURN`` jobs; then, if jobs still wait, it goes to
  the back of the executor's queue (other models' work on the same pool gets its
  turn).  A request that arrives while the runners are busy costs a lock and a
  deque append, not an executor task (a Future, its Condition, a work item and
  the pool's semaphore: ~3-5 us of CPU per request on the event loop).
- At most ``instance_group { count }`` runners: a model never holds more
  executor threads than it has instances (before, every queued request held a
  pool thread blocked on a free instance).
- Jobs in line run in arrival order (a job handed over at once may pass them).
  A job that waits is armed (cancel and deadline apply while it waits:
  ``run_jobs`` skips finished and expired jobs).
- A BLS request with a call chain runs on an instance off its chain
  (``call_chain``): an instance on it waits for the request's answer.
- Once the executor is shut down, jobs still in line are run by the runner that
  holds them (as the executor runs its queued tasks); a job that no runner can
  take fails.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor

from .call_chain import CallChain, off_chain
from .contract import Backend, ExecutionContext
from .execute import run_jobs
from .job import Job

#: Jobs a runner runs before it yields its executor thread to the pool's queue (when jobs still wait).
RUNNER_TURN = 16
#: How long a BLS request waits before it looks again for a free instance off its call chain.
CHAIN_RETRY_S = 0.001


class DirectScheduler:
    """No batching: ``instance_group { count }`` bounds concurrent executions."""

    def __init__(self, context: ExecutionContext, instances: Sequence[Backend], executor: Executor) -> None:
        self.context = context
        self._executor = executor
        self._instances: queue.SimpleQueue[Backend] = queue.SimpleQueue()
        for backend in instances:
            self._instances.put(backend)
        #: Jobs waiting for a runner, in arrival order (guarded by _lock, as is _runners).
        self._line: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()
        #: Runners submitted or running (at most _max_runners).
        self._runners = 0
        self._max_runners = max(1, len(instances))
        #: Every instance may take a request on the caller's thread (see the contract's ``takes_without_waiting``).
        self._hands_over = bool(instances) and all(hasattr(b, "takes_without_waiting") for b in instances)

    def enqueue(self, job: Job) -> None:
        """Run ``job`` now on the caller's thread when it lends it, else on an executor thread."""
        if job.caller_runs:
            self._run(job)
            return
        job.arm()
        if self._hands_over and self._hand_over(job):
            return
        with self._lock:
            self._line.append(job)
            if self._runners >= self._max_runners:
                return  # a busy runner takes it
            self._runners += 1
        try:
            self._executor.submit(self._run_line)
        except RuntimeError as exc:  # executor shut down: nobody will run what no runner holds
            self._give_up(exc)

    def _run_line(self) -> None:
        """A runner: run waiting jobs for one turn, then make way on the executor if jobs still wait."""
        line = self._line
        lock = self._lock
        turn = RUNNER_TURN
        while True:
            with lock:
                if not line:
                    self._runners -= 1
                    return
                job = line.popleft()
            try:
                self._run(job)
            except Exception as exc:  # (run_jobs finishes its jobs; this keeps the runner count true regardless)
                job.fail(exc)
            turn -= 1
            if turn == 0:
                with lock:
                    if not line:
                        self._runners -= 1
                        return
                try:
                    self._executor.submit(self._run_line)  # the back of the pool's queue; this runner ends
                    return
                except RuntimeError:  # executor shut down: this thread runs what is left (as the pool would)
                    turn = RUNNER_TURN

    def _give_up(self, exc: RuntimeError) -> None:
        """The executor refused a runner: fail the jobs in line when no other runner will take them."""
        with self._lock:
            self._runners -= 1
            if self._runners:
                return
            stranded = list(self._line)
            self._line.clear()
        for job in stranded:
            job.fail(exc)

    def _hand_over(self, job: Job) -> bool:
        """Give ``job`` to a free instance that takes it without waiting, on this thread; False: none does."""
        try:
            backend = self._instances.get_nowait()
        except queue.Empty:
            return False
        try:
            if job.chain and not off_chain(getattr(backend, "chain_entry", None), job.chain):
                return False  # (a BLS request: this instance waits for its answer; _run picks another)
            if not backend.takes_without_waiting(job):  # type: ignore[attr-defined]
                return False
            run_jobs(self.context, backend, (job,))
            return True
        finally:
            self._instances.put(backend)

    def _run(self, job: Job) -> None:
        """Run ``job`` on this thread (blocking until an instance is free)."""
        backend = self._instances.get() if not job.chain else self._take_off_chain(job.chain)
        try:
            run_jobs(self.context, backend, (job,))
        finally:
            self._instances.put(backend)

    def _take_off_chain(self, chain: CallChain) -> Backend:
        """A free instance that is not on ``chain`` (a BLS request's: those wait for its answer, and a worker
        process runs what it is handed after the request it runs now).  The Core refused the request when every
        instance is on it; while the others are taken, wait for one to come back."""
        while True:
            backend = self._instances.get()
            if off_chain(getattr(backend, "chain_entry", None), chain):
                return backend
            self._instances.put(backend)
            time.sleep(CHAIN_RETRY_S)  # (rare: a cycle's request while the model's other instances are taken)

    def pending(self) -> int:
        return 0

    def stop(self) -> None:
        """Nothing is held back here: jobs in line are run by their runners; executions in flight finish."""

"""The direct scheduler: every request runs on its own, on the first free instance.

A caller that lends its thread (``job.caller_runs``: it would only wait) runs
the model there, with no hand-off at all; the others are run on the core's executor,
except where an instance that only hands requests over (a Python worker process:
``takes_without_waiting(job)``, see the contract) is free and says it takes this
one without waiting: then it is handed over on the caller's thread (the event
loop), one thread hop less per request.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from concurrent.futures import Executor

from .contract import Backend, ExecutionContext
from .execute import run_jobs
from .job import Job


class DirectScheduler:
    """No queue of its own: ``instance_group { count }`` bounds concurrent executions."""

    def __init__(self, context: ExecutionContext, instances: Sequence[Backend], executor: Executor) -> None:
        self.context = context
        self._executor = executor
        self._instances: queue.SimpleQueue[Backend] = queue.SimpleQueue()
        for backend in instances:
            self._instances.put(backend)
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
        try:
            self._executor.submit(self._run, job)
        except RuntimeError as exc:  # executor shut down
            job.fail(exc)

    def _hand_over(self, job: Job) -> bool:
        """Give ``job`` to a free instance that takes it without waiting, on this thread; False: none does."""
        try:
            backend = self._instances.get_nowait()
        except queue.Empty:
            return False
        try:
            if not backend.takes_without_waiting(job):  # type: ignore[attr-defined]
                return False
            run_jobs(self.context, backend, (job,))
            return True
        finally:
            self._instances.put(backend)

    def _run(self, job: Job) -> None:
        """Run ``job`` on this thread (blocking until an instance is free)."""
        backend = self._instances.get()
        try:
            run_jobs(self.context, backend, (job,))
        finally:
            self._instances.put(backend)

    def pending(self) -> int:
        return 0

    def stop(self) -> None:
        """Nothing queued here; executions in flight finish on their threads."""

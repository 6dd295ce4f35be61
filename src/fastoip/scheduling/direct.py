"""The direct scheduler: every request runs on its own, on the first free instance.

A caller that lends its thread (``job.caller_runs``: it would only wait) runs
the model there, with no hand-off at all; the others are run on the core's executor.
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

    def enqueue(self, job: Job) -> None:
        """Run ``job`` now on the caller's thread when it lends it, else on an executor thread."""
        if job.caller_runs:
            self._run(job)
            return
        job.arm()
        try:
            self._executor.submit(self._run, job)
        except RuntimeError as exc:  # executor shut down
            job.fail(exc)

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

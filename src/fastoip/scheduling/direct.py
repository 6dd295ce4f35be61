"""The direct scheduler: every request runs on its own, on the first free instance.

Blocking callers run the model on their own thread (no hand-off at all);
asynchronous callers are run on the core's executor.
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

    #: Requests never wait in a queue here, so there is nothing to cancel.
    queues = False

    def __init__(self, context: ExecutionContext, instances: Sequence[Backend], executor: Executor) -> None:
        self.context = context
        self._executor = executor
        self._instances: queue.SimpleQueue[Backend] = queue.SimpleQueue()
        for backend in instances:
            self._instances.put(backend)

    def run(self, job: Job) -> None:
        """Run ``job`` on the calling thread (blocking until an instance is free)."""
        backend = self._instances.get()
        try:
            run_jobs(self.context, backend, (job,))
        finally:
            self._instances.put(backend)

    def submit(self, job: Job) -> None:
        """Run ``job`` on an executor thread; the job's ``on_done`` reports the result."""
        job.arm()
        try:
            self._executor.submit(self.run, job)
        except RuntimeError as exc:  # executor shut down
            job.fail(exc)

    def pending(self) -> int:
        return 0

    def stop(self) -> None:
        """Nothing queued here; executions in flight finish on their threads."""

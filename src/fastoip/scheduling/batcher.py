"""The dynamic batcher: per-model request merging with Triton's knobs.

Rules (Triton's meaning, ``model_config.proto`` ModelDynamicBatching):
- Requests wait in one FIFO per priority level (level 1 is served first).
  ``priority`` (uint64 request parameter) picks the level; 0 or out of range
  means ``default_priority_level``.
- An executor thread per backend instance takes the oldest waiting request and
  adds, in order, every waiting request with the same signature (non-batch
  shapes, datatypes, outputs) while the batch stays <= max_batch_size.
- With ``max_queue_delay_microseconds`` > 0 an incomplete batch waits up to
  that long after its oldest request arrived, unless it already reached
  max_batch_size or a ``preferred_batch_size``.  With 0 (the default) whatever
  is waiting runs at once: under load, batches form by themselves.
- Queue policy: ``max_queue_size`` refuses new requests with UNAVAILABLE
  "Exceeds maximum queue size"; a request that waited past its timeout
  (``default_timeout_microseconds`` or, when ``allow_timeout_override``, the
  request's ``timeout`` parameter in µs) is rejected with UNAVAILABLE
  "Request timeout expired" (``timeout_action: REJECT``) or moved behind
  everything else (``DELAY``).
- Cancelled requests and expired client deadlines leave the queue without running.
- ``preserve_ordering``: batches finish in the order they were formed, even
  with several instances.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Optional

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument, Unavailable
from .execute import run_jobs
from .job import Job

if TYPE_CHECKING:
    from ..repository.loaded import LoadedModel


class QueuePolicy:
    """One level's ModelQueuePolicy, read once."""

    __slots__ = ("max_queue_size", "default_timeout_ns", "allow_override", "delay_on_timeout")

    def __init__(self, policy: mc.ModelQueuePolicy) -> None:
        self.max_queue_size = policy.max_queue_size
        self.default_timeout_ns = policy.default_timeout_microseconds * 1000
        self.allow_override = policy.allow_timeout_override
        self.delay_on_timeout = policy.timeout_action == mc.ModelQueuePolicy.DELAY


class DynamicBatcher:
    """Merges waiting requests into batches for a pool of instance threads."""

    #: Requests wait here, so a cancelled call must be able to leave the queue.
    queues = True

    def __init__(self, model: "LoadedModel", executor: Executor) -> None:
        settings = model.config.dynamic_batching
        self.model = model
        self.max_batch_size = max(1, model.config.max_batch_size)
        self.delay_ns = settings.max_queue_delay_microseconds * 1000
        self.preferred = frozenset(settings.preferred_batch_size)
        self.levels = max(1, settings.priority_levels)
        default_level = settings.default_priority_level or 1
        if not 1 <= default_level <= self.levels:
            raise InvalidArgument(
                f"model '{model.name}': default_priority_level {default_level} is outside 1..{self.levels}"
            )
        self.default_level = default_level
        base_policy = QueuePolicy(settings.default_queue_policy)
        self.policies = [
            QueuePolicy(settings.priority_queue_policy[level]) if level in settings.priority_queue_policy else base_policy
            for level in range(1, self.levels + 1)
        ]
        self._queues: list[collections.deque] = [collections.deque() for _ in range(self.levels)]
        self._delayed: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._stopping = False
        self._preserve_ordering = settings.preserve_ordering and len(model.backends) > 1
        self._last_gate: Optional[threading.Event] = None
        self._threads = [
            threading.Thread(target=self._serve, args=(backend,), name=f"batcher-{model.name}-{i}", daemon=True)
            for i, backend in enumerate(model.backends)
        ]
        for thread in self._threads:
            thread.start()

    # -- entry points ------------------------------------------------------------
    def run(self, job: Job) -> None:
        """Queue ``job``; the caller then waits with ``job.wait()``."""
        self.submit(job)

    def submit(self, job: Job) -> None:
        level = self._level(job)
        policy = self.policies[level]
        timeout_us = job.request.parameters.get("timeout") if policy.allow_override else None
        if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
            job.timeout_ns = timeout_us * 1000
        else:
            job.timeout_ns = policy.default_timeout_ns
        job.priority = level
        job.signature = self.model.signature(job)
        job.arm()
        with self._cond:
            if self._stopping:
                job.fail(Unavailable(f"model '{self.model.name}' is being unloaded"))
                return
            queue = self._queues[level]
            if policy.max_queue_size and len(queue) >= policy.max_queue_size:
                job.fail(Unavailable("Exceeds maximum queue size"))
                return
            queue.append(job)
            self._cond.notify()

    def pending(self) -> int:
        return sum(len(q) for q in self._queues) + len(self._delayed)

    def stop(self) -> None:
        """Run what is queued, then let the instance threads end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=60)

    # -- the instance threads ------------------------------------------------------------
    def _level(self, job: Job) -> int:
        priority = job.request.parameters.get("priority", 0)
        if isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= self.levels:
            return priority - 1
        return self.default_level - 1

    def _serve(self, backend) -> None:  # type: ignore[no-untyped-def]
        while True:
            batch, gate_in, gate_out = self._next_batch()
            if batch is None:
                return
            if gate_in is None and gate_out is None:
                run_jobs(self.model, backend, batch)
            else:
                run_jobs(self.model, backend, batch, before_finish=gate_in.wait if gate_in else None)
                gate_out.set()  # type: ignore[union-attr]

    def _next_batch(self) -> tuple[Optional[list[Job]], Optional[threading.Event], Optional[threading.Event]]:
        with self._cond:
            while True:
                self._drop_dead(time.monotonic_ns())
                head = self._head()
                if head is None:
                    if self._stopping:
                        return None, None, None
                    self._cond.wait()
                    continue
                batch, size = self._collect(head)
                if self.delay_ns and size < self.max_batch_size and size not in self.preferred and not self._stopping:
                    remaining = head.arrival_ns + self.delay_ns - time.monotonic_ns()
                    if remaining > 0:
                        self._cond.wait(remaining / 1e9)
                        continue
                for job in batch:
                    self._remove(job)
                gate_in = gate_out = None
                if self._preserve_ordering:
                    gate_in, gate_out = self._last_gate, threading.Event()
                    self._last_gate = gate_out
                if self.pending():
                    self._cond.notify()  # another idle instance can take the rest
                return batch, gate_in, gate_out

    def _head(self) -> Optional[Job]:
        for queue in self._queues:
            if queue:
                return queue[0]
        return self._delayed[0] if self._delayed else None

    def _collect(self, head: Job) -> tuple[list[Job], int]:
        batch, size = [head], head.batch_size
        signature = head.signature
        for queue in (*self._queues, self._delayed):
            for job in queue:
                if job is head or job.signature != signature:
                    continue
                if size + job.batch_size > self.max_batch_size:
                    return batch, size
                batch.append(job)
                size += job.batch_size
                if size == self.max_batch_size:
                    return batch, size
        return batch, size

    def _remove(self, job: Job) -> None:
        queue = self._delayed if job in self._delayed else self._queues[job.priority]
        if queue and queue[0] is job:
            queue.popleft()
        else:
            queue.remove(job)

    def _drop_dead(self, now_ns: int) -> None:
        """Remove cancelled, finished and timed-out jobs from the queues."""
        for level, queue in enumerate(self._queues):
            if not queue:
                continue
            policy = self.policies[level]
            keep = collections.deque()
            changed = False
            for job in queue:
                if job.finished or job.expired(now_ns):
                    changed = True
                    continue
                if job.timeout_ns and now_ns - job.arrival_ns >= job.timeout_ns:
                    changed = True
                    if policy.delay_on_timeout:
                        job.timeout_ns = 0
                        self._delayed.append(job)
                    else:
                        job.fail(Unavailable("Request timeout expired"))
                    continue
                keep.append(job)
            if changed:
                self._queues[level] = keep
        if self._delayed and any(job.finished for job in self._delayed):
            self._delayed = collections.deque(job for job in self._delayed if not job.finished)

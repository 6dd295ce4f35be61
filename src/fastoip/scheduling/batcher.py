"""The dynamic batcher: per-model request merging with Triton's knobs and Triton's decisions.

Rules (Triton's meaning, ``model_config.proto`` ModelDynamicBatching, and the
decisions of core ``dynamic_batch_scheduler.cc`` ``GetDynamicBatch``):
- Requests wait in one FIFO per priority level (level 1 is served first), then
  the requests a ``DELAY`` timeout moved behind everything.  ``priority``
  (uint64 request parameter) picks the level; 0 or out of range means
  ``default_priority_level``.
- A batch grows from the oldest waiting request, in queue order, and stops at
  the first request that would take it past ``max_batch_size`` or whose
  signature (non-batch input shapes) differs: that request starts the next
  batch, so requests of another shape never wait behind this one.  Requests
  that ask for different outputs batch together (``execute.py`` computes the
  union and hands each job what it asked for).
- ``preferred_batch_size`` defaults to ``[max_batch_size]`` (Triton's config
  normalisation).  A batch runs at once when it reaches a preferred size (the
  largest one found), when it reaches the largest preferred size, or when the
  next request would take it past the largest preferred size or past
  ``max_batch_size``, or the next request's shape differs.  Otherwise, with
  ``max_queue_delay_microseconds`` > 0 it waits until its oldest request has
  waited that long (then everything pending runs); with 0 (the default) it
  runs at once.
- Queue policy: ``max_queue_size`` refuses new requests with UNAVAILABLE
  "Exceeds maximum queue size"; a request that waited past its timeout
  (``default_timeout_microseconds`` or, when ``allow_timeout_override``, the
  request's ``timeout`` parameter in µs) is rejected with UNAVAILABLE
  "Request timeout expired" (``timeout_action: REJECT``) or moved behind
  everything else (``DELAY``).
- Cancelled requests and expired client deadlines leave the queue without running.
- ``preserve_ordering``: batches finish in the order they were formed, even
  with several instances.
- Wake-ups (Triton's ``Enqueue``): while an instance waits out the delay of a
  gathering batch, a new request wakes it only when it can change the
  decision: the queued batch size reaches the next preferred size, its shape
  differs from the gathering batch's, or its timeout or deadline falls before
  the instance's wake-up.  Otherwise the instance sleeps on and takes
  everything that arrived when the delay is over, instead of being woken (and
  recomputing the batch) once per arrival.
- Where a batch runs: on an instance thread; or, for a model without a queue
  delay, without ordering across instances and with CPU tensor instances whose
  batches took under ``INLINE_MAX_NS`` of CPU and ``INLINE_MAX_BYTES`` of inputs (moving averages), on the thread
  that releases a burst's held wake-up (:mod:`.wakeups`: the native gRPC
  frontend's event loop, once per pass) when an instance is free: the hand-off
  to the instance thread and the completion's hop back cost more than such a
  batch (measured: 0.22 -> 0 context switches per request, RESULTS.md
  2026-11-27 "lean24").  The instance threads skip an instance lent so.
- Every decision reads one injected clock (:data:`~fastoip.scheduling.contract.Clock`),
  so tests drive the decisions with a controllable clock and no sleeps.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Final

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument, Unavailable
from . import wakeups
from .contract import Backend, Clock, ExecutionContext
from .execute import TensorBackend, run_jobs
from .job import Job

#: A batch runs on the thread that releases the burst's wake-up (the event loop's, at the end of its pass)
#: instead of waking an instance thread, when the model's batches take at most this much CPU time (a moving
#: average of what they took): the thread hop (GIL hand-offs, futex wake-ups, the completion's hop back)
#: then costs more than the loop's wait for the model.
INLINE_MAX_NS: Final = 200_000
#: ... and when its batches' inputs are at most this many bytes (a moving average): a large tensor's copies on the
#: loop would hold its reads and writes (measured with 602 KB requests: 0.86x the throughput, twice the p99).
INLINE_MAX_BYTES: Final = 64 * 1024


class QueuePolicy:
    """One level's ModelQueuePolicy, read once."""

    __slots__ = ("max_queue_size", "default_timeout_ns", "allow_override", "delay_on_timeout")

    def __init__(self, policy: mc.ModelQueuePolicy) -> None:
        self.max_queue_size = policy.max_queue_size
        self.default_timeout_ns = policy.default_timeout_microseconds * 1000
        self.allow_override = policy.allow_timeout_override
        self.delay_on_timeout = policy.timeout_action == mc.ModelQueuePolicy.DELAY


class BatchQueue:
    """The waiting jobs and the decision of what runs next.  No threads, no locks: the caller serialises."""

    def __init__(self, model_name: str, max_batch_size: int, settings: mc.ModelDynamicBatching) -> None:
        self.model_name = model_name
        self.max_batch_size = max(1, max_batch_size)
        self.delay_ns = settings.max_queue_delay_microseconds * 1000
        # Triton's config normalisation: no preferred sizes means [max_batch_size].
        self.preferred = frozenset(settings.preferred_batch_size) or frozenset((self.max_batch_size,))
        self.max_preferred = max(self.preferred)
        self.levels = max(1, settings.priority_levels)
        default_level = settings.default_priority_level or 1
        if not 1 <= default_level <= self.levels:
            raise InvalidArgument(
                f"model '{model_name}': default_priority_level {default_level} is outside 1..{self.levels}"
            )
        self.default_level = default_level
        base_policy = QueuePolicy(settings.default_queue_policy)
        by_level = settings.priority_queue_policy
        self.policies = [
            QueuePolicy(by_level[level]) if level in by_level else base_policy for level in range(1, self.levels + 1)
        ]
        # One FIFO per level, then (index ``levels``) the jobs a DELAY timeout moved behind everything.
        self._queues: list[collections.deque[Job]] = [collections.deque() for _ in range(self.levels + 1)]
        #: The sum of the waiting jobs' batch sizes (Triton's ``queued_batch_size_``).
        self.queued_size = 0
        # What the last decision waits for (see ``wakes``): 0 = nothing gathers, every arrival wakes.
        self._wake_size = 0
        self._wake_signature: object = None
        self._wake_ns = 0

    def __len__(self) -> int:
        count = 0
        for queue in self._queues:
            count += len(queue)
        return count

    def add(self, job: Job, now_ns: int) -> Unavailable | None:
        """Queue ``job`` (its level and timeout read from the request); the error when the queue is full."""
        level = self._level(job)
        policy = self.policies[level]
        timeout_us = job.request.parameters.get("timeout") if policy.allow_override else None
        if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
            job.timeout_ns = timeout_us * 1000
        else:
            job.timeout_ns = policy.default_timeout_ns
        job.priority = level
        queue = self._queues[level]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            return Unavailable("Exceeds maximum queue size")
        job.enqueue_ns = now_ns
        queue.append(job)
        self.queued_size += job.batch_size
        return None

    def wakes(self, job: Job) -> bool:
        """Whether ``job``, just added, can change the decision the last :meth:`next_batch` waits on.

        Triton's ``Enqueue`` wake rule: while a batch gathers (the last decision was a wait for the
        delay), an arrival wakes the instance only when the queued batch size reaches the next preferred
        size above the gathering batch, or when its shape differs (the gathering batch then runs at once),
        or when its timeout or deadline comes before the wake-up.  When nothing gathers, every arrival wakes.
        """
        if not self._wake_size or self.queued_size >= self._wake_size or job.signature != self._wake_signature:
            return True
        expiry = job.deadline_ns
        if job.timeout_ns:
            timeout_at = job.enqueue_ns + job.timeout_ns
            expiry = timeout_at if not expiry else min(expiry, timeout_at)
        return bool(expiry) and expiry < self._wake_ns

    def next_batch(self, now_ns: int, flush: bool = False) -> tuple[list[Job], int]:
        """What runs now, taken off the queue; or ``([], ns to wait)``: ``-1`` when nothing waits.

        ``flush`` (the batcher is stopping): whatever is pending runs without waiting.
        """
        self._wake_size = 0  # unless this decision is a wait (below), the next arrival wakes an instance
        wake_ns = self._drop_dead(now_ns)
        queues = self._queues
        level = 0
        while level < len(queues) and not queues[level]:
            level += 1
        if level == len(queues):
            return [], -1
        queue = queues[level]
        head = queue[0]
        behind = queues[level + 1 :]
        jobs: Iterator[Job]  # every waiting job after the head, in queue order
        if len(queue) == 1 and not any(behind):
            jobs = iter(())  # the common case under light load: one job waits
        else:
            jobs = itertools.chain(itertools.islice(queue, 1, None), *behind)
        batch = [head]
        size = head.batch_size
        signature = head.signature
        oldest_ns = head.enqueue_ns
        best = 1 if size in self.preferred else 0  # how many jobs make the best batch found so far (0: none)
        send_now = False
        for job in jobs:
            grown = size + job.batch_size
            if grown > self.max_preferred and not best:
                best = len(batch)  # what fits the largest preferred size runs now, unless the delay is over
            if grown > self.max_batch_size or job.signature != signature:
                send_now = True
                break
            batch.append(job)
            size = grown
            if job.enqueue_ns < oldest_ns:
                oldest_ns = job.enqueue_ns
            if size in self.preferred:
                best = len(batch)
        delay_over = self.delay_ns != 0 and now_ns - oldest_ns >= self.delay_ns
        if best and not delay_over:
            batch = batch[:best]
        elif not (send_now or size >= self.max_preferred or delay_over or self.delay_ns == 0 or flush):
            wait_ns = oldest_ns + self.delay_ns - now_ns
            if wake_ns >= 0:
                wait_ns = min(wait_ns, wake_ns)
            # Triton's next_preferred_batch_size_: the arrivals that can make this batch run before the wait ends.
            self._wake_size = min((p for p in self.preferred if p > size), default=self.max_preferred)
            self._wake_signature = signature
            self._wake_ns = now_ns + wait_ns
            return [], wait_ns
        for job in batch:
            self._remove(job)
        return batch, 0

    # -- internals ---------------------------------------------------------------
    def _level(self, job: Job) -> int:
        priority = job.request.parameters.get("priority", 0)
        if isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= self.levels:
            return priority - 1
        return self.default_level - 1

    def _remove(self, job: Job) -> None:
        queue = self._queues[job.priority]
        if queue[0] is job:
            queue.popleft()
        else:
            queue.remove(job)
        self.queued_size -= job.batch_size

    def _drop_dead(self, now_ns: int) -> int:
        """Remove cancelled, finished and timed-out jobs; ns until the next timeout or deadline (-1: none)."""
        wake_ns = -1
        delayed = self._queues[self.levels]
        for level in range(self.levels):
            queue = self._queues[level]
            if not queue:
                continue
            policy = self.policies[level]
            keep: collections.deque[Job] = collections.deque()
            changed = False
            for job in queue:
                if job.finished or job.expired(now_ns):
                    changed = True
                    self.queued_size -= job.batch_size
                    continue
                if job.timeout_ns:
                    left = job.enqueue_ns + job.timeout_ns - now_ns
                    if left <= 0:
                        changed = True
                        if policy.delay_on_timeout:
                            job.timeout_ns = 0
                            job.priority = self.levels
                            delayed.append(job)
                        else:
                            job.fail(Unavailable("Request timeout expired"))
                            self.queued_size -= job.batch_size
                        continue
                    wake_ns = left if wake_ns < 0 else min(wake_ns, left)
                if job.deadline_ns:
                    left = job.deadline_ns - now_ns
                    wake_ns = left if wake_ns < 0 else min(wake_ns, left)
                keep.append(job)
            if changed:
                self._queues[level] = keep
        if delayed and any(job.finished or job.expired(now_ns) for job in delayed):
            kept = collections.deque(job for job in delayed if not job.finished)
            for job in delayed:
                if job.finished:
                    self.queued_size -= job.batch_size
            self._queues[self.levels] = kept
        return wake_ns


class DynamicBatcher:
    """Merges waiting requests into batches for a pool of instance threads."""

    def __init__(
        self,
        context: ExecutionContext,
        instances: Sequence[Backend],
        executor: Executor,
        clock: Clock = time.monotonic_ns,
        start_threads: bool = True,
    ) -> None:
        """``start_threads=False`` (tests): no instance threads; :meth:`step` runs what is due on the caller."""
        self.context = context
        self.instances = list(instances)
        self.clock = clock
        config = context.config
        self._queue = BatchQueue(context.name, config.max_batch_size, config.dynamic_batching)
        #: The queue's lock; the hot path takes it directly (``Condition.__enter__`` is interpreted Python).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stopping = False
        self._preserve_ordering = config.dynamic_batching.preserve_ordering and len(self.instances) > 1
        self._last_gate: threading.Event | None = None
        #: The instances running a batch now (by index), on their own thread or inline on a releasing thread.
        self._busy: set[int] = set()
        # (not `_inline`: mypyc names its C field `__inline`, a C keyword)
        #: Whether a batch may run on the thread that releases a burst's wake-up (see ``INLINE_MAX_NS``): no
        #: delay to wait out, no ordering across instances to keep, CPU tensor models only.
        self._inline_ok = (
            start_threads
            and config.dynamic_batching.max_queue_delay_microseconds == 0
            and not self._preserve_ordering
            and all(type(b) is TensorBackend and not b.model.on_gpu for b in self.instances)
        )
        #: ``self.wake`` made once (what a held wake-up remembers: a bound method a request is an allocation).
        self._wake = self.wake
        #: Moving averages of a batch's CPU time on its instance (ns; -1 until one ran) and of its input bytes.
        self._batch_ns = -1
        self._batch_bytes = 0
        self._threads = [
            threading.Thread(target=self._serve, args=(i, backend), name=f"batcher-{context.name}-{i}", daemon=True)
            for i, backend in enumerate(self.instances if start_threads else ())
        ]
        for thread in self._threads:
            thread.start()

    # -- entry points ------------------------------------------------------------
    def enqueue(self, job: Job) -> None:
        """Queue ``job`` (a cancelled or expired one leaves the queue unrun)."""
        job.signature = self.context.signature(job)
        job.arm()
        lock = self._lock
        lock.acquire()  # (not `with`: mypyc compiles it to two attribute lookups and two calls a request)
        try:
            if self._stopping:
                job.fail(Unavailable(f"model '{self.context.name}' is being unloaded"))
                return
            refused = self._queue.add(job, self.clock())
            if refused is not None:
                job.fail(refused)
                return
            # Triton's wake rule first (a gathering instance sleeps on unless this arrival can change its
            # decision), then an event loop's burst: one wake-up at its end
            if self._queue.wakes(job) and not wakeups.wake_later(self._wake):
                self._cond.notify()
        finally:
            lock.release()

    def wake(self) -> None:
        """Wake an idle instance thread (for the jobs queued since the last wake-up), or run what is due here
        when the model's batches are quick (``INLINE_MAX_NS``) and an instance is free."""
        if (self._inline_ok and 0 <= self._batch_ns <= INLINE_MAX_NS and self._batch_bytes <= INLINE_MAX_BYTES
                and self._run_here()):
            return
        with self._cond:
            self._cond.notify()

    def _run_here(self) -> bool:
        """Run the batches due now on this thread, on a free instance; False when none is free."""
        cond = self._cond
        while True:
            with cond:
                if self._stopping:
                    return False
                index = 0
                while index in self._busy:
                    index += 1
                if index >= len(self.instances):
                    return False
                batch, _ = self._queue.next_batch(self.clock())
                if not batch:
                    return True
                self._busy.add(index)
            started = time.thread_time_ns()
            size = _input_bytes(batch)
            try:
                run_jobs(self.context, self.instances[index], batch)
            finally:
                # (all: the lent instance's own thread may be the one waiting for what queued meanwhile)
                self._batch_done(index, started, size, wake_all=True)
            del batch

    def _batch_done(self, index: int, started_ns: int, size: int, wake_all: bool) -> None:
        """A batch on instance ``index`` ended: count its CPU time (this thread's since ``started_ns``) and input
        bytes into the moving averages, free the instance, and wake a thread for what queued meanwhile."""
        spent = time.thread_time_ns() - started_ns
        if self._batch_ns < 0:
            self._batch_ns, self._batch_bytes = spent, size
        else:
            self._batch_ns = (self._batch_ns * 7 + spent) // 8
            self._batch_bytes = (self._batch_bytes * 7 + size) // 8
        with self._cond:
            self._busy.discard(index)
            if len(self._queue):
                if wake_all:
                    self._cond.notify_all()
                else:
                    self._cond.notify()

    def pending(self) -> int:
        return len(self._queue)

    def stop(self) -> None:
        """Run what is queued, then let the instance threads end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=60)

    def step(self) -> tuple[list[Job], int]:
        """Form at most one batch at the clock's time and run it on the first instance, on this thread.

        For tests with ``start_threads=False``; returns the batch that ran (empty
        when none is due) and the ns the batcher would wait (-1: nothing waits).
        """
        with self._cond:
            batch, wait_ns = self._queue.next_batch(self.clock(), flush=self._stopping)
        if batch:
            run_jobs(self.context, self.instances[0], batch)
        return batch, wait_ns

    # -- the instance threads ------------------------------------------------------------
    def _serve(self, index: int, backend: Backend) -> None:
        while True:
            batch, gate_in, gate_out = self._next_batch(index)
            if batch is None:
                return
            started = time.thread_time_ns()
            size = _input_bytes(batch)
            try:
                if gate_out is None:
                    run_jobs(self.context, backend, batch)
                else:
                    run_jobs(self.context, backend, batch, before_finish=gate_in.wait if gate_in else None)
                    gate_out.set()
            finally:
                # (what queued meanwhile: a releasing thread found no free instance)
                self._batch_done(index, started, size, wake_all=False)
            # Let go of the batch before waiting for the next: its requests and responses (a 1 GiB message)
            # would otherwise stay alive for as long as the queue stays empty.
            del batch, gate_in, gate_out

    def _next_batch(self, index: int) -> tuple[list[Job] | None, threading.Event | None, threading.Event | None]:
        with self._cond:
            while True:
                if index in self._busy:  # a releasing thread runs a batch on this instance: wait for it
                    if len(self._queue):
                        self._cond.notify()  # the wake-up was for the jobs queued: pass it to another instance
                    self._cond.wait()
                    continue
                batch, wait_ns = self._queue.next_batch(self.clock(), flush=self._stopping)
                if not batch:
                    if wait_ns < 0:
                        if self._stopping:
                            return None, None, None
                        self._cond.wait()
                    else:
                        self._cond.wait(wait_ns / 1e9)
                    continue
                gate_in = gate_out = None
                if self._preserve_ordering:
                    gate_in, gate_out = self._last_gate, threading.Event()
                    self._last_gate = gate_out
                if len(self._queue):
                    self._cond.notify()  # another idle instance can take the rest
                self._busy.add(index)
                return batch, gate_in, gate_out


def _input_bytes(batch: list[Job]) -> int:
    """About the input bytes of ``batch``: its first job's, times the jobs (one signature: alike shapes)."""
    first = 0
    for array in batch[0].feeds.values():
        first += array.nbytes
    return first * len(batch)

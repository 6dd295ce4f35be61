"""Triton's sequence batcher: stateful models, one correlation id per sequence.

Rules (Triton's ``architecture.md`` "Stateful Models" and the core's
``sequence_batch_scheduler.cc``, in fastoip's words):
- Every request names its sequence (``sequence_id``: uint64 or string) and may
  carry ``sequence_start`` / ``sequence_end``.  A request without an id, a
  request with batch size above 1, and a request that continues a sequence the
  scheduler does not know (never started, ended, or released as idle) fail with
  Triton's INVALID_ARGUMENT messages.  A START for a sequence that is still
  running begins it anew (Triton logs the conflict and goes on).
- A sequence holds a slot from its first request until its END executes, or
  until it has been idle longer than ``max_sequence_idle_microseconds``.  When
  every slot is taken, new sequences wait in a backlog (they never fail for
  lack of slots) and take slots in arrival order.  Slots: ``max_batch_size``
  (1 without batching) per instance; ``oldest``'s ``max_candidate_sequences``
  when set.
- ``direct``: a sequence is bound to one instance for its whole life.
  ``oldest``: any instance takes the sequences whose next request is oldest.
  Either way a batch holds at most one request per sequence, and the requests
  of one sequence run one at a time, in order.  ``oldest``: a batch runs when
  it has ``max_batch_size`` requests (the largest preferred size), or when its
  oldest request has waited ``max_queue_delay_microseconds``.  ``direct``: it
  runs at once unless ``minimum_slot_utilization`` is set; then it waits (up to
  ``max_queue_delay_microseconds`` for its oldest request) until at least that
  share of ``max_batch_size`` sequences have a request ready.
- Control inputs are filled per request (START, END, READY, CORRID with the
  config's false/true values); implicit state inputs come from the sequence's
  previous state outputs, or the initial state at START.  Clients never send
  them, and state outputs are not returned unless the client asked for them.
- Abandoned sequences give their slot back (issue 27): a request whose client
  went away (cancelled, e.g. its stream closed, or past its deadline) before it
  ran leaves its queue at the next decision; a sequence left with nothing queued
  by that frees its slot (or its place in the backlog) at once instead of after
  the idle timeout.  At most ``BACKLOG_LIMIT`` sequences wait for a slot per
  model: a new one beyond that is refused with UNAVAILABLE (retryable), as
  Triton refuses requests over a dynamic batcher's ``max_queue_size``.
- ``iterative_sequence: true`` (Triton's generative sequencer, for request
  rescheduling): a request without a correlation id is a sequence of its own,
  named by the batcher (its first run says START); a sequence runs one request
  at a time until that request is finished, and a request its model releases
  with RESCHEDULE (``Job.reschedule``) goes back to the front of its sequence's
  queue and runs again with neither START nor END.  A named sequence gives its
  slot back when its request is finished for good.  A decoupled model's
  responses stream to the client's job as they come.
- The clock is injectable: the decisions are tested without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument, Unavailable
from ..types import InferOutput, InferRequest, InferResponse
from .job import Job
from .sequence_settings import SequenceSettings, control_tensor

log = logging.getLogger("fastoip.sequence")

Clock = Callable[[], int]
#: Sequences of one model waiting for a slot, at most (issue 27: abandoned clients must not queue forever).
BACKLOG_LIMIT = 4096
#: Runs a batch of jobs on one instance and finishes each (``scheduling.execute.run_jobs`` in the server).
RunBatch = Callable[[Any, Sequence[Job]], None]


class SequenceModel(Protocol):
    """What the sequence batcher reads of its model."""

    name: str
    config: mc.ModelConfig
    backends: list[Any]


@dataclass
class SequenceTarget:
    """A SequenceModel made of the scheduler factory's arguments: the model's name, config and instances."""

    name: str
    config: mc.ModelConfig
    backends: list[Any]


@dataclass
class _Pending:
    job: Job
    start: bool
    end: bool
    queued_ns: int  # on the batcher's clock: decides order and the queue delay
    rescheduled: bool = False  # its model sent it back to run again (iterative sequences)


@dataclass
class _Sequence:
    corrid: object
    last_ns: int
    queue: deque[_Pending] = field(default_factory=deque)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    instance: int = -1
    active: bool = False
    busy: bool = False
    #: Named by the batcher (iterative sequences: the request came without a correlation id).
    generated: bool = False
    #: Iterative sequences: its request is with the model (until finished or rescheduled).
    running: bool = False


@dataclass(frozen=True)
class Batch:
    """What one instance runs next: the sequences and the request each contributes."""

    instance: int
    entries: tuple[tuple[_Sequence, _Pending], ...]


class SequenceBatcher:
    """The scheduler for models with ``sequence_batching``."""

    def __init__(
        self,
        model: SequenceModel,
        settings: SequenceSettings,
        run_batch: RunBatch,
        *,
        clock: Clock = time.monotonic_ns,
        start_threads: bool = True,
    ) -> None:
        self.model = model
        self.settings = settings
        self.run_batch = run_batch
        self.clock = clock
        self.batched = model.config.max_batch_size > 0
        self.max_batch = max(model.config.max_batch_size, 1)
        self.instances = len(model.backends)
        per_instance = self.max_batch
        if settings.strategy == "oldest" and settings.max_candidates > 0:
            per_instance = settings.max_candidates
        self.slots_per_instance = per_instance
        self.total_slots = per_instance * self.instances
        self._by_id: dict[object, _Sequence] = {}
        self._active: list[_Sequence] = []
        self._backlog: deque[_Sequence] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        #: The correlation ids an iterative batcher gives requests that came without one (Triton's counts from 1).
        self._generated_ids = 1
        self._threads: list[threading.Thread] = []
        if start_threads:
            for index in range(self.instances):
                thread = threading.Thread(target=self._work, args=(index,), daemon=True,
                                          name=f"fastoip-seq-{model.name}-{index}")
                thread.start()
                self._threads.append(thread)

    # -- the Scheduler contract ------------------------------------------------------
    def enqueue(self, job: Job) -> None:
        job.arm()
        try:
            corrid, start, end = self._sequence_of(job)
        except InvalidArgument as exc:
            job.fail(exc)
            return
        with self._cond:
            if self._stopped:
                job.fail(Unavailable(f"model '{self.model.name}' is unloading and accepts no new sequence requests"))
                return
            now = self.clock()
            self._reap(now)
            if corrid is None:  # iterative: a sequence of its own, never continued by a client
                corrid = self._generated_ids if self.settings.corrid_datatype != "BYTES" else str(self._generated_ids)
                self._generated_ids += 1
                named = _Sequence(corrid, now, generated=True)
                self._admit(named)
                named.queue.append(_Pending(job, True, False, now))
                self._cond.notify_all()
                return
            sequence = self._by_id.get(corrid)
            if sequence is None:
                if not start:
                    job.fail(InvalidArgument(
                        f"inference request for sequence {corrid} to model '{self.model.name}' must specify the "
                        "START flag on the first request of the sequence"
                    ))
                    return
                if len(self._active) >= self.total_slots and len(self._backlog) >= BACKLOG_LIMIT:
                    self._drop_abandoned()
                    if len(self._backlog) >= BACKLOG_LIMIT:
                        job.fail(Unavailable(
                            f"model '{self.model.name}' has {len(self._backlog)} sequences waiting for a slot "
                            f"(the limit is {BACKLOG_LIMIT}); try the sequence again later"
                        ))
                        return
                sequence = _Sequence(corrid, now)
                self._by_id[corrid] = sequence
                self._admit(sequence)
            elif start:
                log.warning("sequence %s for model '%s' has a conflict: the previous sequence did not end before "
                            "this sequence start; it starts anew", corrid, self.model.name)
            sequence.queue.append(_Pending(job, start, end, now))
            sequence.last_ns = now
            if end:
                del self._by_id[corrid]  # a later START with this id is a new sequence
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return sum(len(s.queue) for s in self._active) + sum(len(s.queue) for s in self._backlog)

    def stop(self) -> None:
        """Fail what is still queued; executions in flight finish."""
        with self._cond:
            self._stopped = True
            left = [p for s in [*self._active, *self._backlog] for p in s.queue]
            for sequence in [*self._active, *self._backlog]:
                sequence.queue.clear()
            self._cond.notify_all()
        for pending in left:
            pending.job.fail(Unavailable(f"model '{self.model.name}' was unloaded"))

    # -- slots --------------------------------------------------------------------
    def _sequence_of(self, job: Job) -> tuple[object | None, bool, bool]:
        name = self.model.name
        params = job.request.parameters
        corrid = params.get("sequence_id", 0)
        if job.batch_size > 1:
            raise InvalidArgument(
                f"inference request to model '{name}' must specify batch-size 1 due to requirements of sequence batcher"
            )
        if corrid in (0, "") and self.settings.iterative and not isinstance(corrid, bool):
            return None, True, False  # Triton's generative sequencer names it (enqueue)
        if corrid in (0, "") or isinstance(corrid, bool):
            raise InvalidArgument(f"inference request to model '{name}' must specify a non-zero or non-empty "
                                  "correlation ID")
        wanted = self.settings.corrid_datatype
        if wanted is not None and (wanted == "BYTES") != isinstance(corrid, str):
            sent = "BYTES" if isinstance(corrid, str) else "UINT64"
            raise InvalidArgument(
                f"sequence batching control '{self._corrid_control()}' data-type is '{sent}', but model '{name}' "
                f"expects '{wanted}'"
            )
        return corrid, bool(params.get("sequence_start", False)), bool(params.get("sequence_end", False))

    def _corrid_control(self) -> str:
        return next(c.name for c in self.settings.controls if c.kind == "CORRID")

    def _admit(self, sequence: _Sequence) -> None:
        if len(self._active) < self.total_slots:
            self._activate(sequence)
        else:
            self._backlog.append(sequence)

    def _activate(self, sequence: _Sequence) -> None:
        sequence.active = True
        if self.settings.strategy == "direct":
            load = [0] * self.instances
            for other in self._active:
                load[other.instance] += 1
            sequence.instance = min(range(self.instances), key=lambda i: (load[i], i))
        self._active.append(sequence)

    def _release(self, sequence: _Sequence) -> None:
        if not sequence.active:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        sequence.active = False
        self._active.remove(sequence)
        if self._by_id.get(sequence.corrid) is sequence:
            del self._by_id[sequence.corrid]
        while self._backlog and len(self._active) < self.total_slots:
            self._activate(self._backlog.popleft())

    def _drop_abandoned(self) -> None:
        """Requests that finished before they ran (their client cancelled, or their deadline passed) leave the
        queues; a sequence that is left with nothing by that gives its slot or backlog place back."""
        if any(s.queue and s.queue[0].job.finished for s in self._backlog):
            kept: deque[_Sequence] = deque()
            for sequence in self._backlog:
                while sequence.queue and sequence.queue[0].job.finished:
                    sequence.queue.popleft()
                if sequence.queue:
                    kept.append(sequence)
                elif self._by_id.get(sequence.corrid) is sequence:
                    del self._by_id[sequence.corrid]
            self._backlog = kept
        for sequence in list(self._active):
            dropped = False
            while sequence.queue and sequence.queue[0].job.finished:
                sequence.queue.popleft()
                dropped = True
            if dropped and not sequence.queue and not sequence.busy:
                log.info("sequence %s of model '%s' released: its client went away", sequence.corrid,
                         self.model.name)
                self._release(sequence)

    def _reap(self, now: int) -> None:
        """Release slots of sequences idle longer than the limit (nothing queued or running)."""
        idle = self.settings.idle_ns
        for sequence in list(self._active):
            if not sequence.busy and not sequence.queue and now - sequence.last_ns > idle:
                log.info("sequence %s of model '%s' released after %.1f ms idle", sequence.corrid,
                         self.model.name, (now - sequence.last_ns) / 1e6)
                self._release(sequence)

    # -- decisions ------------------------------------------------------------------
    def next_batch(self, instance: int, now: int) -> Batch | int | None:
        """What ``instance`` should do at ``now`` (call with the lock held, or single-threaded).

        A Batch to run; or the clock time to look again (waiting for the queue delay or
        an idle release); or None when there is nothing to wait for.
        """
        self._drop_abandoned()
        self._reap(now)
        direct = self.settings.strategy == "direct"
        ready = [s for s in self._active if not s.busy and s.queue and (not direct or s.instance == instance)]
        wake: int | None = self._next_idle_deadline()
        if ready:
            ready.sort(key=lambda s: s.queue[0].queued_ns)
            signature = self._signature(ready[0])
            chosen = [s for s in ready if self._signature(s) == signature][: self.max_batch]
            ripe_at = ready[0].queue[0].queued_ns + self.settings.queue_delay_ns
            if direct:
                # Triton's direct batcher: the delay holds a batch back only while the share of this instance's
                # slots with a request ready is under minimum_slot_utilization (0, the default: never)
                share = self.settings.minimum_slot_utilization
                enough = share <= 0.0 or len(ready) / self.max_batch >= share
            else:
                target = max(self.settings.preferred_batch_sizes or (self.max_batch,))
                enough = len(chosen) >= min(target, self.max_batch)
            if enough or now >= ripe_at:
                return Batch(instance, tuple((s, s.queue[0]) for s in chosen))
            wake = ripe_at if wake is None else min(wake, ripe_at)
        return wake

    def _signature(self, sequence: _Sequence) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The next request's input shapes and its implicit states' shapes (variable-sized states batch only
        with states of the same shape)."""
        pending = sequence.queue[0]
        states = tuple(
            (state.input_name, tuple(state.initial.shape if pending.start
                                     else sequence.state.get(state.input_name, state.initial).shape))
            for state in self.settings.states
        )
        return _signature(pending.job) + states

    def _next_idle_deadline(self) -> int | None:
        idle = [s.last_ns + self.settings.idle_ns + 1 for s in self._active if not s.busy and not s.queue]
        return min(idle) if idle else None

    def take(self, batch: Batch) -> None:
        """Mark ``batch``'s sequences busy and take their requests off their queues."""
        for sequence, pending in batch.entries:
            sequence.busy = True
            sequence.running = self.settings.iterative
            popped = sequence.queue.popleft()
            assert popped is pending

    def complete(self, batch: Batch, now: int) -> None:
        """After ``batch`` ran: free its sequences; an END releases the slot.  (Iterative: a sequence whose request
        is still with the model stays busy until it is finished or rescheduled: :meth:`_run_over`.)"""
        for sequence, pending in batch.entries:
            if self.settings.iterative:
                sequence.last_ns = now
                if not sequence.running:
                    self._run_over(sequence, pending)
                continue
            sequence.busy = False
            sequence.last_ns = now
            if pending.end:  # nothing can follow an END in its queue: the id was forgotten at enqueue
                self._release(sequence)
            elif pending.job.cancelled and not sequence.queue:  # its client went away (issue 27)
                self._release(sequence)

    def _run_over(self, sequence: _Sequence, pending: _Pending) -> None:
        """Iterative (the lock is held): ``pending``'s run is over: the sequence is free for its next request (a
        rescheduled one first); finished for good, a named sequence or an END gives its slot back."""
        sequence.busy = False
        sequence.running = False
        if sequence.queue and sequence.queue[0].rescheduled:
            return
        if sequence.generated or pending.end or (pending.job.cancelled and not sequence.queue):
            self._release(sequence)

    def _rescheduled(self, sequence: _Sequence, pending: _Pending, job: Job) -> None:
        """The model released ``pending``'s request with RESCHEDULE (any thread): it runs again, first in its
        sequence, with neither START nor END (Triton's generative sequencer)."""
        with self._cond:
            now = self.clock()
            again = _Pending(pending.job, False, pending.end and not sequence.generated, now, True)
            sequence.queue.appendleft(again)
            sequence.last_ns = now
            if not sequence.active and sequence not in self._backlog:
                self._admit(sequence)  # (released meanwhile: it comes back)
            self._run_over(sequence, pending)
            self._cond.notify_all()

    def _finished_for_good(self, sequence: _Sequence, pending: _Pending) -> None:
        with self._cond:
            sequence.last_ns = self.clock()
            self._run_over(sequence, pending)
            self._cond.notify_all()

    # -- execution ---------------------------------------------------------------------
    def _work(self, instance: int) -> None:
        backend = self.model.backends[instance]
        while True:
            with self._cond:
                batch = None
                while not self._stopped:
                    now = self.clock()
                    decision = self.next_batch(instance, now)
                    if isinstance(decision, Batch):
                        batch = decision
                        self.take(batch)
                        break
                    timeout = None if decision is None else max(decision - now, 0) / 1e9
                    self._cond.wait(timeout)
                if batch is None:
                    return
            try:
                self.execute(backend, batch)
            finally:
                with self._cond:
                    self.complete(batch, self.clock())
                    self._cond.notify_all()

    def execute(self, backend: Any, batch: Batch) -> None:
        """Run ``batch`` with its control and state inputs; finish each client job."""
        inner_jobs = []
        skipped = []
        for sequence, pending in batch.entries:
            job = pending.job
            if job.finished:  # cancelled or expired while queued
                skipped.append(sequence)
                continue
            inner = Job(self._request(sequence, pending), self._feeds(sequence, pending), job.batch_size,
                        self._outputs(job))
            inner.arrival_ns = job.arrival_ns
            inner.deadline_ns = job.deadline_ns
            inner.on_done(partial(self._finish, sequence, pending))
            if job.decoupled:  # its responses go to the client as they come
                inner.stream_to(lambda _inner, response, job=job: job.send(response))  # type: ignore[misc]
            if self.settings.iterative:
                inner.reschedule_to(partial(self._rescheduled, sequence, pending))
            inner_jobs.append(inner)
        if skipped and self.settings.iterative:
            with self._cond:
                for sequence in skipped:
                    sequence.running = False  # (complete frees it)
        if inner_jobs:
            self.run_batch(backend, inner_jobs)

    def _request(self, sequence: _Sequence, pending: _Pending) -> InferRequest:
        """The request as the model sees it: the client's, or (a named or rescheduled run) with the sequence's id
        and this run's START / END, as Triton's generative sequencer sets them."""
        request = pending.job.request
        if not (sequence.generated or pending.rescheduled):
            return request
        parameters = dict(request.parameters)
        parameters["sequence_id"] = sequence.corrid  # type: ignore[assignment]  # (an int or str id)
        parameters["sequence_start"] = pending.start
        parameters["sequence_end"] = pending.end
        return InferRequest(request.model_name, request.model_version, request.id, parameters, request.inputs,
                            request.outputs)

    def _feeds(self, sequence: _Sequence, pending: _Pending) -> dict[str, np.ndarray]:
        feeds = dict(pending.job.feeds)
        values = {"START": pending.start, "END": pending.end, "READY": True, "CORRID": sequence.corrid}
        for control in self.settings.controls:
            feeds[control.name] = control_tensor(control, values[control.kind], self.batched)
        if pending.start:
            sequence.state = {}
        for state in self.settings.states:
            current = sequence.state.get(state.input_name, state.initial)
            feeds[state.input_name] = current[np.newaxis] if self.batched else current
        return feeds

    def _outputs(self, job: Job) -> list[str]:
        wanted = list(job.output_names)
        return wanted + [s.output_name for s in self.settings.states if s.output_name not in wanted]

    def _finish(self, sequence: _Sequence, pending: _Pending, inner: Job) -> None:
        try:
            self._finish_job(sequence, pending, inner)
        finally:
            if self.settings.iterative:
                self._finished_for_good(sequence, pending)

    def _finish_job(self, sequence: _Sequence, pending: _Pending, inner: Job) -> None:
        job = pending.job
        job.release_inputs()  # the execution is over (the inner job has let go of its own references)
        job.queue_ns, job.compute_start_ns, job.compute_end_ns = inner.queue_ns, inner.compute_start_ns, \
            inner.compute_end_ns
        if job.decoupled and inner.error is None and inner.response is None:
            job.end_stream(alone=inner.final_alone)  # (its responses went to the client as they came)
            return
        if inner.error is not None or inner.response is None:
            job.fail(inner.error or Unavailable("the sequence request produced no response"))
            return
        by_name = {o.name: o for o in inner.response.outputs}
        for state in self.settings.states:
            produced = by_name[state.output_name].data
            assert produced is not None
            # a copy: the batch output this row views is released with the batch
            sequence.state[state.input_name] = np.array(produced[0] if self.batched else produced, copy=True)
        wanted = set(job.output_names)
        outputs: list[InferOutput] = [o for o in inner.response.outputs if o.name in wanted]
        response = inner.response
        job.finish(InferResponse(response.model_name, response.model_version, response.id, response.parameters,
                                 outputs))


def _signature(job: Job) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Requests batch together only when their inputs have the same non-batch shapes."""
    return tuple((name, tuple(array.shape[1:])) for name, array in job.feeds.items())

"""The ensemble scheduler: one request runs a graph of composing models.

Rules:
- Each step is an ordinary request to its composing model, started through the
  request runner the data plane uses (:class:`StepRunner`): the same version
  handover, validation, scheduler and completion (reshape back, classification,
  statistics) as a direct request; a batched composing model batches steps of
  many ensemble requests together with its direct clients.
- A step starts as soon as every tensor it reads exists; steps that do not
  depend on each other run at the same time.
- Tensors pass between steps as the arrays the previous step produced (no copy).
- The first failing step fails the ensemble request with that step's error,
  naming the step; steps still running finish, and nothing new starts.
- Composing models record their own request statistics (the runner's completion), as Triton reports them.
- A traced ensemble request's steps are traced as its children (``parent_id``), as Triton's.
- Sequence parameters follow Triton's ensemble: a step whose response carries
  ``sequence_id``, ``sequence_start`` or ``sequence_end`` marks the tensors it
  produced with that sequence id (the step's own when the response names
  none) and those flags (absent: false).  A later step that reads a marked
  tensor runs with them instead of the ensemble request's (the first marked
  tensor wins when two disagree, logged), and the ensemble's response echoes
  ``sequence_id``, ``sequence_start`` and ``sequence_end`` when one of its
  outputs is a marked tensor.
- A decoupled composing model (Triton's decoupled step) makes the ensemble
  decoupled: each of its responses opens a branch of the request that runs the
  steps after it on that response's outputs (no other tensor reaches them: the
  load checks Triton's rule that a step's inputs share one decoupled lineage).
  Each branch that produced requested outputs answers them as one response when
  its steps are done; the last branch's response ends the call and carries the
  final flag (Triton's ensemble marks it so), or the flag comes alone when that
  branch answered nothing.  Without a decoupled step there is one branch and
  one response, as before.
- Tensors pass between a batching and a non-batching model as Triton's
  ensemble passes them (:func:`batch_reshape`): a batch dimension of 1 is
  added or removed where the receiver's config dims say so (a view, no copy).
- ``max_inflight_requests`` (Triton's ensemble back-pressure): at most that many
  requests run in each step at once, counted across every request of the
  ensemble (one :class:`StepLimiter` per step; 0: no limit).  A step started
  takes a slot until it is done; a step that finds none waits in its limiter's
  queue (no thread waits: Triton blocks the thread that would start it) and
  starts, in arrival order, when a slot is given back.  A step whose request
  was cancelled or failed meanwhile does not start and passes the slot on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from ..errors import InferenceError, InvalidArgument
from ..types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from .job import Job

log = logging.getLogger("fastoip.scheduling")

#: The response parameters that carry a sequence past a step (Triton's ensemble reads these three).
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


class StepRunner(Protocol):
    """How a step runs: the request runner under the Core (``repository.runner.RequestRunner``)."""

    def start(
        self,
        request: InferRequest,
        deadline_ns: int,
        on_done: Callable[[Job], None],
        parent: Job | None = None,
        on_response: Callable[[Job, InferResponse], None] | None = None,
    ) -> Job:
        """Enter the composing model, prepare, enqueue; ``on_done`` once outputs, in-flight count and
        statistics are done (``parent``: the ensemble request, whose trace the step's is a child of;
        ``on_response``: where a decoupled model's responses go, before ``on_done``).
        Raises InferenceError for a step that cannot start."""


class Step(Protocol):
    """A planned step (see ``repository.ensemble.EnsembleStep``)."""

    @property
    def index(self) -> int: ...
    @property
    def model_name(self) -> str: ...
    @property
    def model_version(self) -> str: ...
    @property
    def inputs(self) -> dict[str, str]: ...
    @property
    def outputs(self) -> dict[str, str]: ...
    @property
    def needs(self) -> frozenset[str]: ...
    @property
    def decoupled(self) -> bool: ...
    @property
    def batching(self) -> bool: ...
    @property
    def input_dims(self) -> dict[str, tuple[int, ...]]: ...


class Plan(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def steps(self) -> tuple[Step, ...]: ...
    @property
    def batching(self) -> bool: ...
    @property
    def output_dims(self) -> dict[str, tuple[int, ...]]: ...


class StepLimiter:
    """At most ``limit`` steps of one index in flight across an ensemble's requests (Triton's
    ``StepInflightRequestLimiter``, without the blocked thread): launches past the limit wait in order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiting: deque[Callable[[], bool]] = deque()
        self._lock = threading.Lock()

    def acquire(self, launch: Callable[[], bool]) -> None:
        """Run ``launch`` now when a slot is free, else when one is released.  ``launch`` answers whether
        it took the slot (False: its step did not start, and the slot passes on)."""
        with self._lock:
            if self.in_flight >= self.limit:
                self._waiting.append(launch)
                return
            self.in_flight += 1
        if not launch():
            self.release()

    def release(self) -> None:
        """Give a slot back: the first waiting launch takes it, or it is free."""
        while True:  # a loop, not recursion: waiting launches that do not start pass the slot on in turn
            with self._lock:
                if not self._waiting:
                    self.in_flight -= 1
                    return
                launch = self._waiting.popleft()
            if launch():
                return

    def waiting(self) -> int:
        return len(self._waiting)


class EnsembleScheduler:
    """Runs ensemble requests; holds no queue of its own (steps queue in their models, or in a step's
    limiter under ``max_inflight_requests``)."""

    def __init__(
        self, plan: Plan, runner: StepRunner, max_inflight_requests: int = 0, *, decoupled: bool = False
    ) -> None:
        self.plan = plan
        self.runner = runner
        #: A step is decoupled: the ensemble answers a response per branch, then the final flag alone.
        self.decoupled = decoupled
        #: Step index -> the indices of the steps that read what it produced, directly or further on.
        self.after = steps_after(plan.steps)
        self._running = 0
        self._lock = threading.Lock()
        #: Step index -> its limiter (empty: no ``max_inflight_requests``).
        self.limiters: dict[int, StepLimiter] = {}
        if max_inflight_requests > 0:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d", plan.name,
                     max_inflight_requests)  # Triton's words (its qa/L0_simple_ensemble greps them)
            self.limiters = {step.index: StepLimiter(max_inflight_requests) for step in plan.steps}

    def enqueue(self, job: Job) -> None:
        """Start ``job``'s steps; it finishes (``on_done``, ``wait``) when the last one has."""
        job.arm()
        with self._lock:
            self._running += 1
        _EnsembleRun(self, job).start()

    def finished_one(self) -> None:
        with self._lock:
            self._running -= 1

    def pending(self) -> int:
        return self._running

    def stop(self) -> None:
        """Nothing queued here: steps in flight finish in their own models."""


class _Branch:
    """The tensors of one lineage of an ensemble request: the request's own (the root), or one response of a
    decoupled step and what the steps after it make of it."""

    __slots__ = ("tensors", "batch", "sequences", "waiting", "running", "produced", "closed")

    def __init__(self, tensors: dict[str, InferInput | InferOutput], waiting: list[Step]) -> None:
        self.tensors = tensors
        #: Tensor name -> its batch size when a batching model (or ensemble) made it, 0 when a non-batching one.
        self.batch: dict[str, int] = {}
        #: Tensor name -> the sequence parameters the step that produced it answered with (Triton's override).
        self.sequences: dict[str, dict[str, Any]] = {}
        #: Steps not started yet (in plan order).
        self.waiting = waiting
        #: Steps started (or starting) and not done.
        self.running = 0
        #: Tensors produced in this branch (a decoupled ensemble answers each branch's own outputs).
        self.produced: set[str] = set()
        self.closed = False


class _EnsembleRun:
    """One ensemble request in flight: its branches (one, unless a step is decoupled) and the steps left."""

    def __init__(self, scheduler: EnsembleScheduler, job: Job) -> None:
        self.scheduler = scheduler
        self.job = job
        inputs = job.request.inputs
        # Triton prunes the steps whose outputs no requested output depends on
        self.root = _Branch({t.name: t for t in inputs}, needed_steps(scheduler.plan.steps, job.output_names))
        batching = scheduler.plan.batching
        self.root.batch = {t.name: (int(t.shape[0]) if batching and t.shape else 0) for t in inputs}
        self.open_branches = 1
        #: Step jobs started and not done (cancelled when the request fails), by launch number.
        self.jobs: dict[int, Job | None] = {}
        self._launches = 0
        self.failed = False
        self.lock = threading.Lock()

    def start(self) -> None:
        self._launch_ready(self.root)

    def _launch_ready(self, branch: _Branch) -> None:
        with self.lock:
            if not self.failed and self.job.finished:  # the client cancelled or its deadline passed
                self.failed = True
            ready: list[tuple[Step, list[Step]]] = []
            if self.failed:
                branch.waiting = []
            else:
                for step in [s for s in branch.waiting if s.needs <= branch.tensors.keys()]:
                    branch.waiting.remove(step)
                    after: list[Step] = []
                    if step.decoupled:  # the steps after it run once per response, each in its own branch
                        follows = self.scheduler.after[step.index]
                        after = [s for s in branch.waiting if s.index in follows]
                        branch.waiting = [s for s in branch.waiting if s.index not in follows]
                    ready.append((step, after))
                branch.running += len(ready)  # from now on: a step that finishes at once must not close it
            # nothing running and nothing to start: the branch is done (a step still waiting needs a tensor no
            # step produced, as when a composing model left that output out, and it never will)
            closing = branch.running == 0 and not ready and not branch.closed
            last = False
            response: InferResponse | None = None
            if closing:
                branch.closed = True
                self.open_branches -= 1
                last = self.open_branches == 0
                if self.scheduler.decoupled and not self.failed and branch.produced:
                    response = self._response(branch)
                    if response is not None and not last:
                        # under the lock: every branch's response goes out before the last one
                        self.job.send(response)
        if last:
            self._end(response)
            return
        limiters = self.scheduler.limiters
        for step, after in ready:
            if limiters:
                limiters[step.index].acquire(partial(self._launch_if_wanted, branch, step, after))
            else:
                self._launch(branch, step, after)

    def _launch_if_wanted(self, branch: _Branch, step: Step, after: list[Step]) -> bool:
        """A step that waited for a limiter slot: start it unless its request failed or ended meanwhile.
        True when it started (and holds the slot until it is done)."""
        with self.lock:
            if not self.failed and self.job.finished:  # cancelled, or its deadline passed, while it waited
                self.failed = True
            dropped = self.failed
        if not dropped:
            return self._launch(branch, step, after)
        self._step_ended(branch)
        return False

    def _launch(self, branch: _Branch, step: Step, after: list[Step]) -> bool:
        """Start ``step`` in ``branch``; False when it could not start (the request fails with its error)."""
        # Triton hands each step the ensemble request's parameters (sequence id and flags, priority, ...)
        parameters = dict(self.job.request.parameters)
        chosen: dict[str, Any] | None = None
        for tensor in step.inputs.values():
            marked = branch.sequences.get(tensor)
            if marked is None:
                continue
            if chosen is None:
                chosen = marked
                parameters.update(marked)
            elif marked != chosen:
                log.error(
                    "ensemble '%s', step %d ('%s'): different sequence parameters are set for its inputs; "
                    "%s is used", self.scheduler.plan.name, step.index, step.model_name, chosen,
                )
        request = InferRequest(
            step.model_name,
            step.model_version,
            self.job.request.id,
            parameters=parameters,
            inputs=[
                _as_input(model_input, branch.tensors[tensor], step.input_dims.get(model_input), step.batching,
                          branch.batch.get(tensor, 0))
                for model_input, tensor in step.inputs.items()
            ],
            outputs=[RequestedOutput(name) for name in step.outputs],
        )
        with self.lock:
            self._launches += 1
            launch = self._launches
            self.jobs[launch] = None
        on_response = partial(self._step_response, step, after) if step.decoupled else None
        try:
            sub = self.scheduler.runner.start(
                request, self.job.deadline_ns, partial(self._step_done, branch, step, after, launch), self.job,
                on_response,
            )
        except InferenceError as exc:
            with self.lock:
                self.jobs.pop(launch, None)
            self._fail(step, exc)
            self._step_ended(branch)
            return False
        with self.lock:
            if launch in self.jobs:  # not finished already
                self.jobs[launch] = sub
            cancel = self.failed
        if cancel:  # another step failed while this one was starting
            sub.cancel()
        return True

    def _step_response(self, step: Step, after: list[Step], sub: Job, response: InferResponse) -> None:
        """One response of a decoupled step: a branch of its own runs the steps after it on these outputs."""
        child = _Branch({}, list(after))
        if not self._take_outputs(step, sub, response, child):
            return
        with self.lock:
            if self.failed:
                return
            self.open_branches += 1  # before the step's final flag can close the last branch
        self._launch_ready(child)

    def _step_done(self, branch: _Branch, step: Step, after: list[Step], launch: int, sub: Job) -> None:
        limiters = self.scheduler.limiters
        if limiters:  # before anything else: a step waiting for the slot starts now
            limiters[step.index].release()
        with self.lock:
            self.jobs.pop(launch, None)
        if sub.error is not None:
            self._fail(step, sub.error)
        elif step.decoupled:  # its outputs go to branches of their own; its last response may come with the end
            if sub.response is not None:
                self._step_response(step, after, sub, sub.response)
        else:
            assert sub.response is not None
            self._take_outputs(step, sub, sub.response, branch)
        self._step_ended(branch)

    def _take_outputs(self, step: Step, sub: Job, response: InferResponse, branch: _Branch) -> bool:
        """Put the step's mapped outputs of ``response`` into ``branch``, each marked with the sequence it belongs
        to; False (and the ensemble failed) when the response's sequence parameters are invalid."""
        try:
            marked = _sequence_override(sub.request.parameters, response.parameters or {})
        except InvalidArgument as exc:
            self._fail(step, exc)
            return False
        if marked is None:  # Triton marks a step's outputs with the sequence id and flags it ran with
            marked = _step_sequence(sub.request.parameters)
        with self.lock:
            for output in response.outputs:
                tensor = step.outputs.get(output.name)
                if tensor is not None:
                    branch.tensors[tensor] = output
                    branch.batch[tensor] = int(output.shape[0]) if step.batching and output.shape else 0
                    branch.produced.add(tensor)
                    branch.sequences[tensor] = marked
        return True

    def _step_ended(self, branch: _Branch) -> None:
        with self.lock:
            branch.running -= 1
        self._launch_ready(branch)

    def _fail(self, step: Step, error: BaseException) -> None:
        with self.lock:
            first = not self.failed
            self.failed = True
            others = [other for other in self.jobs.values() if other is not None]
        if first:
            if isinstance(error, InferenceError):
                where = f"in ensemble '{self.scheduler.plan.name}', step {step.index} ('{step.model_name}')"
                error = type(error)(f"{where}: {error.message}")
            self.job.fail(error)
            for other in others:
                other.cancel()

    def _response(self, branch: _Branch) -> InferResponse | None:
        """A decoupled ensemble's response: the requested outputs ``branch`` produced (None: it produced none)."""
        outputs, parameters = self._outputs(branch, [n for n in self.job.output_names if n in branch.produced])
        if not outputs:
            return None
        request = self.job.request
        return InferResponse(request.model_name, request.model_version, request.id, parameters or None, outputs)

    def _outputs(self, branch: _Branch, names: Iterable[str]) -> tuple[list[InferOutput], dict[str, Any]]:
        outputs = []
        parameters: dict[str, Any] = {}
        for name in names:
            tensor = branch.tensors.get(name)
            if tensor is None:  # Triton answers without it (its words, at verbose level)
                log.debug("Composing models did not output tensor %s", name)
                continue
            plan = self.scheduler.plan
            shape = batch_reshape(plan.output_dims.get(name), plan.batching, branch.batch.get(name, 0),
                                  tuple(tensor.shape))
            data = tensor.data if shape == tuple(tensor.shape) or tensor.data is None else tensor.data.reshape(shape)
            outputs.append(InferOutput(name, tensor.datatype, shape, data))
            marked = branch.sequences.get(name)
            if marked is not None:
                parameters.update(marked)  # Triton adds them once per marked output: the last one stands
        return outputs, parameters

    def _end(self, last: InferResponse | None) -> None:
        """The last branch closed: the request ends once.  Decoupled: with the last branch's response, which
        carries the final flag (Triton's ensemble marks the response it sends last final), else the final
        flag alone."""
        self.scheduler.finished_one()
        if self.failed:
            return
        if self.scheduler.decoupled:
            if last is not None:
                self.job.finish(last)
            else:
                self.job.end_stream()
            return
        outputs, parameters = self._outputs(self.root, self.job.output_names)
        request = self.job.request
        self.job.finish(
            InferResponse(request.model_name, request.model_version, request.id, parameters or None, outputs)
        )


def _sequence_override(request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any] | None:
    """The sequence parameters a step's response sets for the tensors it produced, or None when it sets none.

    Triton's reading: the sequence id is the response's, else the step request's; each flag is the response's
    boolean, else false.
    """
    if not any(key in response for key in SEQUENCE_PARAMETERS):
        return None
    sequence_id = response.get("sequence_id", request.get("sequence_id", 0))
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)):
        raise InvalidArgument("expected parameter 'sequence_id' to be an integer or a string")
    marked: dict[str, Any] = {"sequence_id": sequence_id}
    for flag in ("sequence_start", "sequence_end"):
        value = response.get(flag, False)
        if not isinstance(value, bool):
            raise InvalidArgument(f"expect parameter '{flag}' to be a boolean")
        marked[flag] = value
    return marked


def _step_sequence(request: dict[str, Any]) -> dict[str, Any]:
    """The sequence id and flags a step ran with (no sequence: id 0, both flags false)."""
    return {
        "sequence_id": request.get("sequence_id", 0),
        "sequence_start": request.get("sequence_start") is True,
        "sequence_end": request.get("sequence_end") is True,
    }


def _as_input(
    name: str, tensor: InferInput | InferOutput | None, dims: tuple[int, ...] | None, batching: bool, batch: int
) -> InferInput:
    assert tensor is not None
    shape = batch_reshape(dims, batching, batch, tuple(tensor.shape))
    data = tensor.data
    if shape != tuple(tensor.shape) and isinstance(data, np.ndarray):
        data = data.reshape(shape)  # a view: the same bytes with a batch dimension added or removed
    return InferInput(name, tensor.datatype, shape, data)


def batch_reshape(
    dims: tuple[int, ...] | None, batching: bool, batch: int, shape: tuple[int, ...]
) -> tuple[int, ...]:
    """Triton's ensemble passes a tensor between a batching and a non-batching model when the full shapes
    agree: ``shape`` as a model (or the ensemble's response) with config ``dims`` and ``batching`` takes it
    from a producer that made it with batch size ``batch`` (0: a non-batching producer).  A non-batched
    tensor whose shape is the config's gets a batch dimension of 1; a batch of 1 that is not the config's
    shape loses it; anything else is passed as it is (the model's own checks then speak)."""
    if dims is None or batching == (batch != 0):
        return shape
    if batching:
        return (1, *shape) if _dims_agree(dims, shape) else shape
    if not _dims_agree(dims, shape) and batch == 1:
        return shape[1:]
    return shape


def _dims_agree(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape, strict=True))


def needed_steps(steps: Sequence[Step], wanted: Iterable[str]) -> list[Step]:
    """The steps (in plan order) that some output in ``wanted`` depends on: the others are not run."""
    needed = set(wanted)
    keep: list[Step] = []
    for step in reversed(steps):  # plan order puts every step after the steps it needs
        if needed & set(step.outputs.values()):
            keep.append(step)
            needed |= set(step.inputs.values())
    keep.reverse()
    return keep


def steps_after(steps: Sequence[Step]) -> dict[int, frozenset[int]]:
    """Each step's followers: the steps that read its outputs, and theirs, on to the end."""
    readers = {
        step.index: [other.index for other in steps if set(step.outputs.values()) & other.needs] for step in steps
    }
    after: dict[int, frozenset[int]] = {}
    for step in reversed(steps):  # plan order puts every step after the steps it needs
        found: set[int] = set()
        for index in readers[step.index]:
            found.add(index)
            found |= after.get(index, frozenset())
        after[step.index] = frozenset(found)
    return after

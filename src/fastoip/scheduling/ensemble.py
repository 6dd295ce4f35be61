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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..errors import InferenceError
from ..types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from .job import Job


class StepRunner(Protocol):
    """How a step runs: the request runner under the Core (``repository.runner.RequestRunner``)."""

    def start(self, request: InferRequest, deadline_ns: int, on_done: Callable[[Job], None]) -> Job:
        """Enter the composing model, prepare, enqueue; ``on_done`` once outputs, in-flight count and
        statistics are done.  Raises InferenceError for a step that cannot start."""


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


class Plan(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def steps(self) -> tuple[Step, ...]: ...


class EnsembleScheduler:
    """Runs ensemble requests; holds no queue of its own (steps queue in their models)."""

    def __init__(self, plan: Plan, runner: StepRunner) -> None:
        self.plan = plan
        self.runner = runner
        self._running = 0
        self._lock = threading.Lock()

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


class _EnsembleRun:
    """One ensemble request in flight: the tensors so far and the steps left."""

    def __init__(self, scheduler: EnsembleScheduler, job: Job) -> None:
        self.scheduler = scheduler
        self.job = job
        self.tensors: dict[str, InferInput | InferOutput] = {t.name: t for t in job.request.inputs}
        # Triton prunes the steps whose outputs no requested output depends on
        self.waiting = needed_steps(scheduler.plan.steps, job.output_names)
        #: Steps started and not done: their jobs (None while a step is being started).
        self.running: dict[int, Job | None] = {}
        self.failed = False
        self.lock = threading.Lock()
        #: Set once, by whichever thread sees the last step done: the request ends (and is uncounted) once.
        self.ended = False

    def start(self) -> None:
        self._launch_ready()

    def _launch_ready(self) -> None:
        with self.lock:
            if not self.failed and self.job.finished:  # the client cancelled or its deadline passed
                self.failed = True
                self.waiting = []
            if self.failed:
                ready: list[Step] = []
            else:
                ready = [s for s in self.waiting if s.needs <= self.tensors.keys()]
                self.waiting = [s for s in self.waiting if s not in ready]
                for step in ready:  # running from now on: a step that finishes at once must not end the request
                    self.running[step.index] = None
            done = not self.waiting and not self.running and not ready and not self.ended
            if done:
                self.ended = True
        if done:
            self._finish()
            return
        for step in ready:
            self._launch(step)

    def _launch(self, step: Step) -> None:
        request = InferRequest(
            step.model_name,
            step.model_version,
            self.job.request.id,
            # Triton hands each step the ensemble request's parameters (sequence id and flags, priority, ...)
            parameters=dict(self.job.request.parameters),
            inputs=[_as_input(model_input, self.tensors[tensor]) for model_input, tensor in step.inputs.items()],
            outputs=[RequestedOutput(name) for name in step.outputs],
        )
        try:
            sub = self.scheduler.runner.start(
                request, self.job.deadline_ns, lambda finished: self._step_done(step, finished)
            )
        except InferenceError as exc:
            with self.lock:
                self.running.pop(step.index, None)
            self._fail(step, exc)
            return
        with self.lock:
            if step.index in self.running:  # not finished already
                self.running[step.index] = sub
            cancel = self.failed
        if cancel:  # another step failed while this one was starting
            sub.cancel()

    def _step_done(self, step: Step, sub: Job) -> None:
        with self.lock:
            self.running.pop(step.index, None)
        if sub.error is not None:
            self._fail(step, sub.error)
            return
        assert sub.response is not None
        with self.lock:
            for output in sub.response.outputs:
                tensor = step.outputs.get(output.name)
                if tensor is not None:
                    self.tensors[tensor] = output
        self._launch_ready()

    def _fail(self, step: Step, error: BaseException) -> None:
        with self.lock:
            first = not self.failed
            self.failed = True
            self.waiting = []
            others = [other for other in self.running.values() if other is not None]
            finished = not self.running and not self.ended
            if finished:
                self.ended = True
        if first:
            if isinstance(error, InferenceError):
                where = f"in ensemble '{self.scheduler.plan.name}', step {step.index} ('{step.model_name}')"
                error = type(error)(f"{where}: {error.message}")
            self.job.fail(error)
            for other in others:
                other.cancel()
        if finished:
            self.scheduler.finished_one()

    def _finish(self) -> None:
        self.scheduler.finished_one()
        if self.failed:
            return
        outputs = []
        for name in self.job.output_names:
            tensor = self.tensors[name]
            outputs.append(InferOutput(name, tensor.datatype, tuple(tensor.shape), tensor.data))
        request = self.job.request
        self.job.finish(InferResponse(request.model_name, request.model_version, request.id, outputs=outputs))


def _as_input(name: str, tensor: InferInput | InferOutput | None) -> InferInput:
    assert tensor is not None
    return InferInput(name, tensor.datatype, tuple(tensor.shape), tensor.data)


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

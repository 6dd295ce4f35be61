"""The ensemble scheduler: one request runs a graph of composing models.

Rules:
- Each step is an ordinary request to its composing model, through that model's
  own scheduler: a batched composing model batches steps of many ensemble
  requests together with its direct clients.
- A step starts as soon as every tensor it reads exists; steps that do not
  depend on each other run at the same time.
- Tensors pass between steps as the arrays the previous step produced (no copy).
- The first failing step fails the ensemble request with that step's error,
  naming the step; steps still running finish, and nothing new starts.
- Composing models record their own request statistics, as Triton reports them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..errors import InferenceError
from ..types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from .contract import enter_current
from .job import Job


class StepScheduler(Protocol):
    def submit(self, job: Job) -> None: ...


class StepStatistics(Protocol):
    def record_request(self, ok: bool, total_ns: int, queue_ns: int = 0) -> None: ...


class StepModel(Protocol):
    """What the ensemble needs of a composing model."""

    name: str
    scheduler: StepScheduler
    stats: StepStatistics
    #: Retired by a reload or unload: a step that found it must go to its successor.
    retiring: bool

    def prepare(self, request: InferRequest) -> Job: ...

    def enter(self) -> None: ...

    def leave(self) -> None: ...


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


#: Finds the composing model for a step: (name, version or "") -> model; raises NotFound / Unavailable.
Resolve = Callable[[str, str], StepModel]


class EnsembleScheduler:
    """Runs ensemble requests; holds no queue of its own (steps queue in their models)."""

    queues = True  # a request waits on its steps: the caller must wait (or be called back)

    def __init__(self, plan: Plan, resolve: Resolve) -> None:
        self.plan = plan
        self.resolve = resolve
        self._running = 0
        self._lock = threading.Lock()

    def run(self, job: Job) -> None:
        """Start ``job``; the caller waits with ``job.wait()``."""
        self.submit(job)

    def submit(self, job: Job) -> None:
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
        self.running: dict[int, Job] = {}
        self.failed = False
        self.lock = threading.Lock()

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
            done = not self.waiting and not self.running and not ready
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
            model = enter_current(lambda: self.scheduler.resolve(step.model_name, step.model_version))
        except InferenceError as exc:
            self._fail(step, exc)
            return
        try:
            sub = model.prepare(request)
        except InferenceError as exc:
            model.leave()
            self._fail(step, exc)
            return
        sub.deadline_ns = self.job.deadline_ns
        sub.arm()
        started = time.monotonic_ns()
        with self.lock:
            self.running[step.index] = sub
        sub.on_done(lambda finished: self._step_done(step, model, finished, started))
        try:
            model.scheduler.submit(sub)
        except InferenceError as exc:
            sub.fail(exc)

    def _step_done(self, step: Step, model: StepModel, sub: Job, started_ns: int) -> None:
        model.leave()
        model.stats.record_request(sub.error is None, time.monotonic_ns() - started_ns, sub.queue_ns)
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
            others = list(self.running.values())
            finished = not self.running
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

"""The request runner: how one request runs on a loaded model, for the data plane and ensemble steps alike.

Rules:
- One path: ``enter`` (the current version, counted in flight, never a
  retired one) -> ``prepare`` (validate into a job) ->
  ``enqueue`` (the model's scheduler, Triton's ``Scheduler::Enqueue``) ->
  ``complete`` (outputs finished: reshape back and classification, then the
  caller's extra step; in-flight count; statistics).  The data plane adds what
  only a client request has around it (shared memory, the response cache,
  tracing, the caller's deadline and cancellation); an ensemble step is
  ``start``: all four steps with nothing around them but its child trace
  when the ensemble request is traced (``StepTracing``, the data plane's).
- ``complete`` runs once per request, on the thread that finished it (or the
  blocking caller's), before the caller hears of the result.
- Version retirement lives here, not in the scheduling contract: a reload swaps
  the versions first and retires the old one once nothing is in flight on it,
  so ``enter`` counts first and checks second (either the retiring version
  waits for this request, or the request sees it retiring and takes its
  successor, as Triton's reload serves throughout).
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic_ns
from typing import Protocol

from ..errors import InferenceError
from ..response_outputs import finish_outputs
from ..scheduling.job import Job
from ..types import InferRequest, InferResponse
from .loaded import LoadedModel

#: Finds the version to serve: ``(name, version or "")`` -> model; raises NotFound / Unavailable.
LookUp = Callable[[str, str], LoadedModel]

#: A step of the caller's own after the outputs are finished (shared-memory outputs); raises InferenceError.
ExtraStep = Callable[[Job, InferResponse], None]


class StepTracing(Protocol):
    """How an ensemble step of a traced request is traced (the data plane, which owns the tracer)."""

    def begin_step(self, model: LoadedModel, job: Job, parent: Job) -> None:
        """Give ``job`` (a step of ``parent``, which is traced) its child trace, when its model traces."""

    def end_step(self, job: Job) -> None:
        """``job`` (a traced step) is complete: stamp and write its trace."""


class RequestRunner:
    """Enter, prepare, enqueue and complete requests on the models ``look_up`` finds."""

    __slots__ = ("look_up", "newest", "step_tracing")

    def __init__(self, look_up: LookUp, newest: dict[str, LoadedModel] | None = None) -> None:
        self.look_up = look_up
        #: Each model's newest version (the repository keeps it): a request naming no version is found here;
        #: any other, and every error, goes through ``look_up``.
        self.newest: dict[str, LoadedModel] = newest if newest is not None else {}
        #: Traces ensemble steps as children of their traced request (set by the data plane), or None.
        self.step_tracing: StepTracing | None = None

    def enter(self, request: InferRequest) -> LoadedModel:
        """The version ``request`` names, counted in flight (the caller must ``complete`` or ``leave`` it)."""
        name, version = request.model_name, request.model_version
        model = None if version else self.newest.get(name)
        if model is None:
            model = self.look_up(name, version)
        model.enter()
        if model.retiring:
            model.leave()
            model = self.look_up(name, version)
            model.enter()
        return model

    @staticmethod
    def enqueue(model: LoadedModel, job: Job) -> None:
        """Hand ``job`` to ``model``'s scheduler; a scheduler that raises fails the job instead (once)."""
        try:
            model.scheduler.enqueue(job)
        except Exception as exc:
            job.fail(exc)

    @staticmethod
    def complete(model: LoadedModel, job: Job, extra: ExtraStep | None = None) -> None:
        """The one completion step: outputs finished (reshape back, classification, then ``extra``), the
        version left, the request's statistics."""
        response = job.response
        if job.error is None and response is not None:
            try:
                request = job.request
                if request.outputs or model.spec.reshaped:  # finish_outputs, inlined on the hot path
                    finish_outputs(model.spec, request, response)
                if extra is not None:
                    extra(job, response)
            except InferenceError as exc:
                job.error, job.response = exc, None
        model.leave()
        model.stats.record_request(
            job.error is None, monotonic_ns() - job.arrival_ns, job.queue_ns, job.error
        )

    @staticmethod
    def finish_outputs(model: LoadedModel, request: InferRequest, response: InferResponse) -> None:
        """Reshape ``response``'s outputs back to the config's dims and classify what ``request`` asked
        (each response of a decoupled model goes through this too).  Inlined twin: ``complete`` repeats this
        check on the hot path; change both."""
        if request.outputs or model.spec.reshaped:
            finish_outputs(model.spec, request, response)

    def start(
        self,
        request: InferRequest,
        deadline_ns: int,
        on_done: Callable[[Job], None],
        parent: Job | None = None,
        on_response: Callable[[Job, InferResponse], None] | None = None,
    ) -> Job:
        """Run ``request`` with nothing around it (an ensemble step): ``on_done(job)`` once it is complete.

        ``parent``: the ensemble request the step belongs to; when it is traced, the step is traced as its
        child (Triton's ``parent_id``).  ``on_response``: where a decoupled model's responses go, each
        finished (reshape, classification) as a single response is; ``on_done`` follows the last (the
        final flag).  Errors found before it starts (unknown model, invalid input) are raised here.
        """
        model = self.enter(request)
        try:
            job = model.prepare(request)
        except BaseException:
            model.leave()
            raise
        if on_response is not None and model.decoupled:
            respond = on_response

            def deliver(streamed: Job, response: InferResponse) -> None:
                self.finish_outputs(model, request, response)
                respond(streamed, response)

            job.stream_to(deliver)
        job.deadline_ns = deadline_ns
        tracing = self.step_tracing
        if parent is not None and parent.trace is not None and tracing is not None:
            tracing.begin_step(model, job, parent)

        def done(finished: Job) -> None:
            self.complete(model, finished)
            if finished.trace is not None and tracing is not None:
                tracing.end_step(finished)
            on_done(finished)

        job.on_done(done)
        job.arm()
        self.enqueue(model, job)
        return job

"""The data plane: health, metadata, inference, statistics, shared memory, trace and log settings.

Rules:
- Every inference goes one way: ``start`` (the one verb; ``infer`` and
  ``infer_async`` wrap it) -> ``_start`` (the current version counted in flight,
  shared-memory inputs, validation, cache look-up) -> the request runner
  (:mod:`fastoip.repository.runner`, which ensemble steps share) enqueues it ->
  ``_complete`` (the cache's part, then the runner's completion: reshape back
  and classify, shared-memory outputs, the regions' intact check, in-flight
  count, statistics; then the trace).  ``_complete`` runs once per request:
  ``infer`` on the caller's thread after the wait, ``start`` on the thread that
  finished the job, just before ``on_done``.
- ``infer`` blocks the calling thread (thread-per-call frontends); ``start``
  never blocks and calls back on the finishing thread (event-loop frontends
  hop back with :func:`.call.on_loop`; see ``infer_async``).
- Answers are the typed values of :mod:`.answers`; errors are
  :mod:`fastoip.errors` values that the frontends map to statuses.
- Tracing (:mod:`fastoip.tracing`) costs a request two attribute checks
  while it is off (``tracer.active`` in ``_start``, ``job.trace`` in
  ``_complete``); a traced request carries its
  :class:`~fastoip.tracing.Trace` on the job, and ``_complete`` fills in
  Triton's timestamps and tensors from the job and hands it back.
- Decoupled models (``model_transaction_policy { decoupled: true }``) answer
  through ``start(..., on_response=...)`` only: each response but the final
  flag goes to ``on_response`` as the model produces it (outputs finished per
  response), then ``on_done`` once, with an error or with neither error nor
  response (the final flag alone).  ``infer`` / ``infer_async`` and a start
  without ``on_response`` answer :class:`~fastoip.errors.OneResponseCall`
  (Triton's refusal).  Statistics count one inference per request, as Triton does.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, cuda
from .._proto import model_config_pb2 as mc
from ..errors import (
    Cancelled,
    DeadlineExceeded,
    InferenceError,
    InvalidArgument,
    NotFound,
    OneResponseCall,
    Unavailable,
)
from ..repository import ModelRepository
from ..repository.loaded import LoadedModel
from ..repository.runner import RequestRunner
from ..response_cache import TAKE_OVER, ResponseCache, request_key
from ..scheduling.call_chain import WaitGraph
from ..scheduling.job import Job
from ..settings import LogSettings
from ..shared_memory import CUDA, SYSTEM, SharedMemoryRegistry, check_intact, uses_region, write_output
from ..tracing import Trace, TraceConfig, TraceManager
from ..types import InferRequest, InferResponse
from .answers import (
    CudaRegionStatus,
    ModelMetadata,
    ModelStatistics,
    RegionStatus,
    ServerMetadata,
    SystemRegionStatus,
    TensorMetadata,
)
from .call import CallContext, FinishedCall, OnDone, OnResponse, Ticket, on_loop

SERVER_NAME = "fastoip"
#: Triton's answer to a model or inference request on a server that failed to initialize.
SERVER_NOT_READY = "Server not ready"


class DataPlane:
    """What clients call per request: health, metadata, infer, statistics, shared memory, settings."""

    def __init__(
        self,
        repository: ModelRepository,
        extensions: tuple[str, ...],
        *,
        strict_readiness: bool = True,
        cache_size_bytes: int = 0,
        trace_config: TraceConfig | None = None,
    ) -> None:
        self.repository = repository
        #: The one request runner (the repository's: ensemble steps run through it too).
        self.runner = repository.runner
        self.runner.step_tracing = self  # a traced ensemble request's steps are traced as its children
        #: Triton's response cache (``--cache-config local,size=N``), for models with ``response_cache { enable }``.
        self.response_cache = ResponseCache(cache_size_bytes) if cache_size_bytes > 0 else None
        self.extensions = extensions
        #: The server metadata name (Triton's --id).
        self.server_name = SERVER_NAME
        self.strict_readiness = strict_readiness
        #: Readiness is false from the first shutdown stage; requests are still served.
        self.draining = False
        #: New requests are refused (the listeners are closing, or the server failed to initialize).
        self.shutting_down = False
        #: Why the server failed to initialize ("" when it did not; see ``Core.fail_initialization``).
        self.init_error = ""
        self.shared_memory = SharedMemoryRegistry()
        self.log_settings_store = LogSettings()
        #: Trace settings and sampling (``--trace-config``, the trace settings API).
        self.tracer = TraceManager(trace_config)
        #: The BLS calls in flight (a cycle's request is refused, not wedged: scheduling/call_chain.py).
        self.waits = WaitGraph()

    # -- health -----------------------------------------------------------
    def server_live(self) -> bool:
        return not self.init_error and self.repository.all_alive()

    def server_ready(self) -> bool:
        if self.draining or self.shutting_down:
            return False
        if self.strict_readiness:
            return self.repository.all_ready()
        return True

    def check_initialized(self) -> None:
        """Unavailable, in Triton's words, when the server failed to initialize (its models are never asked)."""
        if self.init_error:
            raise Unavailable(SERVER_NOT_READY)

    def model_ready(self, name: str, version: str = "") -> bool:
        self.check_initialized()
        try:
            model = self.repository.get(name, version)
        except InferenceError:
            return False
        return not (self.draining or self.shutting_down) and model.is_ready()

    def readiness_waits(self, name: str | None = None, version: str = "") -> bool:
        """Whether asking the readiness of model ``name`` (None: the server's) may wait on model code (a Python
        model's own ``is_ready``): a frontend asks it off its event loop then, and on the loop otherwise."""
        if self.init_error or self.draining or self.shutting_down:
            return False  # not ready, without asking any model
        if name is None:
            if not self.strict_readiness:
                return False
            return any(
                m.readiness_waits() for r in list(self.repository.records()) for m in list(r.versions.values())
            )
        try:
            return self.repository.get(name, version).readiness_waits()
        except InferenceError:
            return False

    def model_known(self, name: str) -> bool:
        """True when the repository has a record of ``name`` (loaded or not)."""
        return self.repository.record(name) is not None

    # -- metadata -----------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(self.server_name, __version__, self.extensions)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        self.check_initialized()
        model = self.repository.get(name, version)
        record = self.repository.record(name)
        if record is None:  # unloaded between the two lookups
            raise NotFound(f"requested model '{name}' is not found")
        inputs, outputs = model.tensor_metadata()
        return ModelMetadata(
            name=name,
            versions=tuple(record.versions[v].version_str for v in sorted(record.versions)),
            platform=model.config.platform or model.config.backend,
            inputs=_tensors(inputs),
            outputs=_tensors(outputs),
        )

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        self.check_initialized()
        return self.repository.get(name, version).config

    def model_directory(self, name: str, version: str = "") -> Path:
        self.check_initialized()
        return self.repository.get(name, version).model_dir

    # -- inference: one way in -------------------------------------------------------------
    def start(
        self,
        request: InferRequest,
        call: CallContext | None,
        on_done: OnDone,
        on_response: OnResponse | None = None,
    ) -> Ticket:
        """Start ``request`` without blocking: the one verb every frontend starts a request with.

        ``on_done(call)`` runs once, on the thread that finished the request, after its completion step
        (outputs, statistics, trace); it reads ``response`` / ``error`` (see :class:`.call.FinishedCall`)
        and must not block.  The ticket's ``cancel()`` may be called from any thread.  Errors found
        before the request starts (unknown model, invalid input, shutting down) are raised here, not
        passed to ``on_done``.  ``on_response(call, response)``: where a decoupled model's responses go,
        on the producing thread (a decoupled model never runs on the calling thread).
        """
        model, job = self._start(request, call, on_response, False)
        job.on_done(_Completion(self, model, on_done))  # (armed: _prepare arms every job not run by a blocking caller)
        if job.cache_key is None or job.cache_leader:
            self.runner.enqueue(model, job)
        else:
            self._answer_from_cache(job)
        return job

    def infer(self, request: InferRequest, call: CallContext | None = None) -> InferResponse:
        """``start`` for a thread that blocks until the response (or raises its error).

        The calling thread lends itself: a queue-less model runs on it, a queued one is waited for.
        """
        model, job = self._start(request, call, None, True)
        if job.cache_key is None or job.cache_leader:
            self.runner.enqueue(model, job)
        else:
            self._answer_from_cache(job)
        try:
            job.wait()  # returns at once when it ran on this thread
        except InferenceError:
            pass  # job.error holds it; _complete records it
        self._complete(model, job)
        if job.error is not None:
            raise job.error
        assert job.response is not None
        return job.response

    async def infer_async(self, request: InferRequest, call: CallContext | None = None) -> InferResponse:
        """``start`` for asyncio frontends: the event loop never blocks, no thread waits for the call."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponse] = loop.create_future()

        def resolve(finished: FinishedCall) -> None:
            if not future.done():
                if finished.error is not None:
                    future.set_exception(finished.error)
                else:
                    assert finished.response is not None
                    future.set_result(finished.response)

        ticket = self.start(request, call, on_loop(loop, resolve))
        try:
            return await future
        except asyncio.CancelledError:
            ticket.cancel()
            raise

    def _start(
        self,
        request: InferRequest,
        call: CallContext | None,
        on_response: OnResponse | None,
        blocking: bool,
    ) -> tuple[LoadedModel, Job]:
        """Find the model and validate the request (the part that fails fast), and count it in flight."""
        if self.shutting_down:
            self.check_initialized()
            raise Unavailable("the server is shutting down and accepts no new requests")
        model = self.runner.enter(request)
        try:
            return model, self._prepare(model, request, call, on_response, blocking)
        except BaseException:
            model.leave()
            raise

    def _prepare(
        self,
        model: LoadedModel,
        request: InferRequest,
        call: CallContext | None,
        on_response: OnResponse | None,
        blocking: bool,
    ) -> Job:
        if model.decoupled and on_response is None:
            raise OneResponseCall()
        regions: list[Any] = []  # system shared-memory regions used: checked again when the job is done
        for tensor in request.inputs:
            if tensor.data is None and uses_region(tensor.parameters):
                # a CUDA-region input stays on its GPU where the model binds it there (traced tensors are read
                # on the host)
                device = model.device_inputs if not self.tracer.active else -1
                tensor.data = self.shared_memory.input_view(  # type: ignore[assignment]  # (a DeviceArray: see above)
                    tensor.name, tensor.datatype, tuple(tensor.shape), tensor.parameters, regions, request.model_name,
                    device,
                )
        try:
            job = model.prepare(request)
        except InferenceError as exc:
            if request.id:  # Triton's LogRequest(): request errors name the request they belong to
                raise type(exc)(f"[request id: {request.id}] {exc.message}") from None
            raise
        if request.outputs:
            job.destinations = self._output_destinations(request, regions)
        job.regions = regions or None
        if model.decoupled:
            assert on_response is not None
            self._stream(model, job, on_response)
        elif blocking or (call is not None and call.caller_runs):
            job.caller_runs = True
        # a BLS request: refused when every instance of its model waits for it (before the cache's lookup: a
        # refused request leads no cache entry); nothing below raises
        if call is not None and call.chain:
            refusal = self.waits.enter(model.name, model.version_str, len(model.instances), call.chain)
            if refusal is not None:
                raise InvalidArgument(refusal)
            job.chain = call.chain  # (in flight until _complete)
        waits = model.queued
        if self.response_cache is not None and model.uses_response_cache:
            self._look_up(model, job)
            if job.cache_key is not None and not job.cache_leader:
                waits = True  # for an identical request: that request's thread finishes it
        if waits or not blocking:
            # other threads (the stream or event loop that called) may finish or cancel it; only a blocking
            # caller waits on it (an asynchronous one hears of it through on_done)
            job.arm(waited=blocking)
        if call is not None:
            job.deadline_ns = call.deadline_ns
            # a request that waits (or runs elsewhere) gets the caller's lazy deadline and cancellation; one that
            # runs at once on the blocking caller's thread has its turn already and nothing to cancel
            if waits or not blocking:
                if not job.deadline_ns and call.time_remaining is not None:
                    job.deadline_ns = call.queued_deadline_ns()
                if call.on_cancel is not None:
                    call.on_cancel(job.cancel)
        if self.tracer.active:  # while tracing is off, this and job.trace in _complete are all it costs
            if call is not None and call.trace_parent is not None:  # a BLS request of a traced request
                job.trace = self.tracer.child(model.name, model.version_str, request.id, call.trace_parent)
            else:
                trace_headers = call.trace_headers if call is not None else None
                job.trace = self.tracer.begin(model.name, model.version_str, request.id, trace_headers)
            frontend = call.frontend_trace if call is not None else None
            if frontend is not None and job.trace is not None:
                # the trace is written when the frontend has answered too (its HTTP_* / GRPC_* timestamps)
                frontend.attach(job.trace, self.tracer.finish)
                job.frontend_trace = frontend
        return job

    @staticmethod
    def _answer_from_cache(job: Job) -> None:
        """An identical request's answer: cached (finish now), or coming (its completion finishes this job)."""
        if job.cached is not None:
            job.finish(job.cached)

    @staticmethod
    def _stream(model: LoadedModel, job: Job, on_response: OnResponse) -> None:
        """Give a decoupled model's job its response sink: each response finished (reshape, classification)
        as the runner finishes a single one, then handed to ``on_response``."""
        if job.destinations:
            raise InvalidArgument(
                f"model '{model.name}' is decoupled: its responses cannot be written to shared-memory outputs"
            )
        request = job.request

        def deliver(streamed: Job, response: InferResponse) -> None:
            RequestRunner.finish_outputs(model, request, response)
            on_response(streamed, response)

        job.stream_to(deliver)

    def _complete(self, model: LoadedModel, job: Job) -> None:
        """The response cache's part, the runner's completion (outputs, shared memory, the regions' intact
        check, in-flight count, statistics), then the trace."""
        if job.cache_leader and self.response_cache is not None:
            assert job.cache_key is not None
            # the raw response is stored (outputs are finished per request below); identical waiters get it
            insert_start = time.monotonic_ns()
            # issue 37: an error of the leader's own (cancelled, past its deadline) hands the key to a waiter
            own = job.cancelled or isinstance(job.error, (Cancelled, DeadlineExceeded))
            answers = self.response_cache.complete(job.cache_key, job.response, job.error, own)
            model.stats.record_cache(False, job.cache_lookup_ns + time.monotonic_ns() - insert_start)
            for waiter, answer, error in answers:
                waiter(answer, error)
        self.runner.complete(model, job, _shared_memory_outputs if job.regions or job.destinations else None)
        if job.chain:
            self.waits.leave(model.name, model.version_str, job.chain)
        if job.trace is not None:
            self._finish_trace(job.trace, job, time.monotonic_ns())

    # -- ensemble steps of traced requests (the runner's StepTracing) ------------------------------------
    def begin_step(self, model: LoadedModel, job: Job, parent: Job) -> None:
        """A step of a traced ensemble request: its child trace (``parent_id``), as Triton's ensemble spawns."""
        trace = parent.trace
        if trace is not None and self.tracer.active:
            record = trace.record
            job.trace = self.tracer.child(
                model.name, model.version_str, job.request.id, (record.trace_id, record.carrier)
            )

    def end_step(self, job: Job) -> None:
        if job.trace is not None:
            self._finish_trace(job.trace, job, time.monotonic_ns())

    def _finish_trace(self, trace: Trace, job: Job, outputs_done_ns: int) -> None:
        """Triton's timestamps and tensors of a traced request, from its job; then the trace is written.

        COMPUTE_OUTPUT_START is when the model returned, COMPUTE_END when its outputs were finished
        (reshaped, classified, written to shared memory) in the completion step; a request that never
        reached a model (a cache hit, a failure before it ran) has no COMPUTE_* stamps.
        """
        record = trace.record
        if trace.timestamps:
            stamp = record.stamp
            stamp("REQUEST_START", job.arrival_ns)
            stamp("QUEUE_START", job.enqueue_ns)
            if job.compute_start_ns:
                stamp("COMPUTE_START", job.compute_start_ns)
                stamp("COMPUTE_INPUT_END", job.compute_input_end_ns or job.compute_start_ns)
                stamp("COMPUTE_OUTPUT_START", job.compute_end_ns or outputs_done_ns)
                stamp("COMPUTE_END", outputs_done_ns)
            stamp("REQUEST_END", time.monotonic_ns())
        if trace.tensors:
            tensors = record.tensors
            for tensor in job.request.inputs:
                tensors.append(("TENSOR_QUEUE_INPUT", tensor.name, tensor.datatype, tuple(tensor.shape), tensor.data))
            if job.response is not None:  # outputs sent through shared memory have no data left here
                for output in job.response.outputs:
                    tensors.append(
                        ("TENSOR_BACKEND_OUTPUT", output.name, output.datatype, tuple(output.shape), output.data)
                    )
        if job.frontend_trace is not None:
            job.frontend_trace.core_done()  # written once the frontend has answered too
        else:
            self.tracer.finish(trace)

    def _look_up(self, model: LoadedModel, job: Job) -> None:
        """Ask the response cache: a hit finishes the job now, an identical request in flight answers it later,
        a miss makes this job the one that runs (its response is stored when it completes)."""
        cache = self.response_cache
        assert cache is not None
        started = time.monotonic_ns()
        key = request_key(job.request, model.name, model.version_str, model.load_serial)
        job.cache_key = key
        found = cache.claim(key, job.request, partial(self._cache_answer, model, job))
        elapsed = time.monotonic_ns() - started
        if found is True:  # a miss: recorded with its insert time when the job completes
            job.cache_leader = True
            job.cache_lookup_ns = elapsed
            return
        model.stats.record_cache(True, elapsed)
        if found is not False:
            job.cached = found

    def _cache_answer(self, model: LoadedModel, job: Job, response: InferResponse | None,
                      error: BaseException | None) -> None:
        """The identical request ``job`` waited on finished: its answer is ``job``'s; or it ended on its own
        account (``TAKE_OVER``) and ``job`` runs now as the key's leader (issue 37)."""
        if error is not TAKE_OVER:
            job.pending_cache_answer(response, error)
            return
        job.cache_leader = True
        if job.finished:  # cancelled meanwhile: the next waiter's turn (its completion already ran)
            assert self.response_cache is not None and job.cache_key is not None
            for waiter, answer, failure in self.response_cache.complete(job.cache_key, None, job.error, True):
                waiter(answer, failure)
            return
        # not from here: this runs inside the old leader's completion, which a scheduler may run holding its
        # queue's lock (an expired job found in the queue)
        try:
            self.repository.executor.submit(self.runner.enqueue, model, job)
        except RuntimeError:  # the executor is shut down: the server is stopping
            job.fail(Unavailable("the server is shutting down"))

    def _output_destinations(self, request: InferRequest, regions: list[Any]) -> dict[str, Any] | None:
        """Region bytes (numpy or CUDA) for the outputs the client wants in shared memory, or None."""
        wanted: dict[str, np.ndarray | cuda.DeviceBytes] = {
            o.name: self.shared_memory.output_view(o.name, o.parameters, regions)
            for o in request.outputs
            if uses_region(o.parameters)
        }
        return wanted or None

    # -- statistics ---------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        self.check_initialized()
        return [ModelStatistics.from_snapshot(snap) for snap in self.statistics_snapshots(name, version)]

    def statistics_snapshots(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """The raw per-version snapshots (Triton's JSON shape), for the Prometheus exporter."""
        if name:
            record = self.repository.record(name)
            if record is None:
                raise NotFound(f"requested model '{name}' is not found")
            if version:
                return [self.repository.get(name, version).stats.snapshot()]
            return [m.stats.snapshot() for _, m in sorted(record.versions.items())]
        return [
            model.stats.snapshot()
            for record in self.repository.records()
            for _, model in sorted(record.versions.items())
        ]

    # -- shared memory ---------------------------------------------------------------------
    def shared_memory_status(self, name: str = "", kind: str = SYSTEM) -> list[RegionStatus]:
        """Registered regions of ``kind`` (``"system"`` or ``"cuda"``), or the one called ``name``."""
        regions = self.shared_memory.status(name, kind)
        if kind == CUDA:
            return [CudaRegionStatus(r["name"], r["device_id"], r["byte_size"]) for r in regions]
        return [SystemRegionStatus(r["name"], r["key"], r["offset"], r["byte_size"]) for r in regions]

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int, client: str = ""
    ) -> None:
        self.shared_memory.register(name, key, offset, byte_size, client)

    def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, client: str = ""
    ) -> None:
        """Opens a cudaIPC handle (talks to the driver: event loops call it off the loop)."""
        self.shared_memory.register_cuda(name, raw_handle, device_id, byte_size, client)

    def unregister_shared_memory(self, name: str = "", kind: str = SYSTEM) -> None:
        """Unregister ``name``, or every region of ``kind`` when ``name`` is empty."""
        self.shared_memory.unregister(name, kind)

    # -- trace and log settings ---------------------------------------------------------------
    def trace_settings(self, model: str = "") -> dict[str, list[str]]:
        """The trace settings of ``model`` (its own, else the global ones); InvalidArgument for an unknown model."""
        self._check_trace_model(model)
        return self.tracer.settings(model)

    def update_trace_settings(self, changes: dict[str, list[str] | None], model: str = "") -> dict[str, list[str]]:
        """Apply ``changes`` (None or [] clears a setting) and answer the settings now in force."""
        self._check_trace_model(model)
        return self.tracer.update(changes, model)

    def _check_trace_model(self, model: str) -> None:
        if model:
            try:
                self.repository.get(model)
            except InferenceError:  # Triton's words and status for a model it cannot trace
                raise InvalidArgument(f"Request for unknown model : {model}") from None

    def log_settings(self) -> dict[str, Any]:
        return self.log_settings_store.update({})

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.log_settings_store.update(changes)


class _Completion:
    """A started request's ``on_done``: the completion step, then the caller's ``on_done`` (one compiled object a
    request, where a closure is two)."""

    __slots__ = ("plane", "model", "on_done")

    def __init__(self, plane: DataPlane, model: LoadedModel, on_done: OnDone) -> None:
        self.plane = plane
        self.model = model
        self.on_done = on_done

    def __call__(self, finished: Job) -> None:
        self.plane._complete(self.model, finished)
        self.on_done(finished)


def _tensors(entries: list[dict[str, Any]]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(t["name"], t["datatype"], tuple(t["shape"])) for t in entries)


def _shared_memory_outputs(job: Job, response: InferResponse) -> None:
    """Put outputs into their regions (the response keeps an empty entry for each, as Triton sends), then
    check that the regions the request used are still intact."""
    destinations = job.destinations
    if destinations:
        _write_shared_memory_outputs(destinations, response)
    if job.regions:
        check_intact(job.regions)


def _write_shared_memory_outputs(destinations: dict[str, Any], response: InferResponse) -> None:
    for output in response.outputs:
        destination = destinations.get(output.name)
        if destination is not None and output.data is not None:
            write_output(output.name, output.data, output.datatype, destination)
            output.data = None

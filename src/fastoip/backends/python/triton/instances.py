"""Triton ``TritonPythonModel`` instances as scheduler backends: in a worker process (default) or in-process.

Rules:
- One backend per instance of ``instance_group { count }``; ``execute(jobs)``
  hands the whole batch to the model's ``execute(requests)`` (a list, as Triton).
- Process hosting (:class:`ProcessInstance`): the instance is a worker process
  (:mod:`..hosting.worker_process`).  A worker that dies fails what it was running (and
  its open decoupled streams) with INTERNAL naming the model, the instance and the
  cause, and is started again; after :data:`MAX_CRASHES` deaths within
  :data:`CRASH_WINDOW_S` it stays down, the instance is not ready (the model is
  not ready) and requests get UNAVAILABLE with the reason.
- In-process hosting (:class:`InProcessInstance`, config parameter
  ``hosting: "in_process"``): the same runner in the server process.
- Decoupled: each response a sender sends is delivered to its job at once (from
  whichever thread sends it); the final flag ends the job's stream.  ``execute``
  returns :data:`RESPONDS_LATER` for such jobs.
- Non-decoupled: a request may answer through its response sender, as Triton's
  do: the one response finishes its job at once (:meth:`_Base.answer`); the
  batch's result has None for it, and a job not answered yet when the result
  comes waits for its sender (``_later``).
- Close (unload, server stop): waits for the batch in flight and the open
  decoupled streams (up to :data:`DRAIN_TIMEOUT_S`), then ``finalize()``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...._codec import new_output, new_response
from ....datatypes import to_bytes_elements
from ....errors import InferenceError, InternalError, ResourceExhausted, Unavailable
from ....pyworker import transport as shm
from ....pyworker import utils as pb
from ....pyworker.channel import Initialize, RequestData
from ....scheduling.call_chain import CallChain, ChainEntry, chain_of_call
from ....scheduling.contract import RESPONDS_LATER, Execution, Results
from ....types import InferResponse
from ..hosting.worker_process import WorkerDied, WorkerError, WorkerProcess
from . import server_bridge as bridge
from .user_readiness import UserReadiness

if TYPE_CHECKING:
    from ....pyworker.runner import TritonRunner
    from ....scheduling.job import Job

log = logging.getLogger("fastoip.python")

MAX_CRASHES = 3
CRASH_WINDOW_S = 60.0
DRAIN_TIMEOUT_S = 60.0


def job_data(job: Job) -> RequestData:
    """A job as the plain request data the runner takes."""
    request = job.request
    parameters = dict(request.parameters)
    flags = 0
    if parameters.get("sequence_start"):
        flags |= pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if parameters.get("sequence_end"):
        flags |= pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    correlation = parameters.get("sequence_id", 0)
    inputs = [(t.name, t.datatype, job.feeds[t.name]) for t in request.inputs]
    trace = job.trace
    traced = (trace.record.trace_id, trace.record.carrier) if trace is not None else None
    return RequestData(request.id, correlation, flags, parameters, inputs, list(job.output_names), traced)


def job_response(job: Job, version_str: str, data: Any) -> InferResponse | InferenceError:
    """The model's response (plain data) for ``job``: only the outputs it asked for."""
    outputs, error, parameters = data
    if error is not None:
        return bridge.error_of(error[0], error[1])
    wanted = job.output_names
    produced = []
    for name, datatype, array in outputs:
        if wanted and name not in wanted:
            continue
        if datatype == "BYTES":
            array = to_bytes_elements(array)
        # (the codec's constructors fill the slots in place: the classes' own __init__ are interpreted)
        produced.append(new_output(name, datatype, array))
    request = job.request
    if parameters:
        return InferResponse(request.model_name, version_str, request.id, parameters, produced)
    return new_response(request.model_name, version_str, request.id, produced)


#: How a response's plain data becomes the job's response (:func:`job_response`, or a hosting's own).
Respond = Callable[["Job", str, Any], "InferResponse | InferenceError"]


class _Streams:
    """A decoupled instance's open jobs: ``(call, index) -> job`` until the final flag."""

    def __init__(self, model: str, version_str: str, respond: Respond = job_response) -> None:
        self.model = model
        self.version_str = version_str
        self.respond = respond
        self._lock = threading.Condition()
        self._open: dict[tuple[int, int], Job] = {}
        self._last: dict[tuple[int, int], InferResponse] = {}

    def open(self, call: int, jobs: Sequence[Job]) -> None:
        with self._lock:
            for index, job in enumerate(jobs):
                self._open[(call, index)] = job

    def deliver(self, call: int, index: int, data: Any, final: bool) -> None:
        with self._lock:
            job = self._open.get((call, index))
            if job is None:
                return
            if final:
                del self._open[(call, index)]
                last = self._last.pop((call, index), None)
                self._lock.notify_all()
        if data is not None:
            response = self.respond(job, self.version_str, data)
            if isinstance(response, InferenceError):
                job.fail(response)
            elif job.decoupled:
                job.send(response)
            else:  # a caller without a stream (warm-up): the last response stands for all
                with self._lock:
                    self._last[(call, index)] = response
                last = response
        if final:
            if job.decoupled:
                job.end_stream(alone=data is None)  # (a BLS iterator yields Triton's empty last response for it)
            elif last is not None:
                job.finish(last)
            else:
                request = job.request
                job.finish(InferResponse(request.model_name, self.version_str, request.id))

    def job(self, call: int, index: int) -> Job | None:
        with self._lock:
            return self._open.get((call, index))

    def detach(self, call: int, index: int) -> Job | None:
        """Request ``index`` of ``call`` was rescheduled: its stream goes on in a later batch, not this one."""
        with self._lock:
            job = self._open.pop((call, index), None)
            self._last.pop((call, index), None)
            self._lock.notify_all()
            return job

    def fail_all(self, error: InferenceError, call: int | None = None) -> None:
        with self._lock:
            keys = [k for k in self._open if call is None or k[0] == call]
            jobs = [self._open.pop(k) for k in keys]
            for k in keys:
                self._last.pop(k, None)
            self._lock.notify_all()
        for job in jobs:
            job.fail(error)

    def wait_empty(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: not self._open, timeout)


def _results_of(
    jobs: Sequence[Job], version_str: str, responses: Any, error: str | None, where: str,
    respond: Respond = job_response,
) -> Results:
    # (inlined twin: ProcessInstance._on_result answers one job without the lists; change both)
    if error is not None:
        failure = InternalError(f"Failed to process the request(s) for model {where}, message: {error}")
        return [failure for _ in jobs]
    return [
        RESPONDS_LATER if data is None else respond(job, version_str, data)  # None: its sender answers
        for job, data in zip(jobs, responses, strict=True)
    ]


def _reschedule(job: Job, model: str) -> None:
    """The model released ``job`` with RESCHEDULE: back to its scheduler to run again, or failed saying why (a
    scheduler that cannot: Triton's core refuses the release so)."""
    if not job.reschedule():
        job.fail(InternalError(
            f"Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model '{model}' cannot run it "
            "again: request rescheduling needs 'sequence_batching { iterative_sequence: true }' in its config"
        ))


def _settle(job: Job, result: object, end_ns: int) -> None:
    """Finish ``job`` with a worker's result read on the server side (its compute ends at ``end_ns``)."""
    job.compute_end_ns = end_ns
    if type(result) is InferResponse:
        job.finish(result)
    else:
        job.fail(result)  # type: ignore[arg-type]


class _Base:
    """What both hostings share: names, streams, in-flight accounting for close."""

    def __init__(
        self, name: str, version_str: str, index: int, decoupled: bool, respond: Respond = job_response
    ) -> None:
        self.name = name
        self.version_str = version_str
        self.index = index
        self.where = f"'{name}' instance {index}"
        #: This instance on a BLS request's call chain (``scheduling.call_chain``; the direct scheduler reads it).
        self.chain_entry: ChainEntry = (name, version_str, index)
        self.decoupled = decoupled
        self.streams = _Streams(name, version_str, respond)
        #: ``_busy`` is a Condition on this lock; the hot paths take the lock itself (a C context manager).
        self._busy_lock = threading.Lock()
        self._busy = threading.Condition(self._busy_lock)
        self._in_flight = 0
        self._closed = False
        #: The batch running now, by call id (whether a request was cancelled is asked while it runs).
        self._batches: dict[int, Sequence[Job]] = {}
        self._answer_respond = respond
        #: Non-decoupled jobs whose batch returned without their response: their sender answers them later.
        self._later: dict[tuple[int, int], Job] = {}
        self._answer_lock = threading.Lock()

    def _end_decoupled(self, call: int, jobs: Sequence[Job], error: str | None, rescheduled: set[int]) -> None:
        """Decoupled batch ``call`` returned: its streams failed with ``error`` if any, and each rescheduled
        request's job detached from its stream and handed back to be run again."""
        self._batches.pop(call, None)
        if error is not None:
            self.streams.fail_all(_results_of(jobs, "", None, error, self.where)[0], call)  # type: ignore[arg-type]
        for index in rescheduled:
            rejob = self.streams.detach(call, index)
            if rejob is not None:
                _reschedule(rejob, self.name)

    def answer(self, call: int, index: int, data: Any) -> None:
        """Request ``index`` of non-decoupled batch ``call`` answered through its response sender: finished now."""
        with self._answer_lock:
            job = self._later.pop((call, index), None)
            if job is None:
                jobs = self._batches.get(call)
                job = jobs[index] if jobs is not None and index < len(jobs) else None
            if job is not None:
                _settle(job, self._answer_respond(job, self.version_str, data), time.monotonic_ns())

    def _await_sender(self, call: int, index: int, job: Job) -> None:
        """``job`` (request ``index`` of ``call``) is answered by its sender, maybe after its batch returned."""
        with self._answer_lock:
            if not job.finished:
                self._later[(call, index)] = job

    def is_cancelled(self, call: int, index: int) -> bool:
        """Whether the client cancelled request ``index`` of batch ``call`` (running, or streaming)."""
        jobs = self._batches.get(call)
        job = jobs[index] if jobs is not None and index < len(jobs) else self.streams.job(call, index)
        return job is not None and job.cancelled

    def _enter(self) -> bool:
        with self._busy_lock:
            if self._closed:
                return False
            self._in_flight += 1
            return True

    def _leave(self) -> None:
        with self._busy_lock:
            self._in_flight -= 1
            if self._closed:  # only a drain waits here
                self._busy.notify_all()

    def _drain(self) -> None:
        with self._busy:
            self._closed = True
            if not self._busy.wait_for(lambda: self._in_flight == 0, DRAIN_TIMEOUT_S):
                log.warning("model %s: a batch was still running at unload", self.where)
        if not self.streams.wait_empty(DRAIN_TIMEOUT_S):
            log.warning("model %s: decoupled streams still open at unload", self.where)
            self.streams.fail_all(Unavailable(f"model '{self.name}' was unloaded"))

    @staticmethod
    def _execution(jobs: Sequence[Job], started: int) -> list[Execution]:
        return [(sum(job.batch_size for job in jobs), len(jobs), 0, time.monotonic_ns() - started, 0)]


class InProcessInstance(_Base):
    """A ``TritonPythonModel`` in the server process (config parameter ``hosting: "in_process"``)."""

    def __init__(
        self, runner: TritonRunner, name: str, version_str: str, index: int, decoupled: bool, bridge: pb.Bridge
    ) -> None:
        super().__init__(name, version_str, index, decoupled)
        self.runner = runner
        self.bridge = bridge  # its calls (BLS) reach the Core that loaded it
        self._ids = 0
        self.readiness = UserReadiness(self._ask_readiness, name, version_str, runner.instance_name)

    def _ask_readiness(self) -> tuple[bool, bool, str | None]:
        with pb.BRIDGE.using(self.bridge):
            return self.runner.user_readiness()

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        if not self._enter():
            return [Unavailable(f"model '{self.name}' is unloaded") for _ in jobs], []
        try:
            started = time.monotonic_ns()
            self._ids += 1
            call = self._ids
            if self.decoupled:
                self.streams.open(call, jobs)
            self._batches[call] = jobs
            try:
                chain = chain_of_call(self.chain_entry, [job.chain for job in jobs])
                with pb.BRIDGE.using(self.bridge), bridge.InProcessBridge.running(chain):
                    responses = self.runner.execute(
                        [job_data(job) for job in jobs],
                        (lambda index, data, final: self.streams.deliver(call, index, data, final))
                        if self.decoupled
                        else (lambda index, data, final: self.answer(call, index, data)),
                        lambda index: self.is_cancelled(call, index),
                    )
                error = None
            except Exception as exc:
                responses, error = None, (exc.message() if isinstance(exc, pb.TritonModelException) else
                                          f"{type(exc).__name__}: {exc}")
            rescheduled = set(self.runner.rescheduled) if error is None else set()
            if self.decoupled:
                self._end_decoupled(call, jobs, error, rescheduled)
                return [RESPONDS_LATER for _ in jobs], self._execution(jobs, started)
            results = _results_of(jobs, self.version_str, responses, error, self.where)
            for index, (job, result) in enumerate(zip(jobs, results, strict=True)):
                if index in rescheduled:
                    results[index] = RESPONDS_LATER
                    _reschedule(job, self.name)
                elif result is RESPONDS_LATER:
                    self._await_sender(call, index, job)
                elif job.finished:  # answered through its sender already (an error after it is not its)
                    results[index] = RESPONDS_LATER
            self._batches.pop(call, None)
            return results, self._execution(jobs, started)
        finally:
            self._leave()

    def is_ready(self) -> bool:
        return not self._closed and not self.readiness.reason()

    def readiness_waits(self) -> bool:
        return self.readiness.may_wait()

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        self._drain()
        try:
            with pb.BRIDGE.using(self.bridge):
                self.runner.finalize()
        except Exception:
            log.exception("model %s: finalize() failed", self.where)


class _Batch:
    """A batch sent to a worker and not answered yet."""

    __slots__ = ("jobs", "packed", "worker", "started")

    def __init__(self, jobs: Sequence[Job], packed: list, worker: WorkerProcess, started: int) -> None:
        self.jobs = jobs
        self.packed = packed
        self.worker = worker
        self.started = started


#: Batches that may be on their way to one worker (config parameter ``worker_pipeline`` overrides) for a model
#: without a dynamic or sequence batcher: the worker finds the next requests in its socket and answers them
#: one after the other on one wake-up, and the server sends and reads several per wake-up
#: (benchmarks/RESULTS.md, pyipc).
PIPELINE_DEFAULT = 16
#: The same for a model with a batcher: one, so the batcher's next batch grows while the worker runs this one.
PIPELINE_BATCHED_DEFAULT = 1
#: A request the event loop may hand over itself (``takes_without_waiting``): its tensors' bytes at most, and
#: batches on their way at most (QUICK_PENDING messages of QUICK_BYTES fit a Unix socket's default buffer).
QUICK_BYTES = 8 * 1024
QUICK_PENDING = 16


class ProcessInstance(_Base):
    """A ``TritonPythonModel`` instance in its own worker process, restarted when it dies.

    ``execute`` sends the batch and returns (its jobs are :data:`RESPONDS_LATER`); it waits only while
    ``window`` batches are already on their way.  The worker's reader thread finishes the jobs when the result
    comes.  The worker runs batches one at a time, in order: when it dies, the first batch not answered is the
    one it ran (it fails with the cause); the ones behind it never started and are sent to its replacement
    (a decoupled model's fail too: their streams were open).

    ``start_messages`` load it in a fresh worker (again after a crash); a hosting of another kind of model
    (an MLServer runtime: ``mlserver.process``) gives its own ``request_data`` (a job as the plain data its
    worker's runner takes) and ``respond`` (that runner's plain response as the job's response)."""

    def __init__(
        self,
        name: str,
        version_str: str,
        index: int,
        decoupled: bool,
        start_messages: list[tuple],
        link: bridge.ServerLink = bridge.UNLINKED,
        respond: Respond = job_response,
        window: int = PIPELINE_BATCHED_DEFAULT,
        request_data: Callable[[Job], tuple] = job_data,
    ) -> None:
        super().__init__(name, version_str, index, decoupled, respond)
        self._respond = respond
        #: A job as the plain data the worker's runner takes.
        self.request_data = request_data
        self._start_messages = start_messages
        self._link = link
        self._window = max(1, window)
        self._lock = threading.Lock()  # held while a replacement starts
        #: Batches sent and not answered, by call id, in the order sent; guarded by ``_flow``.
        self._pending: dict[int, _Batch] = {}
        self._flow_lock = threading.Lock()
        self._flow = threading.Condition(self._flow_lock)
        #: Threads waiting in ``execute`` for room on the way (guarded by ``_flow``): a result wakes them.
        self._window_waiters = 0
        self._calls = itertools.count(1)
        self._record: Callable[[int, int, int, int, int], None] | None = None
        self._crashes: list[float] = []
        #: Why the instance stopped serving for good (the repository index reports it), or None.
        self.down_reason: str | None = None
        #: The name python_backend gives its stub (Initialize's ``model_instance_name``), for readiness' words.
        self.instance_name = next(
            (str(m.args.get("model_instance_name")) for m in start_messages if type(m) is Initialize),
            f"{name}_{index}",
        )
        self.worker = self._start()
        #: The model's own ``is_ready()``, asked on the worker's readiness socket.
        self.readiness = UserReadiness(lambda: self.worker.ask_readiness(), name, version_str, self.instance_name)

    def takes_without_waiting(self, job: Job) -> bool:
        """Whether ``execute([job])`` returns at once (the direct scheduler may then call it on the event loop):
        the worker is up (no restart to wait for), room stays on the way after it (no wait for a slot), and the
        request is small numeric tensors (a short message: the socket's buffer takes it without blocking, no
        shared-memory copy on the loop)."""
        if self._closed or self.down_reason is not None or not self.worker.alive:
            return False
        # Only the reader thread changes _pending meanwhile, and only by taking from it: the check holds.
        if len(self._pending) >= min(self._window, QUICK_PENDING):
            return False
        total = 0
        for array in job.feeds.values():
            if array.dtype.hasobject:
                return False
            total += array.nbytes
        return total <= QUICK_BYTES

    def record_executions_to(self, record: Callable[[int, int, int, int, int], None]) -> None:
        """Where this instance records its executions (it finishes them after ``execute`` returned)."""
        self._record = record

    def _start(self) -> WorkerProcess:
        started: list[WorkerProcess] = []
        worker = WorkerProcess(
            f"model {self.where}",
            self._on_send,
            lambda cause: self._on_death(started[0] if started else None, cause),
            self.is_cancelled,
            self._link,
            self._on_result,
            model=self.name,
            chain_of=self.call_chain,
        )
        started.append(worker)
        try:
            for message in self._start_messages:
                worker.control(message)
        except BaseException:
            worker.kill()
            raise
        return worker

    def call_chain(self) -> CallChain:
        """The call chain of a BLS call the worker makes now: the chains of the batches it holds (it runs them in
        order: the ones behind the running one wait for it too), then this instance."""
        with self._flow_lock:
            held = [job.chain for batch in self._pending.values() for job in batch.jobs]
        return chain_of_call(self.chain_entry, held)

    def _on_send(self, call: int, index: int, data: Any, final: bool) -> None:
        response = shm.unpack_response(data, self.worker.segments)
        if self.decoupled:
            self.streams.deliver(call, index, response, final)
        else:
            self.answer(call, index, response)

    def _crash_error(self, cause: str) -> InternalError:
        return InternalError(f"model {self.where}: its Python worker process {cause} while running the request")

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        if not self._enter():
            return [Unavailable(f"model '{self.name}' is unloaded") for _ in jobs], []
        try:
            with self._lock:
                if not self.worker.alive and self.down_reason is None:
                    self._restart(self.worker.cause or "died")
                if self.down_reason is not None:
                    self._leave()
                    return [Unavailable(self.down_reason) for _ in jobs], []
                worker = self.worker
            call = next(self._calls)
            try:
                packed = shm.pack_requests([self.request_data(job) for job in jobs], worker.segments)
            except shm.SharedMemoryFull as full:  # (nothing was written past a reservation: no SIGBUS)
                self._leave()
                return [ResourceExhausted(f"model {self.where}: {full}", retry_after=1) for _ in jobs], []
            batch = _Batch(jobs, packed, worker, time.monotonic_ns())
        except BaseException:
            self._leave()
            raise
        # From here the batch is finished by _on_result or _on_death (which _leave), on another thread.
        defer = True
        for job in jobs:
            job.arm()  # a blocking caller that lent its thread waits for it (arming twice is a no-op)
            if job.caller_runs:
                defer = False
        self._batches[call] = jobs
        if self.decoupled:
            self.streams.open(call, jobs)
        with self._flow_lock:
            self._pending[call] = batch
        try:
            # Deferred to the end of an event loop's turn unless a caller waits on this thread (caller_runs).
            worker.submit(call, batch.packed, defer)
        except WorkerDied as died:
            with self._flow:
                mine = self._pending.pop(call, None) is not None  # else the death handler took it
                self._flow.notify_all()
            if mine:
                self._fail(call, batch, self._crash_error(died.cause))
        if len(self._pending) >= self._window and asyncio._get_running_loop() is None:
            # (an event loop never waits here: it may be the worker's reader)
            with self._flow:
                self._window_waiters += 1
                try:
                    self._flow.wait_for(lambda: len(self._pending) < self._window)
                finally:
                    self._window_waiters -= 1
        return [RESPONDS_LATER for _ in jobs], []

    def _on_result(self, call: int, responses: Any, error: Any, rescheduled: list) -> None:
        """A batch's result (the worker's reader thread): finish its jobs (``rescheduled``: the indices of those
        the model released with RESCHEDULE: they go back to their scheduler)."""
        with self._flow_lock:
            batch = self._pending.pop(call, None)
            if self._window_waiters:
                self._flow.notify_all()
        if batch is None:
            return
        try:
            jobs = batch.jobs
            end = time.monotonic_ns()
            if len(jobs) == 1 and error is None and not self.decoupled and responses[0] is not None and not rescheduled:
                # the common case, without the lists: _results_of's twin
                self._batches.pop(call, None)
                only = jobs[0]
                answer: InferResponse | InferenceError
                try:
                    answer = self._respond(
                        only, self.version_str, shm.unpack_response(responses[0], batch.worker.segments)
                    )
                except Exception as exc:
                    answer = InternalError(f"model {self.where}: unreadable result: {exc}")
                _settle(only, answer, end)
                if self._record is not None:
                    self._record(only.batch_size, 1, 0, end - batch.started, 0)
                return
            again = {i for i in rescheduled if type(i) is int and 0 <= i < len(jobs)} if error is None else set()
            if self.decoupled:
                self._end_decoupled(call, jobs, error, again)
            else:
                try:
                    if responses is not None:
                        responses = [None if r is None else shm.unpack_response(r, batch.worker.segments)
                                     for r in responses]
                    results = _results_of(jobs, self.version_str, responses, error, self.where, self._respond)
                except Exception as exc:
                    results = [InternalError(f"model {self.where}: unreadable result: {exc}") for _ in jobs]
                for index, (job, result) in enumerate(zip(jobs, results, strict=True)):
                    if index in again:
                        _reschedule(job, self.name)
                    elif result is RESPONDS_LATER:
                        self._await_sender(call, index, job)
                    else:
                        _settle(job, result, end)  # (a job its sender answered already stays as it was)
                self._batches.pop(call, None)
            if self._record is not None:
                self._record(sum(job.batch_size for job in jobs), len(jobs), 0, end - batch.started, 0)
        finally:
            self._leave()

    def _fail(self, call: int, batch: _Batch, error: InferenceError) -> None:
        """A batch that will never be answered: give back its segments, fail its jobs."""
        try:
            self._batches.pop(call, None)
            for request in batch.packed:
                shm.discard_request(request, batch.worker.segments)
            if self.decoupled:
                self.streams.fail_all(error, call)
            for job in batch.jobs:
                job.fail(error)
        finally:
            self._leave()

    def _on_death(self, worker: WorkerProcess | None, cause: str) -> None:
        """``worker`` died (its reader thread): fail what it ran, send what it had not started to a new one."""
        if not self._closed:
            log.error("model %s: its worker process %s", self.where, cause)
        failure = self._crash_error(cause)
        self.streams.fail_all(failure)
        with self._flow:
            lost = [(call, batch) for call, batch in self._pending.items() if batch.worker is worker]
            for call, _ in lost:
                del self._pending[call]
            self._flow.notify_all()
        if not lost:
            return  # the next execute starts the replacement
        self._fail(*lost[0], failure)  # the batch it was running
        waiting = lost[1:]
        if not waiting:
            return
        with self._lock:
            if self.worker is worker and self.down_reason is None and not self._closed:
                self._restart(cause)
            replacement = self.worker
            down = self.down_reason
        for call, batch in waiting:
            if self.decoupled or down is not None or self._closed or not replacement.alive:
                self._fail(call, batch, Unavailable(down) if down is not None else failure)
                continue
            try:  # (its segments were the dead worker's: their bytes are copied into the replacement's)
                batch.packed = shm.move_requests(batch.packed, batch.worker.segments, replacement.segments)
            except shm.SharedMemoryFull as full:
                self._fail(call, batch, ResourceExhausted(f"model {self.where}: {full}"))
                continue
            batch.worker = replacement
            with self._flow:
                self._pending[call] = batch
            self._batches[call] = batch.jobs
            try:
                replacement.submit(call, batch.packed)
            except WorkerDied:
                with self._flow:
                    mine = self._pending.pop(call, None) is not None
                    self._flow.notify_all()
                if mine:
                    self._fail(call, batch, failure)

    def _restart(self, cause: str) -> None:
        """Start a new worker (the lock is held); after too many deaths, stay down with the reason."""
        if self._link.stopping:  # the server ended its workers at shutdown: none comes back
            self.down_reason = f"model '{self.name}' is unavailable: the server is shutting down"
            return
        now = time.monotonic()
        self._crashes = [t for t in self._crashes if now - t < CRASH_WINDOW_S] + [now]
        if len(self._crashes) >= MAX_CRASHES:
            self.down_reason = (
                f"model '{self.name}' is unavailable: the Python worker process of instance {self.index} "
                f"crashed {len(self._crashes)} times within {CRASH_WINDOW_S:.0f} s (last: it {cause})"
            )
            log.error("%s", self.down_reason)
            return
        log.warning("model %s: restarting its worker process (it %s)", self.where, cause)
        try:
            self.worker = self._start()
        except (WorkerDied, WorkerError) as exc:
            self.down_reason = (
                f"model '{self.name}' is unavailable: restarting the Python worker process of instance "
                f"{self.index} failed: {exc}"
            )
            log.error("%s", self.down_reason)

    def is_ready(self) -> bool:
        if self._closed or self.down_reason is not None:
            return False
        if not self.worker.alive:  # it is started again by the next request (Triton restarts its stub so)
            log.warning("Model '%s' version %s is not ready: Stub process '%s' is not healthy.", self.name,
                        self.version_str, self.instance_name)
            return False
        return not self.readiness.reason()

    def readiness_waits(self) -> bool:
        return self.readiness.may_wait()

    def is_alive(self) -> bool:
        return True

    def close(self) -> None:
        self._drain()
        with self._lock:
            self.worker.finalize()

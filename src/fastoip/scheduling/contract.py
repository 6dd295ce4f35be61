"""What a backend and a scheduler must do: read this first.

The seams, top to bottom (Triton's ``scheduler.h`` states the same split):

- The repository loads a model version (``repository/loaded.py``), builds its
  backend instances and one :class:`ExecutionContext`, and hands the context and
  the instances to a :data:`SchedulerFactory`.  Schedulers never see the
  ``LoadedModel``: ``scheduling/`` imports nothing from ``repository/``.
- A :class:`Scheduler` decides *when* and *with which other requests* a
  :class:`~fastoip.scheduling.job.Job` runs (Direct: at once, alone; the dynamic
  batcher: merged along dim 0 under Triton's rules).
- :func:`fastoip.scheduling.execute.run_jobs` hands a group of jobs to one
  :class:`Backend` instance and finishes every job, whatever happens.
- A :class:`Backend` has one calling shape: ``execute(jobs)`` returns one
  response or error per job (a decoupled model's job: its responses went out
  through ``job.send`` while it ran, and its result is :data:`END_OF_STREAM`).
  Python models implement it themselves (their model reads request parameters
  and content types).  A tensor model (ONNX
  Runtime) implements the smaller :class:`TensorModel` (merged arrays in, arrays
  out) and is wrapped in :class:`fastoip.scheduling.execute.TensorBackend`, the
  one place where jobs are merged along dim 0 into pooled buffers and split
  back into per-job responses.

Python worker processes (``backends/python/hosting/worker_process.py``, the one place that decides where a worker
is read
and written; issue 36):

- An event loop never waits on a worker.  A frontend's loop may hand a small request to a worker itself
  (``takes_without_waiting``: the write is ``MSG_DONTWAIT``) and may read a worker's results (``recv_ready``: what
  is there, never more), finishing their jobs on the loop.  Every write, from any thread, gives the socket what it
  takes at once; the rest waits in that worker's backlog, sent in order by that worker's writer thread, the only
  thread that waits for the worker to read.  A worker that does not read parks its own requests, nobody else.
- A worker is read by its reader thread, or by the one event loop that handed it a batch (after its next message);
  the thread takes the socket back before a control message, when that loop stops, and at the worker's end.
- A worker's calls into the server (BLS, readiness, model control, metric values) run on that worker's own
  threads (``CALL_THREADS``), never on a loop, never on another model's share.
- Model code runs only in the worker (or, for in-process hosting, on instance threads and the model loop): never
  on a frontend's event loop.
- Readiness: an instance whose ``is_ready`` may wait on model code (a Python model's own ``is_ready``, or one not
  asked yet) says so with ``readiness_waits() -> True``; the frontends then ask it on the Core's readiness pool
  (``core/readiness_pool.py``, bounded), and on their loop otherwise (an instance without the method answers at
  once).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .._proto import model_config_pb2 as mc
from ..metrics import VersionCounters
from ..types import InferResponse
from .buffers import BufferPool
from .job import Job
from .ragged import RaggedPlan

#: ``(batch_size, request_count, input_ns, infer_ns, output_ns)`` of one model execution (for statistics).
Execution = tuple[int, int, int, int, int]

class EndOfStream:
    """A decoupled job's result: its responses went out through ``job.send``; this is the final flag alone."""

    __slots__ = ()


#: The one :class:`EndOfStream` value.
END_OF_STREAM = EndOfStream()


class RespondsLater:
    """A decoupled job whose model keeps its response sender past ``execute`` (Triton's decoupled Python
    models answer from their own threads): the backend finishes the job itself, later, from any thread."""

    __slots__ = ()


#: The one :class:`RespondsLater` value.  A backend that answers a job later and knows its execution only then
#: has ``record_executions_to(record)``: the repository hands it ``record_execution`` of the model's statistics.
#: One whose ``execute`` only hands jobs over may have ``takes_without_waiting(job) -> bool``: True promises
#: that ``execute([job])`` returns at once, without blocking (the direct scheduler then runs it on the
#: enqueuing thread, the event loop, instead of hopping to an executor thread).
RESPONDS_LATER = RespondsLater()

#: Per job, in the order given: its response, the error that job alone failed with, or (a decoupled job)
#: :data:`END_OF_STREAM`, or :data:`RESPONDS_LATER` (the backend finishes it later).
Results = list["InferResponse | BaseException | EndOfStream | RespondsLater"]

#: A monotonic clock in nanoseconds (``time.monotonic_ns``; tests pass a controllable one).
Clock = Callable[[], int]


class _Instance(Protocol):
    """What every instance answers, whatever its kind."""

    def is_ready(self) -> bool:
        """Whether the instance can serve now (the model's readiness is every instance's)."""

    def is_alive(self) -> bool:
        """Whether the instance still works at all (a crashed worker is not)."""

    def close(self) -> None:
        """Release what the instance holds (sessions, threads); called once at unload."""


@runtime_checkable
class Backend(_Instance, Protocol):
    """One instance of a model, as schedulers call it; ``execute`` is called by one thread at a time."""

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        """Run ``jobs`` (equal signatures): per job its response or error, and the executions made.

        Raising fails every job of the call (``run_jobs`` sees to it).  The
        backend may set ``job.compute_end_ns``; ``run_jobs`` sets what it left at 0.
        """


@runtime_checkable
class TensorModel(_Instance, Protocol):
    """A model that computes arrays from arrays (ONNX Runtime); wrapped by ``execute.TensorBackend``."""

    #: True when the instance runs on a CUDA device (batches are then gathered in pinned host memory).
    on_gpu: bool

    def run(
        self,
        feeds: dict[str, np.ndarray],
        output_names: Sequence[str],
        destinations: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Compute ``output_names`` (in that order) from ``feeds`` (dim 0 is the batch when the model batches).

        ``destinations`` (only for a batch of one request) maps output names to
        shared-memory bytes the model may compute straight into.
        """


@dataclass(frozen=True)
class ExecutionContext:
    """What a scheduler and the tensor adapter may know about the model they serve."""

    name: str
    version_str: str
    config: mc.ModelConfig
    #: Whether dim 0 of every tensor is the batch.
    batching: bool
    #: Datatype of every output, by name (responses carry it).
    output_datatypes: Mapping[str, str]
    stats: VersionCounters
    #: Where merged batch inputs are gathered (pinned host memory on the CUDA EP).
    buffers: BufferPool
    #: Jobs merge into one batch only when these values are equal.
    signature: Callable[[Job], Hashable]
    #: Ragged inputs, batch inputs and batch outputs (Triton's ragged batching), or None: the model has none.
    ragged: RaggedPlan | None = None


class Scheduler(Protocol):
    """Decides when, and together with which others, a job runs on an instance (Triton's ``Scheduler``)."""

    def enqueue(self, job: Job) -> None:
        """Take ``job`` (armed here); it finishes once, through ``on_done`` / ``wait``, never by raising.

        A job marked ``caller_runs`` comes from a caller that lends its thread (it would only wait):
        a scheduler without a queue runs it there; the others queue it as any job.
        """

    def pending(self) -> int:
        """Jobs waiting in this scheduler's queues (0 for schedulers without one)."""

    def stop(self) -> None:
        """Run or fail what is queued, then end the scheduler's threads; called once at unload."""


#: How the repository makes a scheduler for one model version: ``factory(context, instances, executor)``.
SchedulerFactory = Callable[[ExecutionContext, Sequence[Backend], Executor], Scheduler]


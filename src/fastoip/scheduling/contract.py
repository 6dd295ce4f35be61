"""What a backend and a scheduler must do: read this first.

The seams, top to bottom (Triton's ``scheduler.h`` states the same split):

- The repository loads a model version (``repository/loaded.py``), builds its
  backend instances and one :class:`ExecutionContext`, and hands the context and
  the instances to a scheduler factory.  Schedulers never see the
  ``LoadedModel``: ``scheduling/`` imports nothing from ``repository/``.
- A :class:`Scheduler` decides *when* and *with which other requests* a
  :class:`~fastoip.scheduling.job.Job` runs (Direct: at once, alone; the dynamic
  batcher: merged along dim 0 under Triton's rules).
- :func:`fastoip.scheduling.execute.run_jobs` runs a group of jobs on one
  backend instance and finishes every job, whatever happens.
- A backend instance computes.  There are two kinds, told apart by
  ``ExecutionContext.runs_requests``:

  * :class:`TensorBackend` (ONNX Runtime): gets merged tensors, returns one
    array per requested output; merge, split and the buffer pool live in
    ``execute.py``, so a tensor backend never sees a job.
  * :class:`RequestBackend` (Python models): gets the jobs themselves, because
    its model reads request parameters and content types; it returns one
    response or error per job.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from .._proto import model_config_pb2 as mc
from ..metrics import ModelStatistics
from ..types import InferResponse
from .buffers import BufferPool

if TYPE_CHECKING:
    from .job import Job


#: ``(batch_size, request_count, input_ns, infer_ns, output_ns)`` of one backend execution (for statistics).
Execution = tuple[int, int, int, int, int]

#: A monotonic clock in nanoseconds (``time.monotonic_ns``; tests pass a controllable one).
Clock = Callable[[], int]


class _Instance(Protocol):
    """What every backend instance answers, whatever its kind."""

    def is_ready(self) -> bool:
        """Whether the instance can serve now (the model's readiness is every instance's)."""

    def is_alive(self) -> bool:
        """Whether the instance still works at all (a crashed worker is not)."""

    def close(self) -> None:
        """Release what the instance holds (sessions, threads); called once at unload."""


@runtime_checkable
class TensorBackend(_Instance, Protocol):
    """One instance of a tensor model: ``run`` is called by one thread at a time."""

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
        shared-memory bytes the backend may compute straight into.
        """


@runtime_checkable
class RequestBackend(_Instance, Protocol):
    """One instance of a model that needs whole requests (Python models)."""

    def run_requests(self, jobs: Sequence[Job]) -> tuple[list[InferResponse | BaseException], list[Execution]]:
        """Per job (same order) its response or its own error, and the executions made."""


#: Every backend instance is one of the two kinds.
Backend = TensorBackend | RequestBackend


@dataclass(frozen=True)
class ExecutionContext:
    """What a scheduler and ``run_jobs`` may know about the model they serve."""

    name: str
    version_str: str
    config: mc.ModelConfig
    #: Whether dim 0 of every tensor is the batch.
    batching: bool
    #: Datatype of every output, by name (responses carry it).
    output_datatypes: Mapping[str, str]
    stats: ModelStatistics
    buffers: BufferPool
    #: True when the instances are :class:`RequestBackend` (they get whole jobs, not merged tensors).
    runs_requests: bool
    #: Jobs merge into one batch only when these values are equal.
    signature: Callable[[Job], Hashable]


class Scheduler(Protocol):
    """Decides when, and together with which others, a job runs on an instance."""

    #: True when jobs wait in a queue here (so a cancelled call must leave it); False: they run at once.
    queues: bool

    def submit(self, job: Job) -> None:
        """Hand ``job`` over (it is armed here); its ``on_done`` callback reports the result."""

    def run(self, job: Job) -> None:
        """Run ``job`` for a blocking caller (on the caller's thread where possible); then ``job.wait()``."""

    def pending(self) -> int:
        """Jobs waiting in this scheduler's queues (0 for schedulers without one)."""

    def stop(self) -> None:
        """Run or fail what is queued, then end the scheduler's threads; called once at unload."""


#: How the repository makes a scheduler for one model version: ``factory(context, instances, executor)``.
SchedulerFactory = Callable[[ExecutionContext, Sequence[Backend], Executor], Scheduler]

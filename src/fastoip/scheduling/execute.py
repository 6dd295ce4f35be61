"""Run a group of jobs on one backend instance, and hand each job its own results.

Rules:
- :func:`run_jobs` finishes every job it is given, with its response or an
  error; a backend that raises fails every job of the call.
- :class:`TensorBackend` makes a :class:`~fastoip.scheduling.contract.TensorModel`
  a :class:`~fastoip.scheduling.contract.Backend`:

  * one job runs on its own arrays: no copy at all;
  * several jobs are merged along dim 0 into buffers from the model's
    :class:`~fastoip.scheduling.buffers.BufferPool` (one copy per input, named
    below) and every job gets views on its own rows of each output (no copy);
    an input that some job holds in device memory (a CUDA region) is handed on
    as a :class:`~fastoip.cuda.DeviceBatch` of its parts, which the model
    gathers on its GPU;
  * jobs of one batch may ask for different outputs: the model computes the
    union (in the order first asked), each job gets only what it asked for;
  * every pooled buffer goes back to the pool on every path.
  * a model with ragged inputs, batch inputs or batch outputs (Triton's ragged
    batching, ``ragged.py``) merges and splits as its :class:`~fastoip.scheduling.ragged.RaggedPlan` says,
    one request or many.
- :func:`merge_inputs` and :func:`row_slices` are the merge and split along
  dim 0 that every backend kind shares (the Python backend uses them too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .._codec import gather_rows, new_output, new_response, split_rows
from ..cuda import DeviceArray, DeviceBatch
from ..datatypes import v2_datatype_of
from ..errors import InternalError
from ..types import InferResponse
from .buffers import BufferPool, Lease
from .contract import END_OF_STREAM, RESPONDS_LATER, Backend, Execution, ExecutionContext, Results, TensorModel
from .job import Job
from .ragged import RaggedPlan


def run_jobs(
    context: ExecutionContext,
    backend: Backend,
    jobs: Sequence[Job],
    before_finish: Callable[[], object] | None = None,
) -> None:
    """Execute ``jobs`` (same signature) on ``backend`` and finish each of them.

    ``before_finish`` (if given) is called after the execution and before any
    job is finished: the batcher uses it to keep responses in order.
    """
    start_ns = time.monotonic_ns()
    live = [job for job in jobs if not job.finished and not job.expired(start_ns)]
    if not live:
        if before_finish is not None:
            before_finish()
        return
    for job in live:
        job.queue_ns = start_ns - job.arrival_ns
        job.compute_start_ns = start_ns
    if len(live) == 1 and type(backend) is TensorBackend and backend.context.ragged is None:
        # The hot path (one request, a tensor model): no results list, no per-job loops; ~2 us of ~40 us.
        backend.run_one(live[0], start_ns, before_finish)
        return
    try:  # (the general path; TensorBackend.run_one is its one-job twin, inlined: change both)
        results, executions = backend.execute(live)
        for job in live:
            job.release_inputs()  # the execution is over: large inputs are freed before the responses go out
        if len(results) != len(live):
            raise InternalError(f"model '{context.name}': {len(results)} results for {len(live)} requests")
        end_ns = time.monotonic_ns()
        for job in live:
            if not job.compute_end_ns:
                job.compute_end_ns = end_ns
        if before_finish is not None:
            before_finish()
        # the executions are recorded before any caller hears of its result (it may read the statistics at once)
        record = context.stats.record_execution
        for execution in executions:
            record(*execution)
        for index, job in enumerate(live):  # (lengths checked above; compiled loops, where zip(strict=) is a call)
            result = results[index]
            if type(result) is InferResponse:
                job.finish(result)
            elif result is END_OF_STREAM:
                job.end_stream()
            elif result is RESPONDS_LATER:
                pass  # the backend finishes it (a decoupled model answering from its own threads)
            else:
                job.fail(result)  # type: ignore[arg-type]  # anything else is that job's error
    except BaseException as exc:  # every job must finish, whatever went wrong
        for job in live:
            job.fail(exc)


class TensorBackend:
    """A tensor model as a :class:`~fastoip.scheduling.contract.Backend`: merge, run once, split."""

    __slots__ = ("model", "context")

    def __init__(self, model: TensorModel, context: ExecutionContext) -> None:
        self.model = model
        self.context = context

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        if self.context.ragged is not None:
            return self._execute_ragged(jobs, self.context.ragged)
        start_ns = time.monotonic_ns()
        first = jobs[0]
        if len(jobs) == 1:
            # Shared-memory destinations: the model may compute outputs straight into their regions.
            outputs = self.model.run(first.feeds, first.output_names, first.destinations or None)
            infer_done_ns = time.monotonic_ns()
            first.compute_end_ns = infer_done_ns
            results: Results = [self._response(first, outputs)]
            execution = (first.batch_size, 1, 0, infer_done_ns - start_ns, time.monotonic_ns() - infer_done_ns)
            return results, [execution]
        leases: list[Lease] = []
        try:
            feeds, batch_size = merge_inputs(jobs, self.context.buffers, leases)
            output_names = _union(jobs)
            input_done_ns = time.monotonic_ns()
            outputs = self.model.run(feeds, output_names)
            infer_done_ns = time.monotonic_ns()
        finally:
            # Outputs are new arrays, never views on the merged inputs: the buffers can go back now.
            for lease in leases:
                self.context.buffers.give_back(lease)
        by_name = dict(zip(output_names, outputs, strict=True))
        for name, out in by_name.items():
            check_rows(self.context.name, name, out, batch_size)
        # Views on each job's rows: no copy (the codec copies once into the response).
        counts = [job.batch_size for job in jobs]
        rows_by_name = {name: _split(out, counts) for name, out in by_name.items()}
        results = []
        for index, job in enumerate(jobs):
            results.append(self._response(job, [rows_by_name[name][index] for name in job.output_names]))
        return results, [_timed(jobs, batch_size, start_ns, input_done_ns, infer_done_ns)]

    def _execute_ragged(self, jobs: Sequence[Job], plan: RaggedPlan) -> tuple[Results, list[Execution]]:
        """``execute`` for a model with ragged inputs, batch inputs or batch outputs (``ragged.py``)."""
        start_ns = time.monotonic_ns()
        feeds, batch_size = plan.merge(jobs)
        output_names = _union(jobs)
        input_done_ns = time.monotonic_ns()
        outputs = self.model.run(feeds, output_names)
        infer_done_ns = time.monotonic_ns()
        parts = {
            name: plan.split(jobs, name, out, batch_size) for name, out in zip(output_names, outputs, strict=True)
        }
        results: Results = [
            self._response(job, [parts[name][index] for name in job.output_names]) for index, job in enumerate(jobs)
        ]
        return results, [_timed(jobs, batch_size, start_ns, input_done_ns, infer_done_ns)]

    def run_one(self, job: Job, start_ns: int, before_finish: Callable[[], object] | None) -> None:
        """``execute([job])`` and finish the job, as ``run_jobs`` would, minus the lists (the hot path)."""
        try:
            # Shared-memory destinations: the model may compute outputs straight into their regions.
            outputs = self.model.run(job.feeds, job.output_names, job.destinations or None)
            infer_done_ns = time.monotonic_ns()
            job.compute_end_ns = infer_done_ns
            job.release_inputs()  # the execution is over: a large input is freed before the response goes out
            if before_finish is not None:
                before_finish()
            response = self._response(job, outputs)
            self.context.stats.record_execution(  # before the caller hears of its result (see run_jobs)
                job.batch_size, 1, 0, infer_done_ns - start_ns, time.monotonic_ns() - infer_done_ns
            )
            job.finish(response)
        except BaseException as exc:  # the job must finish, whatever went wrong
            job.fail(exc)

    def _response(self, job: Job, outputs: list[np.ndarray]) -> InferResponse:
        datatypes = self.context.output_datatypes
        request = job.request
        names = job.output_names
        # (the codec's constructors fill the objects' slots in place: the classes' own __init__ are interpreted)
        made = []
        for index, out in enumerate(outputs):  # (as many as names: the model ran these names)
            name = names[index]
            # a sequence model's state outputs are not among the model's outputs: the array says its type
            datatype = datatypes.get(name)
            made.append(new_output(name, datatype if datatype is not None else v2_datatype_of(out), out))
        return new_response(request.model_name, self.context.version_str, request.id, made)

    def is_ready(self) -> bool:
        return self.model.is_ready()

    def readiness_waits(self) -> bool:
        return False  # a tensor model's readiness is its session's state

    def is_alive(self) -> bool:
        return self.model.is_alive()

    def close(self) -> None:
        self.model.close()


def merge_inputs(
    jobs: Sequence[Job], pool: BufferPool | None = None, leases: list[Lease] | None = None
) -> tuple[dict[str, np.ndarray], int]:
    """The jobs' inputs concatenated along dim 0, and the batch size.

    With ``pool``, numeric inputs are gathered in pooled buffers and each lease
    is appended to ``leases``: the caller gives them back once the model ran.
    Without, in new arrays (for models that may keep what they are given).
    """
    batch_size = sum(job.batch_size for job in jobs)
    feeds: dict[str, np.ndarray] = {}
    for name, sample in jobs[0].feeds.items():
        parts = [job.feeds[name] for job in jobs]
        if any(type(part) is DeviceArray for part in parts):
            # Inputs in CUDA regions stay on the GPU: the model gathers them there (device to device, one copy),
            # padded to the batch it runs (``backends/onnx.py``).
            feeds[name] = DeviceBatch(parts)  # type: ignore[assignment]
            continue
        if pool is None or leases is None or sample.dtype == object:
            # BYTES: a list of references, not a byte copy.
            merged = np.concatenate(parts, axis=0)
        else:
            lease = pool.take(name, sample.dtype, (batch_size, *sample.shape[1:]))
            leases.append(lease)
            merged = lease.view
            # Copy: each request's rows into the pooled batch buffer (the one input copy).
            if not gather_rows(parts, merged):
                np.concatenate(parts, axis=0, out=merged)
        feeds[name] = merged
    return feeds, batch_size


def row_slices(jobs: Sequence[Job]) -> list[slice]:
    """Each job's rows of a merged batch, in order."""
    slices = []
    offset = 0
    for job in jobs:
        end = offset + job.batch_size
        slices.append(slice(offset, end))
        offset = end
    return slices


def _split(array: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    """``array``'s rows, ``counts[i]`` for the i-th job, as views (the codec's, or numpy's slices)."""
    views = split_rows(array, counts)
    if views is not None:
        return views
    views = []
    offset = 0
    for count in counts:
        views.append(array[offset:offset + count])
        offset += count
    return views


def check_rows(model_name: str, output_name: str, array: np.ndarray, batch_size: int) -> None:
    """Refuse an output whose dim 0 is not the batch it was computed for (it could not be split)."""
    if array.shape[:1] != (batch_size,):
        raise InternalError(
            f"model '{model_name}' returned output '{output_name}' of shape {list(array.shape)} "
            f"for a batch of {batch_size}"
        )


def _union(jobs: Sequence[Job]) -> list[str]:
    """Every output any job asked for, in the order first asked (usually all ask the same)."""
    names = jobs[0].output_names
    if all(job.output_names == names for job in jobs):
        return names
    union = list(names)
    for job in jobs:
        union.extend(name for name in job.output_names if name not in union)
    return union


def _timed(jobs: Sequence[Job], batch_size: int, start_ns: int, input_done_ns: int, infer_done_ns: int) -> Execution:
    """Stamp each job with its batch's compute phases and give the batch's execution record (output time: until
    now, with the responses built)."""
    for job in jobs:
        job.compute_input_end_ns = input_done_ns
        job.compute_end_ns = infer_done_ns
    output_ns = time.monotonic_ns() - infer_done_ns
    return batch_size, len(jobs), input_done_ns - start_ns, infer_done_ns - input_done_ns, output_ns

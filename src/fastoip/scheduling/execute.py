"""Run a group of jobs as one backend execution, and hand each job its own results.

Rules:
- One job runs on its own arrays: no copy at all.
- Several jobs are merged along dim 0 into buffers from the model's
  :class:`~fastoip.scheduling.buffers.BufferPool` (one copy per input, named
  below) and every job gets views on its own rows of each output (no copy).
- Any failure fails every job of the group; nothing is left unfinished.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..datatypes import v2_datatype_of
from ..types import InferOutput, InferResponse
from .job import Job

if TYPE_CHECKING:
    from ..repository.loaded import LoadedModel


def run_jobs(  # type: ignore[no-untyped-def]
    model: "LoadedModel",
    backend,
    jobs: Sequence[Job],
    before_finish: Optional[Callable[[], object]] = None,
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
    if model.runs_requests:
        _run_requests(model, backend, live, before_finish)
        return
    first = live[0]
    try:
        if len(live) == 1:
            feeds = first.feeds
            batch_size = first.batch_size
            leases = ()
        else:
            feeds, batch_size, leases = _merge(model, live)
        input_done_ns = time.monotonic_ns()
        if len(live) == 1 and first.destinations:
            # The backend may compute outputs straight into their shared-memory regions.
            outputs = backend.run(feeds, first.output_names, destinations=first.destinations)
        else:
            outputs = backend.run(feeds, first.output_names)
        infer_done_ns = time.monotonic_ns()
        for job in live:
            job.compute_end_ns = infer_done_ns
        if before_finish is not None:
            before_finish()
        if len(live) == 1:
            _finish_one(model, first, outputs)
        else:
            _split(model, live, outputs, batch_size)
        for lease in leases:
            model.buffers.give_back(lease)
        end_ns = time.monotonic_ns()
        model.stats.record_execution(
            batch_size,
            len(live),
            input_done_ns - start_ns,
            infer_done_ns - input_done_ns,
            end_ns - infer_done_ns,
        )
    except BaseException as exc:  # every job must finish, whatever went wrong
        for job in live:
            job.fail(exc)


def _run_requests(  # type: ignore[no-untyped-def]
    model: "LoadedModel", backend, jobs: Sequence[Job], before_finish: Optional[Callable[[], object]]
) -> None:
    """Backends that take whole requests (Python models: parameters, content types).

    ``backend.run_requests(jobs)`` returns, per job, an InferResponse or the
    error for that job, and the executions it made as
    ``(batch_size, job_count, input_ns, infer_ns, output_ns)`` tuples.
    """
    try:
        results, executions = backend.run_requests(jobs)
        end_ns = time.monotonic_ns()
        for job in jobs:
            job.compute_end_ns = end_ns
        if before_finish is not None:
            before_finish()
        for job, result in zip(jobs, results):
            if isinstance(result, BaseException):
                job.fail(result)
            else:
                job.finish(result)
        for execution in executions:
            model.stats.record_execution(*execution)
    except BaseException as exc:  # every job must finish, whatever went wrong
        for job in jobs:
            job.fail(exc)


def _merge(model: "LoadedModel", jobs: Sequence[Job]) -> tuple[dict[str, np.ndarray], int, list]:
    batch_size = sum(job.batch_size for job in jobs)
    feeds: dict[str, np.ndarray] = {}
    leases = []
    for name, sample in jobs[0].feeds.items():
        shape = (batch_size, *sample.shape[1:])
        if sample.dtype == object:
            # BYTES: a list of references, not a byte copy.
            merged = np.concatenate([job.feeds[name] for job in jobs], axis=0)
        else:
            lease = model.buffers.take(name, sample.dtype, shape)
            leases.append(lease)
            merged = lease.view
            # Copy: each request's rows into the pooled batch buffer (the one input copy).
            np.concatenate([job.feeds[name] for job in jobs], axis=0, out=merged)
        feeds[name] = merged
    return feeds, batch_size, leases


def _finish_one(model: "LoadedModel", job: Job, outputs: list[np.ndarray]) -> None:
    job.finish(_response(model, job, outputs))


def _split(model: "LoadedModel", jobs: Sequence[Job], outputs: list[np.ndarray], batch_size: int) -> None:
    for out in outputs:
        if out.shape[:1] != (batch_size,):
            raise ValueError(
                f"model '{model.name}' returned an output of shape {list(out.shape)} for a batch of {batch_size}"
            )
    offset = 0
    for job in jobs:
        end = offset + job.batch_size
        # Views on this job's rows: no copy (the codec copies once into the response).
        job.finish(_response(model, job, [out[offset:end] for out in outputs]))
        offset = end


def _response(model: "LoadedModel", job: Job, outputs: list[np.ndarray]) -> InferResponse:
    spec = model.spec.output_by_name
    request = job.request
    return InferResponse(
        request.model_name,
        model.version_str,
        request.id,
        None,
        [
            # a sequence model's state outputs are not in the spec: the array says its type
            InferOutput(name, spec[name].datatype if name in spec else v2_datatype_of(out), out.shape, out)
            for name, out in zip(job.output_names, outputs)
        ],
    )

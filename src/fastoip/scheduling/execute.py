"""Run a group of jobs as one backend execution, and hand each job its own results.

Rules:
- One job runs on its own arrays: no copy at all.
- Several jobs are merged along dim 0 into buffers from the model's
  :class:`~fastoip.scheduling.buffers.BufferPool` (one copy per input, named
  below) and every job gets views on its own rows of each output (no copy).
- Jobs of one batch may ask for different outputs: the backend computes the
  union (in the order first asked), each job gets only what it asked for.
- Any failure fails every job of the group; nothing is left unfinished, and
  every pooled buffer goes back to the pool on every path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from ..types import InferOutput, InferResponse
from .buffers import Lease
from .contract import Backend, ExecutionContext, RequestBackend, TensorBackend
from .job import Job


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
    if context.runs_requests:
        _run_requests(context, cast(RequestBackend, backend), live, before_finish)
    else:
        _run_tensors(context, cast(TensorBackend, backend), live, before_finish, start_ns)


def _run_tensors(
    context: ExecutionContext,
    backend: TensorBackend,
    live: list[Job],
    before_finish: Callable[[], object] | None,
    start_ns: int,
) -> None:
    first = live[0]
    leases: list[Lease] = []
    try:
        if len(live) == 1:
            feeds = first.feeds
            batch_size = first.batch_size
            output_names = first.output_names
        else:
            feeds, batch_size = _merge(context, live, leases)
            output_names = _union(live)
        input_done_ns = time.monotonic_ns()
        if len(live) == 1 and first.destinations:
            # The backend may compute outputs straight into their shared-memory regions.
            outputs = backend.run(feeds, output_names, destinations=first.destinations)
        else:
            outputs = backend.run(feeds, output_names)
        infer_done_ns = time.monotonic_ns()
        for job in live:
            job.compute_end_ns = infer_done_ns
        if before_finish is not None:
            before_finish()
        if len(live) == 1:
            first.finish(_response(context, first, outputs))
        else:
            _split(context, live, output_names, outputs, batch_size)
        end_ns = time.monotonic_ns()
        context.stats.record_execution(
            batch_size,
            len(live),
            input_done_ns - start_ns,
            infer_done_ns - input_done_ns,
            end_ns - infer_done_ns,
        )
    except BaseException as exc:  # every job must finish, whatever went wrong
        for job in live:
            job.fail(exc)
    finally:
        # Responses hold views on the outputs, never on the merged inputs: the buffers can go back.
        for lease in leases:
            context.buffers.give_back(lease)


def _run_requests(
    context: ExecutionContext,
    backend: RequestBackend,
    jobs: Sequence[Job],
    before_finish: Callable[[], object] | None,
) -> None:
    """Backends that take whole requests (Python models: parameters, content types)."""
    try:
        results, executions = backend.run_requests(jobs)
        end_ns = time.monotonic_ns()
        for job in jobs:
            job.compute_end_ns = end_ns
        if before_finish is not None:
            before_finish()
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, BaseException):
                job.fail(result)
            else:
                job.finish(result)
        for execution in executions:
            context.stats.record_execution(*execution)
    except BaseException as exc:  # every job must finish, whatever went wrong
        for job in jobs:
            job.fail(exc)


def _merge(context: ExecutionContext, jobs: Sequence[Job], leases: list[Lease]) -> tuple[dict[str, np.ndarray], int]:
    """The jobs' inputs concatenated along dim 0; pooled buffers taken are appended to ``leases``."""
    batch_size = sum(job.batch_size for job in jobs)
    feeds: dict[str, np.ndarray] = {}
    for name, sample in jobs[0].feeds.items():
        shape = (batch_size, *sample.shape[1:])
        if sample.dtype == object:
            # BYTES: a list of references, not a byte copy.
            merged = np.concatenate([job.feeds[name] for job in jobs], axis=0)
        else:
            lease = context.buffers.take(name, sample.dtype, shape)
            leases.append(lease)
            merged = lease.view
            # Copy: each request's rows into the pooled batch buffer (the one input copy).
            np.concatenate([job.feeds[name] for job in jobs], axis=0, out=merged)
        feeds[name] = merged
    return feeds, batch_size


def _union(jobs: Sequence[Job]) -> list[str]:
    """Every output any job asked for, in the order first asked (usually all ask the same)."""
    names = jobs[0].output_names
    if all(job.output_names == names for job in jobs):
        return names
    union = list(names)
    for job in jobs:
        union.extend(name for name in job.output_names if name not in union)
    return union


def _split(
    context: ExecutionContext,
    jobs: Sequence[Job],
    output_names: list[str],
    outputs: list[np.ndarray],
    batch_size: int,
) -> None:
    for out in outputs:
        if out.shape[:1] != (batch_size,):
            raise ValueError(
                f"model '{context.name}' returned an output of shape {list(out.shape)} for a batch of {batch_size}"
            )
    by_name = dict(zip(output_names, outputs, strict=True))
    offset = 0
    for job in jobs:
        end = offset + job.batch_size
        # Views on this job's rows: no copy (the codec copies once into the response).
        job.finish(_response(context, job, [by_name[name][offset:end] for name in job.output_names]))
        offset = end


def _response(context: ExecutionContext, job: Job, outputs: list[np.ndarray]) -> InferResponse:
    datatypes = context.output_datatypes
    request = job.request
    return InferResponse(
        request.model_name,
        context.version_str,
        request.id,
        None,
        [
            InferOutput(name, datatypes[name], out.shape, out)
            for name, out in zip(job.output_names, outputs, strict=True)
        ],
    )

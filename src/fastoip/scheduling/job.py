"""A request on its way through a scheduler, and how its caller waits for it.

Rules:
- A job is finished exactly once, with a response or an error; later calls
  are ignored (a cancelled job may race with its execution).
- A job that runs on the thread that created it needs no locks.  Before a job
  is handed to another thread it is ``arm``-ed: finishing becomes an atomic
  claim and blocking callers wait on a plain lock (the cheapest wake-up there is).
- Asynchronous callers pass ``on_done`` before the job is handed over; it
  runs on the thread that finished the job and must not block.
- A job for a decoupled model (``model_transaction_policy { decoupled }``) may
  have any number of responses: each but the final one goes to its response
  sink (``send``) as it is produced, on the producing thread; the job then
  finishes once, with an error, with ``end_stream`` (no response: the
  final flag alone), or with ``finish`` (its last response, carrying the
  final flag: an ensemble's, as Triton's).  ``final_alone`` says whether the
  final flag came by itself: a backend that delivers its last response with
  ``send`` and then ends the stream says so (``end_stream(alone=False)``), so
  a BLS iterator yields Triton's empty last response only for a flag alone.
- A model may release an unfinished job with RESCHEDULE (Triton's request
  rescheduling): ``reschedule`` hands it back to the scheduler that set
  ``reschedule_to`` (an iterative sequence batcher), which runs it again.  A job without a sink drops what
  is sent (warmup).
- When its execution ends, a job lets go of its input arrays when one is
  large (:meth:`Job.release_inputs`, as Triton's backends release the request
  then): a large input is freed before the response is encoded and sent, not
  when the call ends; small ones go with the request, microseconds later.
  The caller's request object is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from threading import Lock
from time import monotonic_ns
from typing import TYPE_CHECKING, Final

import numpy as np

from .._codec import request_without_data
from ..errors import Cancelled, DeadlineExceeded, InferenceError, InternalError
from ..types import InferRequest, InferResponse
from .call_chain import CallChain

#: A job's inputs are let go of when its execution ends once one of them is this large (see ``release_inputs``).
RELEASE_MIN_BYTES: Final = 64 * 1024

if TYPE_CHECKING:
    from ..tracing import FrontendTrace, Trace


class Job:
    """A validated request plus what the scheduler needs to run it."""

    __slots__ = (
        "request",
        "feeds",
        "batch_size",
        "output_names",
        "destinations",
        "regions",
        "signature",
        "arrival_ns",
        "enqueue_ns",
        "deadline_ns",
        "timeout_ns",
        "priority",
        "response",
        "error",
        "queue_ns",
        "compute_start_ns",
        "compute_input_end_ns",
        "compute_end_ns",
        "cancelled",
        "caller_runs",
        "cache_key",
        "cache_leader",
        "cached",
        "cache_lookup_ns",
        "trace",
        "frontend_trace",
        "chain",
        "_done",
        "_claim",
        "_on_done",
        "_finished",
        "_sink",
        "final_alone",
        "_on_reschedule",
    )

    def __init__(
        self,
        request: InferRequest,
        feeds: dict[str, np.ndarray],
        batch_size: int,
        output_names: list[str],
    ) -> None:
        self.request = request
        self.feeds = feeds
        #: Items along dim 0 (1 for models that do not batch).
        self.batch_size = batch_size
        self.output_names = output_names
        #: Output name -> the shared-memory bytes it goes to (set by the Core), or None.
        self.destinations: dict[str, np.ndarray] | None = None
        #: System shared-memory regions the request reads or writes (set by the Core), or None.
        self.regions: list | None = None
        #: Jobs batch together only when their signatures are equal (set by the batcher).
        self.signature: Hashable = ()
        self.arrival_ns = monotonic_ns()
        #: When a queueing scheduler took the job, on that scheduler's clock (its delay and timeouts count from it).
        self.enqueue_ns = self.arrival_ns
        #: Absolute monotonic deadline from the client (gRPC deadline), or 0.
        self.deadline_ns = 0
        #: Queue timeout from policy or the request's ``timeout`` parameter, or 0.
        self.timeout_ns = 0
        self.priority = 0
        self.response: InferResponse | None = None
        self.error: InferenceError | None = None
        self.queue_ns = 0
        self.compute_start_ns = 0
        #: When a merged batch's inputs were gathered (0: the model read the request's own arrays, no input step).
        self.compute_input_end_ns = 0
        self.compute_end_ns = 0
        self.cancelled = False
        #: The caller lends its thread (it would only wait): a scheduler without a queue runs the job there.
        self.caller_runs = False
        #: Response cache: this request's digest, whether it is the one that runs, and a hit's stored answer.
        self.cache_key: bytes | None = None
        self.cache_leader = False
        self.cached: InferResponse | None = None
        #: A miss's lookup time: the miss is recorded with its insert time when the job completes (as Triton).
        self.cache_lookup_ns = 0
        #: The Core's trace of this request, or None: not traced.
        self.trace: Trace | None = None
        #: The frontend's timestamps of a traced request (tracing.FrontendTrace), or None.
        self.frontend_trace: FrontendTrace | None = None
        #: A BLS request's call chain (empty for a client's request): its scheduler runs it on an instance not
        #: on the chain (those wait for its answer), and the Core refused it when every instance is on it.
        self.chain: CallChain = ()
        self._done: Lock | None = None
        self._claim: list[bool] | None = None
        self._on_done: Callable[[Job], None] | None = None
        self._finished = False
        #: Where a decoupled model's responses go as they are produced (set by the Core), or None.
        self._sink: Callable[[Job, InferResponse], None] | None = None
        #: A decoupled job ended by its final flag alone (no response came with it): set by ``end_stream``.
        self.final_alone = False
        #: Where a request its model releases with RESCHEDULE goes back to (a scheduler that can run it again:
        #: an iterative sequence batcher), or None: it cannot be rescheduled.
        self._on_reschedule: Callable[[Job], None] | None = None

    def release_inputs(self) -> None:
        """The execution is over: drop this job's references to its input arrays.

        ``feeds`` empties and, when an input holds ``RELEASE_MIN_BYTES`` or more (or
        objects: BYTES), ``request`` becomes a copy whose inputs keep name, datatype,
        shape and parameters but no data (the caller's request is not changed; built
        by the codec).  Small inputs stay with the request until it is answered
        (microseconds): the copy would cost more than the memory it frees.  Kept: a
        decoupled job's inputs (its model may read them while it responds) and a
        traced job's (the trace records the input tensors when the request completes).
        """
        if self._sink is not None or self.trace is not None:
            return
        feeds = self.feeds
        self.feeds = {}
        for array in feeds.values():
            if array.nbytes >= RELEASE_MIN_BYTES or array.dtype.hasobject:
                self.request = request_without_data(self.request)
                return

    def arm(self, waited: bool = True) -> None:
        """Make the job safe to finish and cancel from other threads, and (``waited``) to ``wait`` for there.

        A caller that never calls ``wait`` (an asynchronous one: it set or will set ``on_done``) arms with
        ``waited=False``: no lock to wait on is made (one allocation and two lock operations a request).
        """
        if self._claim is None and not self._finished:
            if waited:
                done = Lock()
                done.acquire()
                self._done = done
            # Whoever pops _claim's one token first finishes the job (list.pop is atomic under races, on every
            # Python build; a token costs less than a lock to make, take and free, once a request).
            self._claim = [True]

    def on_done(self, callback: Callable[[Job], None]) -> None:
        """Call ``callback(job)`` when the job finishes; set it before handing the job over."""
        self._on_done = callback

    def stream_to(self, sink: Callable[[Job, InferResponse], None]) -> None:
        """Make this a decoupled job: ``sink(job, response)`` gets each response ``send`` is given."""
        self._sink = sink

    @property
    def decoupled(self) -> bool:
        """True for a job whose responses stream (it finishes with ``end_stream`` or an error)."""
        return self._sink is not None

    def send(self, response: InferResponse) -> bool:
        """One response of a decoupled model, delivered now; False once the job is finished (cancelled):
        the producer should stop."""
        if self._finished:
            return False
        sink = self._sink
        if sink is not None:
            sink(self, response)
        return True

    def reschedule_to(self, callback: Callable[[Job], None]) -> None:
        """``callback(job)`` takes this job back when its model releases it with RESCHEDULE (set before handing
        the job to its backend)."""
        self._on_reschedule = callback

    def reschedule(self) -> bool:
        """The model released this unfinished job with RESCHEDULE: back to its scheduler, to run again.  False
        when its scheduler cannot (the caller then fails it)."""
        callback = self._on_reschedule
        if callback is None or self._finished:
            return False
        callback(self)
        return True

    def end_stream(self, alone: bool = True) -> None:
        """A decoupled job's final flag: no more responses (``response`` stays None).  ``alone=False``: the
        flag came with the last response, already given to ``send`` (a Python model's ``send(r, FINAL)``)."""
        if not self._take():
            return
        self.final_alone = alone
        self._complete()

    def _take(self) -> bool:
        claim = self._claim
        if claim is None:
            if self._finished:
                return False
        elif not claim:
            return False
        else:
            try:
                claim.pop()
            except IndexError:  # another thread took the token since (between the test and the pop)
                return False
        self._finished = True
        return True

    def finish(self, response: InferResponse) -> None:
        if not self._take():
            return
        self.response = response
        self._complete()

    def fail(self, error: BaseException) -> None:
        if not self._take():
            return
        if not isinstance(error, InferenceError):
            error = InternalError(f"{type(error).__name__}: {error}")
        self.error = error
        self._complete()

    def pending_cache_answer(self, response: InferResponse | None, error: BaseException | None) -> None:
        """The identical request this job waited for (response cache) finished: its answer is this job's."""
        if response is not None:
            self.finish(response)
        else:
            self.fail(error if error is not None else InternalError("the identical request gave no answer"))

    def cancel(self) -> None:
        """The client went away: never run this job; finish it as cancelled."""
        self.cancelled = True
        self.fail(Cancelled("request cancelled by the client"))

    def expired(self, now_ns: int) -> bool:
        """True when the client's deadline has passed (the job must not run)."""
        if self.deadline_ns and now_ns >= self.deadline_ns:
            self.fail(DeadlineExceeded("deadline exceeded before the request could run"))
            return True
        return False

    @property
    def finished(self) -> bool:
        return self._finished

    def _complete(self) -> None:
        if self._done is not None:
            self._done.release()
        callback = self._on_done
        if callback is not None:
            callback(self)

    def wait(self) -> InferResponse:
        """Block until finished; the response, or raise the error."""
        done = self._done
        if done is not None:
            done.acquire()
            done.release()
        elif not self._finished:  # armed for an asynchronous caller: there is nothing to wait on
            raise InternalError("a job armed without a waiter was waited for")
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


def input_signature(job: Job, batching: bool) -> Hashable:
    """Jobs merge into one batch only when their inputs agree in name and non-batch shape.

    Requested outputs are not part of it: a batch computes every output any of
    its jobs asked for (Triton batches such requests together too).
    """
    skip = 1 if batching else 0
    # In the request's order (clients send a fixed order; sorting would cost on every request).
    return tuple([(t.name, tuple(t.shape[skip:])) for t in job.request.inputs])


def ragged_signature(job: Job, batching: bool, ragged: frozenset[str]) -> Hashable:
    """:func:`input_signature` where the shapes of ``ragged`` inputs (``allow_ragged_batch``) do not count:
    Triton batches requests whatever their shapes of those."""
    skip = 1 if batching else 0
    return tuple([(t.name, () if t.name in ragged else tuple(t.shape[skip:])) for t in job.request.inputs])

"""What a frontend hands the Core with a call, and what it gets back when the call finishes.

Rules:
- A frontend never builds or reads scheduler internals: it passes a
  :class:`CallContext` (the client's deadline, and a way to hear that the
  client went away) and reads a finished call through :class:`FinishedCall`
  (the request, then exactly one of ``response`` / ``error``).
- ``on_cancel`` is a *registration*: the Core calls it, once, with the function
  that cancels the request, and only for a request that will wait in a queue
  (a request that runs at once on the caller's thread has nothing to cancel).
  grpcio's ``context.add_callback`` has exactly this shape.
- The deadline is absolute (``deadline_ns``), or read lazily from
  ``time_remaining`` (seconds; grpcio's ``context.time_remaining``) only for a
  request that will wait in a queue: one that runs at once has its turn
  already, and the hot path skips the clock reads.
- ``caller_runs``: the caller lends its thread (a grpcio stream's reader, a
  blocking caller): a model without a queue runs there instead of on a worker.
- ``Core.start`` answers a :class:`Ticket` (``cancel()``, safe from any
  thread); the finished call reaches ``on_done`` on the thread that finished
  it.  An event-loop frontend wraps its callbacks with :func:`on_loop`, the
  one loop hop ("call this back on that loop unless it is closed"); one that
  starts many requests per pass of its loop (the native gRPC frontend) calls
  :func:`start_in_bursts` on the loop's thread, so they wake the schedulers'
  threads once per pass.
- ``trace_headers`` are the request's headers (gRPC metadata, HTTP headers) as
  the frontend has them, unread (:data:`fastoip.tracing.TraceHeaders`): the
  Core reads the caller's W3C ``traceparent`` / ``tracestate`` from them only
  while tracing is on.  Frontends never write traces themselves.
- ``chain``: a Python model's BLS request carries its call chain
  (:mod:`fastoip.scheduling.call_chain`); one whose model has every instance
  on it would wait for itself and is refused before it starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from threading import get_ident
from typing import ParamSpec, Protocol, cast

from ..errors import InferenceError
from ..scheduling import wakeups
from ..scheduling.call_chain import CallChain
from ..tracing import FrontendTrace, TraceHeaders
from ..types import InferRequest, InferResponse

#: A remaining time at or above this many seconds means "no deadline" (grpcio reports ~forever as a huge number).
NO_DEADLINE_S = 1e9

CancelRegistration = Callable[[Callable[[], None]], object]


class CallContext:
    """The caller's side of one call: a deadline, an on-cancel registration, the headers tracing reads."""

    __slots__ = (
        "caller_runs", "chain", "deadline_ns", "frontend_trace", "on_cancel", "time_remaining", "trace_headers",
        "trace_parent",
    )

    def __init__(
        self,
        deadline_ns: int = 0,
        on_cancel: CancelRegistration | None = None,
        time_remaining: Callable[[], float | None] | None = None,
        trace_headers: TraceHeaders | None = None,
        caller_runs: bool = False,
        frontend_trace: FrontendTrace | None = None,
        trace_parent: tuple[int, dict[str, str]] | None = None,
        chain: CallChain = (),
    ) -> None:
        #: Absolute ``time.monotonic_ns()`` after which the request must not start, or 0 for none.
        self.deadline_ns = deadline_ns
        self.on_cancel = on_cancel
        self.time_remaining = time_remaining
        self.trace_headers = trace_headers
        #: The caller's thread may run the model (it would only wait): no hand-off to a worker.
        self.caller_runs = caller_runs
        #: The frontend's timestamps (Triton's HTTP_* / GRPC_*), joined to the request's trace if it is traced.
        self.frontend_trace = frontend_trace
        #: ``(trace id, W3C context)`` of the request that made this one (a Python model's BLS request with
        #: ``trace=request.trace()``): it is traced as that trace's child, as Triton's child traces.
        self.trace_parent = trace_parent
        #: A BLS request's call chain (``scheduling.call_chain``: the model instances waiting for its answer,
        #: the caller's last): a request that would need one of them to run is refused (a deadlock otherwise).
        self.chain = chain

    def queued_deadline_ns(self) -> int:
        """The deadline of a request about to wait in a queue: ``deadline_ns``, else from ``time_remaining``."""
        if self.deadline_ns or self.time_remaining is None:
            return self.deadline_ns
        return _deadline_after(self.time_remaining())


def _deadline_after(remaining_s: float | None) -> int:
    if remaining_s is None or remaining_s >= NO_DEADLINE_S:
        return 0
    return time.monotonic_ns() + int(remaining_s * 1e9)


class Ticket(Protocol):
    """What ``Core.start`` answers: a started call, to cancel (from any thread) when the client goes away."""

    @property
    def finished(self) -> bool: ...

    def cancel(self) -> None: ...



class FinishedCall(Ticket, Protocol):
    """A call as ``on_done`` receives it (the scheduler's job is one); ``cancel`` is safe from any thread.

    Exactly one of ``response`` / ``error`` is set, except for a decoupled call (``decoupled``), which
    finishes with its error or with neither (its responses went to ``on_response``; this is the final flag),
    or with its last response, which carries the final flag (an ensemble with a decoupled step ends so).
    ``final_alone``: a decoupled call that finished with neither got its final flag by itself (no response
    came with it; Triton's BLS iterator then yields an empty last response).
    """

    request: InferRequest
    response: InferResponse | None
    error: InferenceError | None
    final_alone: bool

    @property
    def decoupled(self) -> bool: ...


#: ``on_done(call)``: the call finished (read ``response`` / ``error``); runs on the finishing thread.
OnDone = Callable[[FinishedCall], object]
#: ``on_response(call, response)``: one response of a decoupled model, on the producing thread.
OnResponse = Callable[[FinishedCall, InferResponse], object]

P = ParamSpec("P")


def on_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[P, object], loop_thread: int = 0
) -> Callable[P, None]:
    """``callback`` made callable from any thread: it runs on ``loop``, unless the loop is closed (the server
    stopped past its exit timeout: nobody is left to answer).  Positional arguments only.  Called on the loop's
    own thread (a worker process's results are read there, a quick batch runs there), it is queued without
    waking the loop's selector.  ``loop_thread``: the ``threading.get_ident()`` of the thread that runs
    ``loop``, when the caller knows it (the hop then tells the loop's thread by it, without asking asyncio for
    the running loop, which costs a ``getpid`` system call on a thread that runs one); with it, a call made
    while that thread runs a burst's batches (``wakeups.release``) runs at once."""
    if loop_thread:
        return cast("Callable[P, None]", _KnownLoopHop(loop, callback, loop_thread))
    call_soon_threadsafe = loop.call_soon_threadsafe
    call_soon = loop.call_soon
    running = asyncio._get_running_loop

    def hop(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            if running() is loop:
                call_soon(callback, *args)
            else:
                call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed
            pass

    return hop


class _KnownLoopHop:
    """``on_loop``'s hop when the loop's thread is known (one compiled object a call, where a closure is two)."""

    __slots__ = ("loop", "callback", "loop_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[..., object], loop_thread: int) -> None:
        self.loop = loop
        self.callback = callback
        self.loop_thread = loop_thread

    def __call__(self, first: object, *rest: object) -> None:
        try:
            if get_ident() != self.loop_thread:
                self.loop.call_soon_threadsafe(self.callback, first, *rest)
            elif wakeups.releasing():
                # The loop's thread runs a burst's batches (wakeups.release, a callback of its own): no connection
                # is being read, so the answer goes out now, not a loop pass later (a handle less a request).
                self._run_now(first, rest)
            else:
                self.loop.call_soon(self.callback, first, *rest)
        except RuntimeError:  # the loop is closed
            pass

    def _run_now(self, first: object, rest: tuple) -> None:
        try:
            if rest:
                self.callback(first, *rest)
            else:  # (a call's completion: one argument, called without a tuple)
                self.callback(first)
        except Exception as exc:  # as the loop reports a failing callback; the batch's other answers still go
            self.loop.call_exception_handler(
                {"message": "a completion failed", "exception": exc, "callback": self.callback}
            )


def start_in_bursts(loop: asyncio.AbstractEventLoop) -> None:
    """Called on ``loop``'s thread (before it runs): the requests started on this thread in one pass of the loop
    wake the schedulers' instance threads once, at the loop's next pass, not once each while the loop still
    runs (:mod:`fastoip.scheduling.wakeups`)."""
    wakeups.hold(lambda: loop.call_soon(wakeups.release))

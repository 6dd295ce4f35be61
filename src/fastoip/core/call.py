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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..errors import InferenceError
from ..types import InferRequest, InferResponse

#: A remaining time at or above this many seconds means "no deadline" (grpcio reports ~forever as a huge number).
NO_DEADLINE_S = 1e9


class CallContext:
    """The caller's side of one call: an absolute deadline and an on-cancel registration."""

    __slots__ = ("deadline_ns", "on_cancel")

    def __init__(
        self, deadline_ns: int = 0, on_cancel: Callable[[Callable[[], None]], object] | None = None
    ) -> None:
        #: Absolute ``time.monotonic_ns()`` after which the request must not start, or 0 for none.
        self.deadline_ns = deadline_ns
        self.on_cancel = on_cancel

    @classmethod
    def with_timeout(
        cls, remaining_s: float | None, on_cancel: Callable[[Callable[[], None]], object] | None = None
    ) -> CallContext:
        """From a relative time left (seconds, None: no deadline), as gRPC servers report it."""
        deadline_ns = 0
        if remaining_s is not None and remaining_s < NO_DEADLINE_S:
            deadline_ns = time.monotonic_ns() + int(remaining_s * 1e9)
        return cls(deadline_ns, on_cancel)


class FinishedCall(Protocol):
    """A call as ``on_done`` receives it (the scheduler's job is one); ``cancel`` is safe from any thread."""

    request: InferRequest
    response: InferResponse | None
    error: InferenceError | None

    def cancel(self) -> None: ...

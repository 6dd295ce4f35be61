"""One server-wide budget of the bytes that large HTTP request bodies hold while they are read and served.

Triton bounds an infer request's JSON part by --http-max-input-size but reads the binary tensor data after it
(Inference-Header-Content-Length) whole, of any size.  fastoip reads such data too, up to
--http-max-binary-input-size per body, but every byte a body holds past --http-max-input-size is drawn from this
one budget (--http-max-body-bytes-in-flight) until its request is answered: a few clients cannot make the server
hold more than that, and past it the answer is an immediate 503 with Retry-After, not a wait.  Bodies within
--http-max-input-size draw nothing, so ordinary traffic is never refused because large uploads are in flight.
"""

from __future__ import annotations

import threading

from ...errors import ResourceExhausted
from .errors import too_large

BUDGET_FLAG = "--http-max-body-bytes-in-flight"


class BodyBudget:
    """Bytes held by large bodies, server-wide (the HTTP and OpenAI ports may run on two loops: a lock)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Hold ``size`` more bytes: 503 (Retry-After) while others hold too much."""
        with self._lock:
            if self.held + size > self.total:
                raise ResourceExhausted(
                    f"the server holds {self.held} bytes of large HTTP request bodies and this one needs {size} "
                    f"more, past {BUDGET_FLAG} ({self.total}); retry later",
                    retry_after=1,
                )
            self.held += size

    def give_back(self, size: int) -> None:
        with self._lock:
            self.held -= size


class BodyHold:
    """What one request's body holds of the budget; ``release`` gives it back (once, in a finally)."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def grow_to(self, size: int) -> None:
        """Hold ``size`` bytes in all: 413 when that is more than the whole budget (retrying cannot help)."""
        if size > self.budget.total:
            raise too_large(f"the request body needs {size} bytes, more than all {self.budget.total} bytes that "
                            "large bodies may hold", BUDGET_FLAG)
        if size > self.size:
            self.budget.take(size - self.size)
            self.size = size

    def release(self) -> None:
        if self.size:
            self.budget.give_back(self.size)
            self.size = 0

"""Where the frontends ask a readiness that may wait on a model's own ``is_ready()`` (issue 36), bounded.

Who reaches it: any client of a readiness endpoint (gRPC ServerReady / ModelReady / Check, HTTP /v2/health/ready,
/v2/models/{m}/ready, KServe V1, OpenAI), for a model whose ``is_ready`` may wait (python_backend bounds each wait
at 5 s).  What it holds: one of :data:`THREADS` threads per question while the model answers (askers of one
instance share its check in flight).  When full (:data:`MAX_WAITING` questions asked and not answered, a flood or
a hung ``is_ready``): the next is refused at once, RESOURCE_EXHAUSTED / HTTP 503 with Retry-After (issue 37's rule
for a budget the server shares), never queued behind the others; the rest of the server does not notice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import ResourceExhausted

T = TypeVar("T")

#: Threads that ask a readiness which may wait on model code.
THREADS = 4
#: Questions asked and not yet answered, past which the next is refused.
MAX_WAITING = 64


class ReadinessPool(ThreadPoolExecutor):
    """A thread pool whose ``submit`` refuses (ResourceExhausted) past :data:`MAX_WAITING` questions waiting."""

    def __init__(self, threads: int = THREADS, max_waiting: int = MAX_WAITING) -> None:
        super().__init__(max_workers=threads, thread_name_prefix="fastoip-ready")
        self.max_waiting = max_waiting
        self._waiting = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._count_lock:
            if self._waiting >= self.max_waiting:
                raise ResourceExhausted(
                    f"{self.max_waiting} readiness requests are waiting for models' own is_ready(); "
                    "try again shortly", retry_after=1,
                )
            self._waiting += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._answered(None)
            raise
        future.add_done_callback(self._answered)
        return future

    def _answered(self, _: object) -> None:
        with self._count_lock:
            self._waiting -= 1

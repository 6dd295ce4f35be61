"""The one asyncio loop every ``async def`` model method runs on, and how a worker thread calls into it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable
from typing import Any


class _EventLoop:
    """One asyncio loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        #: The tasks ``submit`` started and that still run (touched on the loop only).
        self._submitted: set[asyncio.Task] = set()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="fastoip-python-loop", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def run(self, awaitable: Any, timeout: float | None = None) -> Any:
        """Run ``awaitable`` on the loop and wait for its result (from any other thread)."""
        loop = self.loop()
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking call into the Python backend's event loop from the loop itself")

        async def wrapper() -> Any:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wrapper(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


    def submit(self, awaitable: Any, done: Callable[[BaseException | None], None]) -> None:
        """Start ``awaitable`` on the loop without waiting; ``done(exception or None)`` runs when it ends."""

        loop = self.loop()

        async def wrapper() -> Any:
            return await awaitable

        def finished(ended: asyncio.Task) -> None:  # (on the loop)
            self._submitted.discard(ended)
            done(None if ended.cancelled() else ended.exception())

        def start() -> None:
            task = loop.create_task(wrapper())
            self._submitted.add(task)  # (a loop holds its tasks weakly)
            task.add_done_callback(finished)

        # a task made on the loop, no thread-safe future chained to it (nobody waits here: that chain was a
        # streamed generation's largest fixed cost on its way to the loop)
        loop.call_soon_threadsafe(start)


EVENT_LOOP = _EventLoop()


def call(function: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """Call a sync or async function; an awaitable result is run on the backend's loop."""
    result = function(*args)
    if inspect.isawaitable(result):
        return EVENT_LOOP.run(result, timeout)
    return result

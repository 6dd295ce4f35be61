"""Wake-ups of the schedulers' instance threads, held back while one thread queues a burst of requests.

Rules:
- A scheduler that queued a job wakes its instance threads through
  :func:`wake_later` (or at once when that answers False), never by itself
  while the queuing thread holds its wake-ups.
- A thread that queues requests in bursts (an event loop's thread: every
  connection that became readable in one pass of the loop) calls :func:`hold`
  once: from then on, a wake-up asked for on that thread is remembered (once
  per scheduler) and ``schedule()`` is called at the first one, so that the
  thread runs :func:`release` when the burst is over (the loop's next pass,
  ``loop.call_soon``).  The instance threads then wake once per burst with
  every job of the burst in their queue, instead of once per job while the
  loop still holds the GIL (measured on the native gRPC frontend, ``simple``
  c=64 over 64 connections: 1.2-1.5 context switches per request before, 0.14
  after; see benchmarks/RESULTS.md 2026-11-27, "hotpath").
- Any other thread wakes at once: a thread that blocks on its own request
  (``Core.infer``) never waits on a wake-up it holds itself.
- The holding thread must run ``release`` soon and must not block before it:
  a held wake-up delays its jobs until then.  An instance thread that is busy
  picks queued jobs up without any wake-up.
- A wake-up may run the burst itself on the releasing thread (a quick model's
  dynamic batcher, ``batcher.INLINE_MAX_NS``): ``release`` then returns once
  those batches ran.  While it runs them, :func:`releasing` is True on that
  thread: a completion that would be queued back to that thread's event loop
  may run at once instead (nothing of a connection is being read there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

#: The holding thread's state: ``schedule``, ``pending`` (the wake-ups asked for since the last release, in
#: order, each once) and ``running`` (True while ``release`` runs them).  Other threads see none of them set:
#: nothing held.  (A plain ``threading.local`` read with defaults, so that mypyc compiles this module: these
#: calls are made once or twice a request.)
_held = threading.local()


def hold(schedule: Callable[[], object]) -> None:
    """From now on this thread holds its wake-ups; ``schedule()`` must arrange a :func:`release` on it soon."""
    _held.schedule = schedule
    _held.pending = {}


def wake_later(wake: Callable[[], object]) -> bool:
    """Remember ``wake`` for this thread's next :func:`release`; False when this thread holds nothing."""
    pending: dict[Callable[[], object], None] | None = getattr(_held, "pending", None)
    if pending is None:
        return False
    if wake not in pending:
        if not pending:  # the burst's first wake-up asks for the release (if that fails, nothing is held)
            schedule: Callable[[], object] = _held.schedule
            schedule()
        pending[wake] = None
    return True


def release() -> None:
    """Run this thread's held wake-ups (each scheduler once)."""
    pending: dict[Callable[[], object], None] | None = getattr(_held, "pending", None)
    if not pending:
        return
    _held.pending = {}
    _held.running = True
    try:
        for wake in pending:
            wake()
    finally:
        _held.running = False


def releasing() -> bool:
    """Is this thread running its held wake-ups (:func:`release`) now?"""
    running: bool = getattr(_held, "running", False)
    return running

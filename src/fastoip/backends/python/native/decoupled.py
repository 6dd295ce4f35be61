"""Decoupled Python models: what ``predict`` produced, as the sequence of values that become responses.

Rules:
- ``predict`` of a decoupled model (``model_transaction_policy { decoupled: true }``)
  may be a generator or an async generator (any number of responses, zero
  included), or return one value (one response) or None (no response).
- A sync generator is stepped on the thread executing the request.  An async
  generator is driven to its end on the backend's event loop in one go
  (:func:`drive`), each value handed on from there as it is produced, while
  the executing thread waits once: stepping it one value per round trip cost
  every token two thread hand-offs (measured: the largest per-token cost of a
  streamed chat).
- :func:`close` ends a generator the client no longer listens to (its
  ``finally`` blocks run).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from ..event_loop import EVENT_LOOP

#: How long one async generation runs on the loop before the others get a turn (when it never awaits): a turn a
#: value cost a pass of the loop per token (measured, ~10 % of a streamed token's CPU); a turn this long holds the
#: others back a fraction of a millisecond.
TURN_S = 0.0005
#: What an async generator's next step gives when it is exhausted.
_EXHAUSTED = object()


def values_of(produced: Any) -> Iterator[Any]:
    """Each value ``produced`` stands for, in order, computed as it is asked for."""
    if inspect.isasyncgen(produced):
        while (value := EVENT_LOOP.run(_next_of(produced))) is not _EXHAUSTED:
            yield value
    elif inspect.isgenerator(produced):
        yield from produced
    elif produced is not None:
        yield produced


async def _next_of(generator: AsyncGenerator[Any, Any]) -> Any:
    try:
        return await generator.__anext__()
    except StopAsyncIteration:
        return _EXHAUSTED


class ModelFailed(Exception):
    """The model's async generator raised ``cause`` (not the code that handles its values)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(cause)
        self.cause = cause


def is_async(produced: Any) -> bool:
    return inspect.isasyncgen(produced)


async def drive_here(produced: AsyncGenerator[Any, Any], deliver: Callable[[Any], bool]) -> None:
    """:func:`drive`, awaited on the backend's loop itself (a generation that holds no thread)."""
    await _drive(produced, deliver)


def drive(produced: AsyncGenerator[Any, Any], deliver: Callable[[Any], bool]) -> None:
    """Run the async generator ``produced`` on the backend's loop, ``deliver(value)`` for each value until it
    returns False (nobody listens any more); this thread waits for the end.  The generator is closed on every
    path (its ``finally`` blocks run on its loop).  What the generator raises comes back as :class:`ModelFailed`;
    what ``deliver`` raises, as itself."""
    EVENT_LOOP.run(_drive(produced, deliver))


async def _drive(produced: AsyncGenerator[Any, Any], deliver: Callable[[Any], bool]) -> None:
    turn_ends = time.monotonic() + TURN_S
    try:
        while True:
            try:
                value = await produced.__anext__()
            except StopAsyncIteration:
                return
            except Exception as exc:
                raise ModelFailed(exc) from exc
            if not deliver(value):
                return
            if time.monotonic() >= turn_ends:
                # the loop's other generations get their turn, as a model that awaits between tokens gives it
                # (one that never awaits would otherwise stream its whole answer before any other starts)
                await asyncio.sleep(0)
                turn_ends = time.monotonic() + TURN_S
    finally:
        await produced.aclose()


def close(produced: Any) -> None:
    """Stop a generator early (the client went away): its ``finally`` blocks run now."""
    if inspect.isasyncgen(produced):
        EVENT_LOOP.run(produced.aclose())
    elif inspect.isgenerator(produced):
        produced.close()

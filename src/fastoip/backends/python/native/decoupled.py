"""Decoupled Python models: what ``predict`` produced, as the sequence of values that become responses.

Rules:
- ``predict`` of a decoupled model (``model_transaction_policy { decoupled: true }``)
  may be a generator or an async generator (any number of responses, zero
  included), or return one value (one response) or None (no response).
- Everything runs on the thread executing the request: a sync generator is
  stepped here; an async generator is stepped one value at a time on the
  backend's event loop while this thread waits (as every async method is).
- :func:`close` ends a generator the client no longer listens to (its
  ``finally`` blocks run).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from ..event_loop import EVENT_LOOP

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


def close(produced: Any) -> None:
    """Stop a generator early (the client went away): its ``finally`` blocks run now."""
    if inspect.isasyncgen(produced):
        EVENT_LOOP.run(produced.aclose())
    elif inspect.isgenerator(produced):
        produced.close()

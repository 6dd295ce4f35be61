"""Readiness as an event loop asks it: at once when no model code can make it wait (the common case, probed
often by Kubernetes), else on the Core's readiness pool (a Python model's own ``is_ready``; issue 36: an event
loop never waits on a worker)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from ..core import Core

T = TypeVar("T")


async def asked(core: Core, model: str | None, version: str, question: Callable[[], T]) -> T:
    """``question()`` (a readiness of ``model``, None: the server's) without holding the running loop."""
    if not core.readiness_waits(model, version):
        return question()
    return await asyncio.get_running_loop().run_in_executor(core.readiness_pool, question)

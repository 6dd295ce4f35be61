"""The one event loop ``async def`` model methods run on (it lives in :mod:`fastoip.pyworker.loop`, which
worker processes import without the server's modules)."""

from __future__ import annotations

from ...pyworker.loop import EVENT_LOOP, call

__all__ = ["EVENT_LOOP", "call"]

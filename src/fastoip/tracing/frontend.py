"""The frontend's part of a traced request: Triton's HTTP_RECV_* / HTTP_SEND_* and GRPC_WAITREAD_* /
GRPC_SEND_* timestamps, in the same trace as the Core's.

Rules:
- A frontend makes a :class:`FrontendTrace` only while tracing is active, stamps it as the request is read
  and answered, hands it to the Core with the request, and calls :meth:`FrontendTrace.done` once it has
  answered, on every path (errors too).
- The trace is written when both the Core and the frontend are done with it, whichever comes last, so
  one trace carries every timestamp (Triton's ``trace_summary.py`` reads them together).
- A request that was not sampled costs the frontend its few timestamps and nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .manager import Trace


class FrontendTrace:
    """Frontend timestamps for one request, joined to the Core's trace of it (if it is traced)."""

    __slots__ = ("stamps", "_lock", "_trace", "_write", "_core_done", "_frontend_done")

    def __init__(self) -> None:
        self.stamps: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._trace: Trace | None = None
        self._write: Callable[[Trace], None] | None = None
        self._core_done = False
        self._frontend_done = False

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    # -- the Core's side ------------------------------------------------------------------------
    def attach(self, trace: Trace, write: Callable[[Trace], None]) -> None:
        """The Core traces this request: ``write(trace)`` writes it once both sides are done."""
        self._trace, self._write = trace, write

    def core_done(self) -> None:
        """The Core filled its timestamps; the trace is written now if the frontend is done too."""
        with self._lock:
            self._core_done = True
            ready = self._frontend_done
        if ready:
            self._flush()

    # -- the frontend's side --------------------------------------------------------------------
    def done(self) -> None:
        """The frontend answered (or gave up); the trace is written now if the Core is done too."""
        with self._lock:
            if self._frontend_done:
                return
            self._frontend_done = True
            ready = self._core_done
        if ready:
            self._flush()

    def _flush(self) -> None:
        trace, write = self._trace, self._write
        if trace is None or write is None:
            return
        self._trace = None
        if trace.timestamps:
            for name, ns in self.stamps:
                trace.record.stamp(name, ns)
        write(trace)

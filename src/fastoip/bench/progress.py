"""Progress: a live line (rich) on a terminal; a plain line per window on stderr otherwise (CI logs); none with -q."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """``with Progress(enabled) as p: p.update("...")``: one transient status line."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stdout.isatty()
        #: not a terminal: one plain line per finished window (and per warm-up) instead of a live line
        self.plain = enabled and not self.enabled
        self._live: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.live import Live
            from rich.text import Text

            self._text = Text
            self._live = Live(Text(""), refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, message: str) -> None:
        if self._live is not None:
            self._live.update(self._text(message))

    def level(self, label: str, phase: str, result: Any, percentile: int | None) -> None:
        """Describe a level in progress (called by measure_level after each window)."""
        if self._live is None and not self.plain:
            return
        if phase == "warmup":
            self._say(f"{label}  warming up ...")
            return
        if phase == "tick":
            if not result.windows and not self.plain:
                self.update(f"{label}  measuring window 1 ...")
            return
        window = result.windows[-1]
        latency = window.latency_us(percentile)
        what = "avg" if percentile is None else f"p{percentile}"
        lat = "-" if latency is None else f"{latency / 1e3:.3f} ms"
        errors = sum(window.sample.errors.values())
        self._say(
            f"{label}  window {len(result.windows)}: {window.req_per_s * result.batch_size:,.0f} infer/s, "
            f"{what} {lat}" + (f", {errors} errors" if errors else "")
        )

    def _say(self, message: str) -> None:
        if self.plain:
            print(message, file=sys.stderr, flush=True)
        else:
            self.update(message)

"""The live progress line (rich); silent with --quiet or when stdout is not a terminal."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """``with Progress(enabled) as p: p.update("...")``: one transient status line."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stdout.isatty()
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
        if self._live is None:
            return
        if phase == "warmup":
            self.update(f"{label}  warming up ...")
            return
        if phase == "tick":
            if not result.windows:
                self.update(f"{label}  measuring window 1 ...")
            return
        window = result.windows[-1]
        latency = window.latency_us(percentile)
        what = "avg" if percentile is None else f"p{percentile}"
        lat = "-" if latency is None else f"{latency / 1e3:.3f} ms"
        errors = sum(window.sample.errors.values())
        self.update(
            f"{label}  window {len(result.windows)}: {window.req_per_s * result.batch_size:,.0f} infer/s, "
            f"{what} {lat}" + (f", {errors} errors" if errors else "")
        )

"""Stop strings over a stream of text deltas: what may be sent now, and whether a stop string was met.

The translator enforces ``stop`` itself (it also goes to the model in ``sampling_parameters``), so every
model stops alike: the text ends before the first stop string, which is not part of the answer (OpenAI's
rule).  A stop string may straddle deltas, so text that could be the start of one is held back until the
next delta says whether it is.
"""

from __future__ import annotations


class StopScanner:
    """Feed deltas; each call answers the text that is safe to send and whether generation must stop."""

    __slots__ = ("stops", "held", "stopped")

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        text = self.held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.held = ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, at the end of the stream (it was no stop string after all)."""
        text, self.held = self.held, ""
        return text

    def _partial_suffix(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string.

        Only positions holding a stop string's first character are tried (``str.find``), so a delta costs
        about the stop strings' length, not its square."""
        longest = 0
        for stop in self.stops:
            position = text.find(stop[0], max(len(text) - len(stop) + 1, 0))
            while position >= 0 and len(text) - position > longest:
                if stop.startswith(text[position:]):
                    longest = len(text) - position
                    break
                position = text.find(stop[0], position + 1)
        return longest

"""Triton's trace file: a JSON array of trace entries, as ``trace_summary.py`` reads it.

Rules:
- ``log_frequency`` 0: one file, rewritten in place so it is a complete JSON
  array after every trace (Triton completes it at exit; a reader here never
  sees a half-written file).
- ``log_frequency`` N > 0: every N traces go to a new file ``<file>.<k>``
  (k = 0, 1, ...), each a complete JSON array, as Triton rotates them.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import orjson


class TraceFile:
    """Appends traces to Triton's JSON-array trace file(s)."""

    def __init__(self, path: str, log_frequency: int = 0) -> None:
        self.path = path
        self.log_frequency = log_frequency
        self._pending: list[dict[str, Any]] = []
        self._traces = 0
        self._index = 0
        self._lock = threading.Lock()

    def write(self, entries: list[dict[str, Any]]) -> None:
        """Add one trace's entries."""
        with self._lock:
            if self.log_frequency == 0:
                self._append_in_place(entries)
                return
            self._pending += entries
            self._traces += 1
            if self._traces >= self.log_frequency:
                self._rotate()

    def flush(self) -> None:
        """Write what a rotating writer still holds (at shutdown or when settings change)."""
        with self._lock:
            if self._pending:
                self._rotate()

    def _rotate(self) -> None:
        with open(f"{self.path}.{self._index}", "wb") as out:
            out.write(orjson.dumps(self._pending))
        self._index += 1
        self._pending = []
        self._traces = 0

    def _append_in_place(self, entries: list[dict[str, Any]]) -> None:
        body = b",".join(orjson.dumps(entry) for entry in entries)
        with open(self.path, "ab+") as out:
            size = out.seek(0, os.SEEK_END)
            if size == 0:
                out.write(b"[" + body + b"]")
                return
        # replace the closing bracket: the file stays one valid JSON array
        with open(self.path, "r+b") as out:
            out.seek(-1, os.SEEK_END)
            out.write(b"," + body + b"]")

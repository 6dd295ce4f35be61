"""Triton's trace file: a JSON array of trace entries, as ``trace_summary.py`` reads it.

Rules:
- ``append``: into the one file ``<file>``, which stays a complete JSON array
  after every write (Triton writes ``[`` first and ``]`` at exit; here a reader,
  or a crash, never sees a half-written file).
- ``write_indexed``: a complete JSON array into the next ``<file>.<k>``
  (k = 0, 1, ... for the life of the server), as Triton does every
  ``log_frequency`` traces.
- One :class:`TraceFile` per path (settings sharing a path share it); writes are serialised.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import orjson


class TraceFile:
    """The trace file(s) at one path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._index = 0
        self._lock = threading.Lock()

    def append(self, entries: list[dict[str, Any]]) -> None:
        """Add entries to ``<file>``'s array."""
        if not entries:
            return
        body = b",".join(orjson.dumps(entry) for entry in entries)
        with self._lock:
            with open(self.path, "ab+") as out:
                if out.seek(0, os.SEEK_END) == 0:
                    out.write(b"[" + body + b"]")
                    return
            # replace the closing bracket: the file stays one valid JSON array
            with open(self.path, "r+b") as out:
                out.seek(-1, os.SEEK_END)
                out.write(b"," + body + b"]")

    def write_indexed(self, entries: list[dict[str, Any]]) -> None:
        """Write entries as the array of the next ``<file>.<k>``."""
        if not entries:
            return
        with self._lock:
            name = f"{self.path}.{self._index}"
            self._index += 1
            with open(name, "wb") as out:
                out.write(orjson.dumps(entries))

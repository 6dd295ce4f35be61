"""Triton's trace file: a JSON array of trace entries, as ``trace_summary.py`` reads it.

Rules:
- ``append``: into the one file ``<file>``, which stays a complete JSON array
  after every write (Triton writes ``[`` first and ``]`` at exit; here a reader,
  or a crash, never sees a half-written file).
- ``write_indexed``: a complete JSON array into the next ``<file>.<k>``
  (k = 0, 1, ... for the life of the server), as Triton does every
  ``log_frequency`` traces.
- One :class:`TraceFile` per path (settings sharing a path share it); writes are serialised.
- Issue 37 (the trace API is open by default, and ``log_frequency`` 1 wrote a file a request without end):
  at most ``MAX_FILES`` indexed files and ``MAX_BYTES`` written in all per path for the life of the
  server; past either, traces are dropped with one warning (Triton has no such bound).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import orjson

log = logging.getLogger("fastoip.tracing")

#: Indexed files one trace path may have (``<file>.0`` ... ``<file>.<MAX_FILES - 1>``).
MAX_FILES = 1000
#: Bytes one trace path may be written, all its files together.
MAX_BYTES = 1024 * 1024 * 1024


class TraceFile:
    """The trace file(s) at one path."""

    def __init__(self, path: str, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._index = 0
        self._written = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def _room(self, size: int, new_file: bool) -> bool:
        """Whether ``size`` more bytes (in a new indexed file) stay within the bounds; else count a drop
        (under the lock)."""
        if self._written + size <= self.max_bytes and not (new_file and self._index >= self.max_files):
            self._written += size
            return True
        if not self.dropped:
            log.warning("trace file '%s' reached its bound (%d files, %d bytes): further traces are dropped",
                        self.path, self.max_files, self.max_bytes)
        self.dropped += 1
        return False

    def append(self, entries: list[dict[str, Any]]) -> None:
        """Add entries to ``<file>``'s array."""
        if not entries:
            return
        body = b",".join(orjson.dumps(entry) for entry in entries)
        with self._lock:
            if not self._room(len(body) + 2, False):
                return
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
        body = orjson.dumps(entries)
        with self._lock:
            if not self._room(len(body), True):
                return
            name = f"{self.path}.{self._index}"
            self._index += 1
            with open(name, "wb") as out:
                out.write(body)

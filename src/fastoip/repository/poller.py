"""Poll mode: reload models whose files changed, load new ones, unload removed ones.

Rules:
- A model's fingerprint is the size and mtime of its config files and of the
  model file of every numeric version folder.  Only a changed fingerprint
  triggers a load.
- A reload builds the new versions while the old ones keep serving and swaps
  them in when they are ready (Triton's poll mode unloads first; that is the
  downtime this avoids).  A failed reload leaves the old versions serving.
- A repository copied from object storage is synced first; when that fails (the bucket vanished, the
  credentials expired) the poll is skipped and nothing is unloaded.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..errors import InferenceError
from .repository import ModelRepository

log = logging.getLogger("fastoip.repository")


def fingerprint(model_dir: Path) -> tuple:
    """What changes when a model's files change."""
    entries = []
    if not model_dir.is_dir():
        return ()
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in path.parts):
            stat = path.stat()
            entries.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


class RepositoryPoller:
    """Rescans the repository every ``interval`` seconds on a background thread."""

    def __init__(self, repository: ModelRepository, interval: float) -> None:
        self.repository = repository
        self.interval = interval
        self.seen: dict[str, tuple] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastoip-poller", daemon=True)

    def remember_current(self) -> None:
        """Record the files as loaded at start-up."""
        for name in self.repository.model_names():
            self.seen[name] = fingerprint(self.repository.model_dir(name))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def poll_once(self) -> None:
        source = self.repository.source
        if source is not None:
            try:
                source.sync()
            except InferenceError as exc:  # the storage is unreachable: keep serving what is loaded
                log.error("poll: %s; the loaded models keep serving", exc.message)
                return
        names = set(self.repository.model_names())
        changed = []
        for name in sorted(names):
            current = fingerprint(self.repository.model_dir(name))
            if self.seen.get(name) == current:
                continue
            self.seen[name] = current
            log.info("poll: model '%s' changed, loading", name)
            changed.append(name)
        if changed:  # one load operation: side by side on the load threads (Triton's --model-load-thread-count)
            self.repository.load_many(changed, what="poll: ")
        for name in sorted(set(self.seen) - names):
            del self.seen[name]
            log.info("poll: model '%s' removed, unloading", name)
            try:
                self.repository.unload(name)
            except InferenceError as exc:
                log.error("poll: unloading '%s' failed: %s", name, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll_once()
            except Exception:  # never let the poller die silently
                log.exception("repository poll failed")

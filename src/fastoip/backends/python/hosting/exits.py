"""Worker processes' exits, noticed by the process ending (a pidfd), not by their socket closing.

Rules:
- A worker that forks and then dies leaves its socket open in the child: its end never closes, so its reader
  would wait for good.  :func:`watch` runs ``on_exit()`` once when the process itself exits, whatever holds
  its descriptors (the server's handle then shuts its socket down: the reader reads the end and handles the
  death as any other).
- One daemon thread polls every watched process's pidfd (``os.pidfd_open``, Linux 5.3+); without pidfds (other
  systems), the socket's end stays the only sign, as before.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

log = logging.getLogger("fastoip.python")

_lock = threading.Lock()
#: pidfd -> what runs when its process exits
_watched: dict[int, Callable[[], None]] = {}
_poller: select.poll | None = None
#: A pipe that wakes the thread when a process is added (its read end is in the poller).
_wake: tuple[int, int] | None = None


def supported() -> bool:
    return hasattr(os, "pidfd_open")


def watch(pid: int, on_exit: Callable[[], None]) -> Callable[[], None] | None:
    """Run ``on_exit()`` (on the watcher's thread) when process ``pid`` exits; a function that stops watching
    it (None when this system has no pidfds)."""
    global _poller, _wake
    if not supported():
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:  # (gone already: the socket's end says so)
        log.debug("pidfd_open(%d): %s", pid, exc)
        return None
    with _lock:
        if _poller is None:
            _poller = select.poll()
            _wake = os.pipe()
            os.set_blocking(_wake[1], False)
            _poller.register(_wake[0], select.POLLIN)
            threading.Thread(target=_run, name="fastoip-worker-exits", daemon=True).start()
        _watched[fd] = on_exit
        _poller.register(fd, select.POLLIN)
        assert _wake is not None
        try:
            os.write(_wake[1], b"x")
        except BlockingIOError:
            pass

    def forget() -> None:
        with _lock:
            if _watched.pop(fd, None) is not None and _poller is not None and _wake is not None:
                _poller.unregister(fd)
                os.close(fd)
                try:
                    os.write(_wake[1], b"x")  # (the thread polls again without it)
                except BlockingIOError:
                    pass

    return forget


def _run() -> None:
    assert _poller is not None and _wake is not None
    while True:
        for fd, _ in _poller.poll():
            if fd == _wake[0]:
                try:
                    os.read(fd, 4096)
                except BlockingIOError:
                    pass
                continue
            with _lock:
                on_exit = _watched.pop(fd, None)
                if on_exit is not None:
                    _poller.unregister(fd)
                    os.close(fd)
            if on_exit is not None:
                try:
                    on_exit()
                except Exception:
                    log.exception("handling a worker's exit failed")

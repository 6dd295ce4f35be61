"""Compiled modules for the suite where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines set it).

With it, every ``fastoip serve`` a test starts compiled fastoip's ~160 modules from source (about 0.1 s of
CPU; about 90 places in the tests start one, many once per gRPC frontend), and each of ``make test``'s workers
compiled and assertion-rewrote every test module at every run (about 4 s of CPU a worker, all at the start).
So, in the ``__pycache__`` folders that Python would use anyway (ignored by git):
- before the workers start, fastoip's own modules are compiled (``compileall``: only what changed since);
- while a process collects the tests, it may write compiled modules (the test modules, tests/helpers, fastoip).
Nothing else is written: servers and tests still never write compiled modules, so a Python model whose
``model.py`` a test edits and reloads within the same second is read from its source, not from a stale cache.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path


def writes_forbidden() -> bool:
    """Whether this process was told not to write compiled modules (``PYTHONDONTWRITEBYTECODE``)."""
    return sys.dont_write_bytecode and sys.pycache_prefix is None


def compile_fastoip() -> None:
    """Compile the fastoip package under test where it lies (a checkout's src/ or an editable install)."""
    import fastoip

    compileall.compile_dir(str(Path(fastoip.__file__).parent), quiet=2)  # best effort: silent


def allow_writes_while_collecting() -> None:
    sys.dont_write_bytecode = False


def forbid_writes_again() -> None:
    sys.dont_write_bytecode = True

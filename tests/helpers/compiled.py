"""The per-call path's modules that setup.py compiles with mypyc (its ``COMPILED_PY`` list), and which are stale.

A built module (``native_server.cpython-311-x86_64-linux-gnu.so``) shadows its ``.py`` on import: after an edit
of the ``.py`` the old compiled code would run until the next build.  tests/conftest.py refuses to run on a stale
one; tests/unit/test_compiled.py checks that the list is what the build made.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def compiled_sources() -> list[Path]:
    """The ``.py`` files of setup.py's ``COMPILED_PY`` (read from its source, not run)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPILED_PY" for t in node.targets):
            return [REPO / path for path in ast.literal_eval(node.value)]
    raise LookupError("setup.py has no COMPILED_PY list")


def built_module(source: Path) -> Path | None:
    """The extension module built from ``source`` beside it, or None."""
    found = sorted(source.parent.glob(source.stem + ".*.so"))
    return found[0] if found else None


def stale_modules() -> list[str]:
    """The compiled sources edited after their build (their ``.so`` would shadow the edit).

    The code of them all is in one shared library (``fastoip/_percall__mypyc*.so``); the ``.so`` beside each
    source is a small shim that a rebuild does not touch when only the code changed."""
    shared = sorted((REPO / "src" / "fastoip").glob("_percall__mypyc.*.so"))
    stale = []
    for source in compiled_sources():
        shim = built_module(source)
        if shim is None:
            continue
        built = max(path.stat().st_mtime for path in [shim, *shared])
        if source.stat().st_mtime > built:
            stale.append(str(source.relative_to(REPO)))
    return stale

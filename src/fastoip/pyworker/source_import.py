"""Import a model's Python file afresh, from its source, under a module name of its own.

A model file can change between two loads (a reload, a poll, a test that rewrites it); Python's bytecode cache
keys a ``.pyc`` on the source's whole-second mtime and size, so an edit of the same size within the same second
would run the old code.  Model files are therefore always compiled from their source, and no ``.pyc`` is written
beside them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import CodeType, ModuleType


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A source loader that neither reads nor writes the bytecode cache."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def import_source(path: Path | str, module_name: str) -> ModuleType:
    """Run ``path`` as the module ``module_name`` (registered in ``sys.modules``; removed again if it raises),
    with its folder first on ``sys.path`` while it runs, so the file may import files beside it."""
    location = str(path)
    loader = _SourceOnlyLoader(module_name, location)
    spec = importlib.util.spec_from_file_location(module_name, location, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(Path(location).parent)
    sys.path.insert(0, folder)
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module

"""Import a model's Python file afresh, from its source, under a module name of its own.

A model file can change between two loads (a reload, a poll, a test that rewrites it); Python's bytecode cache
keys a ``.pyc`` on the source's whole-second mtime and size, so an edit of the same size within the same second
would run the old code.  Model files are therefore always compiled from their source, and no ``.pyc`` is written
beside them.

Triton's stub imports a model file as ``<version>.<file>`` with the version folder and the model folder on
``sys.path``, so a model may ``import helper`` (a file beside it), ``from . import helper`` and ``import model``
(its own file again: Triton's QA models run ``unittest.main("model")``).  :func:`import_source` gives the same:
the module is a submodule of a package whose path is its folder, and ``keep_on_path`` leaves the folders on
``sys.path`` after the import, as the stub does (for a worker process that hosts only this model).
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


def _folder_package(name: str, folder: str) -> ModuleType:
    """An empty package named ``name`` whose submodules are the files of ``folder`` (``from . import x``)."""
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [folder]
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package


def import_source(
    path: Path | str, module_name: str, in_package: bool = False, keep_on_path: bool = False
) -> ModuleType:
    """Run ``path`` as the module ``module_name`` (registered in ``sys.modules``; removed again if it raises),
    with its folder first on ``sys.path`` while it runs, so the file may import files beside it.

    ``in_package``: the module is ``<module_name>.<file stem>``, in a package of its folder (``from . import x``).
    ``keep_on_path``: its folder and the folder above stay on ``sys.path`` (appended) afterwards."""
    location = str(path)
    folder = str(Path(location).parent)
    package = _folder_package(module_name, folder) if in_package else None
    full_name = f"{module_name}.{Path(location).stem}" if in_package else module_name
    loader = _SourceOnlyLoader(full_name, location)
    spec = importlib.util.spec_from_file_location(full_name, location, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full_name] = module
    sys.path.insert(0, folder)
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(full_name, None)
        sys.modules.pop(module_name, None)
        raise
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    if package is not None:
        setattr(package, Path(location).stem, module)
    if keep_on_path:
        for kept in (folder, str(Path(folder).parent)):
            if kept not in sys.path:
                sys.path.append(kept)
    return module

"""Importing ``model.py`` (once per file version) and finding the ``fastoip.Model`` class it holds."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from ...._proto import model_config_pb2 as mc
from ....errors import InvalidArgument
from ....model import Model
from ....model_config import parameter
from ....pyworker.source_import import import_source
from ..describe import describe as _describe
from ..mlserver.runtime import adapter as mlserver_adapter
from ..mlserver.runtime import is_mlmodel, missing_extra_hint

_import_lock = threading.RLock()
_modules: dict[str, tuple[tuple[int, int], ModuleType]] = {}
_generation = itertools.count(1)


def _implementation_module(module_part: str, path: Path, model_name: str, implementation: str) -> ModuleType:
    """``module_part`` as a file beside ``path`` (imported once per file version, as model.py is), else an
    installed module (MLServer resolves it the same way: the settings' folder first on ``sys.path``)."""
    beside = path.parent.joinpath(*module_part.split(".")).with_suffix(".py")
    if beside.is_file():
        return import_model_file(beside, model_name, 0)
    sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(module_part)
    except Exception as exc:
        raise InvalidArgument(
            f"model '{model_name}': implementation '{implementation}': cannot import "
            f"'{module_part}': {_describe(exc)}{missing_extra_hint(exc)}"
        ) from exc
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:
            pass


def import_model_file(path: Path, model_name: str, version: int) -> ModuleType:
    key = str(path.resolve())
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _import_lock:
        cached = _modules.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        safe = re.sub(r"\W", "_", model_name)
        module_name = f"_fastoip_model_{safe}_v{version}_{next(_generation)}"
        try:
            module = import_source(path, module_name)
        except BaseException as exc:
            raise InvalidArgument(
                f"model '{model_name}': importing {path.name} failed: {_describe(exc)}{missing_extra_hint(exc)}"
            ) from exc
        _modules[key] = (stamp, module)
        return module


def model_class(module: ModuleType | None, path: Path, config: mc.ModelConfig, model_name: str) -> type[Model]:
    """The model's class: ``implementation`` (a class of ``module``, or ``module.Class`` beside ``path``),
    else the one ``fastoip.Model`` subclass ``module`` defines.  An MLServer ``MLModel`` subclass is
    hosted through its adapter (:mod:`..mlserver.runtime`).  ``module`` is None for a model in MLServer's
    layout (``path`` is its model-settings.json), which must name its ``implementation``."""
    implementation = parameter(config, "implementation")
    if implementation:
        module_part, _, class_part = implementation.rpartition(".")
        if module_part and (module is None or module_part != path.stem):
            source = _implementation_module(module_part, path, model_name, implementation)
        elif module is None:
            raise InvalidArgument(
                f"model '{model_name}': implementation '{implementation}' must be 'module.Class' (the module "
                f"beside {path.name}, or an installed one)"
            )
        else:
            source = module
        cls = getattr(source, class_part, None)
        if isinstance(cls, type) and is_mlmodel(cls):
            return mlserver_adapter(cls)
        if not (isinstance(cls, type) and issubclass(cls, Model)):
            raise InvalidArgument(
                f"model '{model_name}': implementation '{implementation}' is not a fastoip.Model subclass "
                "(nor an MLServer MLModel subclass)"
            )
        return cls
    if module is None:
        raise InvalidArgument(
            f"model '{model_name}': {path.name} names no 'implementation' and no version folder holds model.py"
        )
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Model)
        and value is not Model
        and value.__module__ == module.__name__
    ]
    # A base class defined next to its subclass is not a candidate: the most derived class wins.
    found = [c for c in found if not any(other is not c and issubclass(other, c) for other in found)]
    if len(found) == 1:
        return found[0]
    if not found:
        hint = ""
        if "TritonPythonModel" in vars(module):
            hint = " (a Triton model is served when model.py defines it as 'class TritonPythonModel' at top level)"
        raise InvalidArgument(f"model '{model_name}': {path} defines no fastoip.Model subclass{hint}")
    names = ", ".join(sorted(c.__name__ for c in found))
    raise InvalidArgument(
        f"model '{model_name}': {path} defines several fastoip.Model subclasses ({names}); "
        'say which with parameters { key: "implementation" value { string_value: "ClassName" } }'
    )

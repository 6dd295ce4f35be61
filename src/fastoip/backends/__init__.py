"""Backends execute a model on already-validated, already-batched inputs.

A backend kind is a module with a ``KIND`` object (see :class:`BackendKind`):
its name as written in ``config.pbtxt`` (``backend: "..."``), the platforms
that mean it, the default model file name, and ``load`` which builds the
instances of one model version and completes its config.  The repository
picks the kind from the config, or from the files when there is no config.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import InvalidArgument
from ..scheduling.contract import Backend, TensorModel

if TYPE_CHECKING:
    from .._proto import model_config_pb2 as mc
    from ..options import RepositoryOptions


class BackendKind(Protocol):
    name: str
    platforms: tuple[str, ...]
    default_filename: str

    def load(
        self, model_name: str, version: int, path: Path, base: mc.ModelConfig, options: RepositoryOptions
    ) -> tuple[mc.ModelConfig, Sequence[Backend | TensorModel]]:
        """Build every instance of one version; return the completed config and the instances.

        Instances are :class:`~fastoip.scheduling.contract.TensorModel` (the
        scheduler gets them through the merge/split adapter) or whole
        :class:`~fastoip.scheduling.contract.Backend` s (see that module).
        """


#: backend name -> module that defines ``KIND``.
MODULES = {
    "onnxruntime": "fastoip.backends.onnx",
    "python": "fastoip.backends.python",
}


def kind_named(name: str) -> BackendKind:
    module = MODULES.get(name)
    if module is None:
        raise InvalidArgument(f"backend '{name}' is not supported (supported: {', '.join(sorted(MODULES))})")
    return importlib.import_module(module).KIND


def kind_for(config: mc.ModelConfig, model_dir: Path, name: str = "") -> BackendKind:
    """The backend a model uses: from its config, else from the files in its version folders.

    As Triton: a ``runtime`` naming a library is looked for in the model's folders
    first; a platform no backend knows, with a model file a backend recognises,
    is a mismatched platform/backend pair; a known backend with another
    backend's platform likewise.
    """
    if config.runtime:
        _check_runtime(config, model_dir, name or config.name)
    if config.backend:
        kind = kind_named(config.backend)
        if config.platform and kind.platforms and config.platform not in kind.platforms:
            raise _pair_error(config.platform, kind.name)
        return kind
    from_files = _kind_from_files(config, model_dir)
    if config.platform:
        for backend in MODULES:
            kind = kind_named(backend)
            if config.platform in kind.platforms:
                return kind
        if from_files is not None:
            raise _pair_error(config.platform, from_files.name)
        raise InvalidArgument(f"platform '{config.platform}' is not supported")
    if from_files is not None:
        return from_files
    if config.default_model_filename:
        return kind_named("onnxruntime")
    return _kind_from_name(name or config.name)


class UndeterminedBackend(InvalidArgument):
    """Nothing says which backend a model uses (no backend, platform, model file or ``model.<backend>`` name)."""


def _kind_from_name(name: str) -> BackendKind:
    """Triton's last resort: a model named ``<model>.<backend>`` uses that backend."""
    if "." not in name:
        raise UndeterminedBackend(
            f"Invalid model name: Could not determine backend for model '{name}' with no backend in model "
            "configuration. Expected model name of the form 'model.<backend_name>'."
        )
    backend = name.split(".", 1)[1]
    if backend not in MODULES:
        raise InvalidArgument(
            f"unable to find backend library for backend '{backend}', try specifying runtime on the model "
            f"configuration. (fastoip's backends: {', '.join(sorted(MODULES))})"
        )
    return kind_named(backend)


def _kind_from_files(config: mc.ModelConfig, model_dir: Path) -> BackendKind | None:
    for name in MODULES:
        kind = kind_named(name)
        filename = config.default_model_filename or kind.default_filename
        if any((p / filename).is_file() for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            return kind
    return None


def _pair_error(platform: str, backend: str) -> InvalidArgument:
    # Triton's wording (model_config_utils.cc, ValidateModelConfig).
    return InvalidArgument(f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}")


#: ``runtime`` values that name fastoip's own backends (Triton's library names for them).
OWN_RUNTIMES = frozenset({"libtriton_onnxruntime.so", "libtriton_python.so", "model.py"})


def _check_runtime(config: mc.ModelConfig, model_dir: Path, name: str) -> None:
    """A ``runtime`` naming some other library: Triton's errors when it is missing or leaves its folder.

    Triton looks for the library in the version folder, the model folder and
    its backend folders; fastoip has no backend folders and loads no C++
    backend library, so one found in a model folder is refused too.  A name
    that leads out of the folder is refused without looking whether it exists
    (a model loaded through the API must not learn what the server's disk holds).
    """
    runtime = config.runtime
    if runtime in OWN_RUNTIMES:
        return
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: p.name)
    search = [*versions, model_dir]
    shown = [f"{name}/{folder.name}" for folder in versions] + [name]
    for folder, where in zip(search, shown, strict=True):
        candidate = folder / runtime
        if not candidate.resolve().is_relative_to(folder.resolve()):
            raise InvalidArgument(
                f"backend library name '{runtime}' escapes backend directory '{where}', for model "
                f"'{name}', check model config runtime field"
            )
        if candidate.is_file():
            raise InvalidArgument(
                f"backend library '{runtime}' for model '{name}' is a C++ backend library; fastoip loads "
                f"none (runtime may name {', '.join(sorted(OWN_RUNTIMES))})"
            )
    searched = " ".join(f"'{where}'" for where in shown)
    raise InvalidArgument(f"unable to find backend library '{runtime}' for model '{name}', searched: {searched}")

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


def kind_for(config: mc.ModelConfig, model_dir: Path) -> BackendKind:
    """The backend a model uses: from its config, else from the files in its version folders."""
    if config.backend:
        return kind_named(config.backend)
    if config.platform:
        for name in MODULES:
            kind = kind_named(name)
            if config.platform in kind.platforms:
                return kind
        raise InvalidArgument(f"platform '{config.platform}' is not supported")
    for name in MODULES:
        kind = kind_named(name)
        filename = config.default_model_filename or kind.default_filename
        if any((p / filename).is_file() for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            return kind
    return kind_named("onnxruntime")

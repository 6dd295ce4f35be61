"""The Triton-style model repository: scan, versions, config, load and unload."""

from ..options import RepositoryOptions
from .repository import ModelRepository, ModelState

__all__ = ["ModelRepository", "ModelState", "RepositoryOptions"]

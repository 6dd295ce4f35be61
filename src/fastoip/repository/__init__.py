"""The Triton-style model repository: scan, versions, config, load and unload."""

from .repository import ModelRepository, ModelState, RepositoryOptions

__all__ = ["ModelRepository", "ModelState", "RepositoryOptions"]

"""MLServer's ``model-settings.json``, validated by a schema (pydantic), and where such files live.

Rules:
- The schema is MLServer's ``ModelSettings`` (mlserver 1.7): ``name``, ``platform``, ``versions``,
  ``inputs``/``outputs`` (``name``, ``datatype``, ``shape``, ``parameters``), ``parallel_workers``,
  ``warm_workers``, ``max_batch_size``, ``max_batch_time``, ``implementation``, ``parameters`` (``uri``,
  ``version``, ``environment_path``, ``environment_tarball``, ``inference_pool_gid``,
  ``autogenerate_inference_pool_gid``, ``format``, ``content_type``, ``extra``, and any other key, as
  MLServer allows), ``cache_enabled``.  A wrong type or an unknown top-level or tensor key is a load
  error naming the key (MLServer ignores unknown keys silently; a typo then costs a model).
- Layouts (MLServer's ``mlserver start <folder>``): a ``model-settings.json`` at the repository root is one
  model, and every folder below the root that holds one is a model, found recursively (links not
  followed, hidden folders skipped).  The model's name is the file's ``name``, else its folder's name.
  A folder directly under the root keeps its Triton meaning (its name is the model's) unless its file's
  ``name`` is another (MLServer: the file's name wins; a folder with a config.pbtxt is always Triton's).
  The root is read as an absolute path (MLServer's ``abspath``): ``.`` is the folder the server was started
  in, and a file there without a ``name`` is named after that folder, as MLServer names it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidArgument

log = logging.getLogger("fastoip.repository")

MODEL_SETTINGS = "model-settings.json"
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class TensorParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    content_type: str | None = None
    headers: dict[str, Any] | None = None


class MetadataTensor(_Strict):
    name: str
    datatype: str
    shape: list[int]
    parameters: TensorParameters | None = None


class ModelParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    uri: str | None = None
    version: str | None = None
    environment_path: str | None = None
    environment_tarball: str | None = None
    inference_pool_gid: str | None = None
    autogenerate_inference_pool_gid: bool = False
    format: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] | None = Field(default_factory=dict)


class ModelSettingsDocument(_Strict):
    """One ``model-settings.json`` as MLServer 1.7 reads it, unknown keys refused."""

    name: str = ""
    platform: str = ""
    versions: list[str] = Field(default_factory=list)
    inputs: list[MetadataTensor] = Field(default_factory=list)
    outputs: list[MetadataTensor] = Field(default_factory=list)
    parallel_workers: int | None = Field(default=None, ge=0)
    warm_workers: bool = False
    max_batch_size: int = Field(default=0, ge=0)
    max_batch_time: float = Field(default=0.0, ge=0)
    implementation: str | None = None
    parameters: ModelParameters | None = None
    cache_enabled: bool = False


def parse_model_settings(path: Path, model_name: str = "") -> ModelSettingsDocument:
    """``path`` validated; InvalidArgument naming the model, the file and the key otherwise."""
    who = f"model '{model_name}': " if model_name else ""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{who}{MODEL_SETTINGS}: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{who}{MODEL_SETTINGS}: expected a JSON object")
    try:
        settings = ModelSettingsDocument.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"'{'.'.join(str(part) for part in error['loc'])}': "
            + ("unknown key" if error["type"] == "extra_forbidden" else error["msg"])
            for error in exc.errors()
        )
        raise InvalidArgument(f"{who}{MODEL_SETTINGS} is not valid: {problems}") from None
    for kind, tensors in (("input", settings.inputs), ("output", settings.outputs)):
        for tensor in tensors:
            if tensor.datatype not in DATATYPES:
                raise InvalidArgument(
                    f"{who}{MODEL_SETTINGS}: {kind} '{tensor.name}': unknown datatype '{tensor.datatype}'"
                )
    return settings


def find_model_settings(root: Path) -> dict[str, Path]:
    """MLServer-layout models below ``root`` that are not Triton model folders: name -> the settings' folder.

    A settings file directly in a folder under the root is left to the Triton layout (that folder is the model)
    unless it names another model, which is then its name, as in MLServer.
    """
    found: dict[str, Path] = {}
    if not root.is_dir():
        return found
    # Walked as an absolute path, as MLServer's ``abspath``: a root of "." or "models/.." has a folder name (the
    # default model name) and a parent; each folder found is given back below ``root`` as the caller spelled it.
    absolute = Path(os.path.abspath(root))
    for folder, dirs, files in os.walk(absolute):  # links are not followed: a cycle cannot trap the scan
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(folder)
        top = here != absolute and here.parent == absolute  # a folder directly under the root
        if MODEL_SETTINGS not in files or (top and "config.pbtxt" in files):
            continue
        try:
            named = parse_model_settings(here / MODEL_SETTINGS).name
        except InvalidArgument:
            named = ""  # the load reports what is wrong with it
        if top and named in ("", here.name):
            continue  # Triton's layout: the folder is the model, by its name
        name = named or here.name  # MLServer: the file's name, else its folder's
        if not name or name.startswith("."):
            log.error("%s in %s needs a 'name' (its folder's name cannot be a model's)", MODEL_SETTINGS, here)
            continue
        here = root / here.relative_to(absolute)
        if name in found:
            log.error("two folders hold a model named '%s'; serving the first (%s)", name, found[name])
            continue
        found[name] = here
    return found

"""The model repository: ``<root>/<model>/<version>/model.onnx`` + optional ``config.pbtxt``.

Rules:
- A model is a directory; its versions are the numeric subdirectories that
  hold the model file.  ``version_policy`` picks which versions are served
  (default: the newest one).  An empty requested version means the newest
  ready version.
- Loading builds complete new LoadedModel objects and then swaps them in
  with one assignment: requests never see a half-loaded model, and a reload
  keeps serving the old versions until the new ones are ready.  A failed load
  keeps whatever was serving and records the reason.
- A model that fails to load is UNAVAILABLE with its reason; the server still starts.
- The model's config is ``config.pbtxt``, else MLServer's ``model-settings.json``
  (Python models), else what the backend finds in the model file.
- ``load_all`` first lets every backend kind prepare every model (Python
  models' ``@on_deployment`` hooks), so that work runs before any model loads.
- A load may bring its own model files (Triton's ``file:<version>/<name>``
  load parameters, with a ``config``): they are written to a private
  directory that serves as the model's directory until the next load or
  unload, which removes it.
"""

from __future__ import annotations

import enum
import logging
import shutil
import tempfile
import threading
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .._proto import model_config_pb2 as mc
from ..errors import InferenceError, InvalidArgument, NotFound, Unavailable
from ..options import RepositoryOptions
from ..backends import BackendKind, kind_for
from .config import MODEL_SETTINGS, read_config_file, read_model_settings
from .loaded import LoadedModel

log = logging.getLogger("fastoip.repository")


class ModelState(str, enum.Enum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


@dataclass
class ModelRecord:
    """Everything the repository knows about one model name."""

    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[int, LoadedModel] = field(default_factory=dict)
    #: Highest version first: what an empty requested version resolves to.
    newest: Optional[LoadedModel] = None
    #: The private directory of files that came with the last load, if they did.
    uploaded_dir: Optional[Path] = None


class ModelRepository:
    """Loads models from a directory and hands out the loaded versions."""

    def __init__(self, root: Path, executor: Executor, options: Optional[RepositoryOptions] = None) -> None:
        self.root = Path(root)
        self.executor = executor
        self.options = options or RepositoryOptions()
        self._records: dict[str, ModelRecord] = {}
        self._load_lock = threading.Lock()

    # -- discovery --------------------------------------------------------
    def model_names(self) -> list[str]:
        """Model directories in the repository, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    # -- lookups on the infer path --------------------------------------------
    def get(self, name: str, version: str = "") -> LoadedModel:
        """The loaded version to serve; NotFound / Unavailable with a reason otherwise."""
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if not version:
            model = record.newest
            if model is None:
                raise Unavailable(
                    f"Request for unknown model: '{name}' has no available versions"
                    + (f" ({record.reason})" if record.reason else "")
                )
            return model
        try:
            number = int(version)
        except ValueError:
            raise InvalidArgument(f"model '{name}': version '{version}' is not a number") from None
        model = record.versions.get(number)
        if model is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return model

    def record(self, name: str) -> Optional[ModelRecord]:
        return self._records.get(name)

    def records(self) -> list[ModelRecord]:
        return [self._records[name] for name in sorted(self._records)]

    def all_ready(self) -> bool:
        """Every model the repository tried to load is ready (Triton's strict readiness)."""
        return all(
            r.state == ModelState.READY and all(m.is_ready() for m in r.versions.values())
            for r in self._records.values()
        )

    def all_alive(self) -> bool:
        return all(m.is_alive() for r in self._records.values() for m in r.versions.values())

    # -- load / unload ------------------------------------------------------------
    def load_all(self) -> None:
        names = self.model_names()
        self._prepare(names)
        for name in names:
            try:
                self.load(name)
            except InferenceError as exc:
                log.error("model '%s' failed to load: %s", name, exc)

    def load(
        self,
        name: str,
        config_override: Optional[mc.ModelConfig] = None,
        files: Optional[dict[str, bytes]] = None,
    ) -> None:
        """Load (or reload) every version the policy selects; swap in when all are ready.

        ``files``: relative path -> content of the model directory to load instead of
        the repository's (needs ``config_override``).
        """
        with self._load_lock:
            uploaded = _write_uploaded_files(name, files) if files else None
            try:
                self._load_locked(name, config_override, uploaded)
            except BaseException:
                if uploaded is not None:
                    shutil.rmtree(uploaded, ignore_errors=True)
                raise

    def _load_locked(self, name: str, config_override: Optional[mc.ModelConfig], uploaded: Optional[Path]) -> None:
        model_dir = uploaded or self.root / name
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = ModelRecord(name)
        if not model_dir.is_dir():
            record.reason = f"model directory '{model_dir}' does not exist"
            if not record.versions:
                record.state = ModelState.UNAVAILABLE
            raise NotFound(f"failed to load '{name}': {record.reason}")
        previous_state = record.state
        if not record.versions:
            record.state = ModelState.LOADING
        try:
            loaded = self._load_versions(name, model_dir, config_override)
        except InferenceError as exc:
            record.reason = str(exc)
            record.state = previous_state if record.versions else ModelState.UNAVAILABLE
            raise
        except Exception as exc:  # a bug or an unexpected backend error: still keep serving
            record.reason = f"{type(exc).__name__}: {exc}"
            record.state = previous_state if record.versions else ModelState.UNAVAILABLE
            raise InvalidArgument(f"failed to load '{name}': {record.reason}") from exc
        old = record.versions
        record.versions = loaded
        record.newest = loaded[max(loaded)]
        record.state = ModelState.READY
        record.reason = ""
        for version, model in old.items():
            if loaded.get(version) is not model:
                self._retire(model)
        self._forget_uploaded(record)
        record.uploaded_dir = uploaded
        log.info("model '%s' ready, versions %s", name, sorted(loaded))

    def unload(self, name: str) -> None:
        """Stop serving ``name``; requests in flight finish first."""
        with self._load_lock:
            record = self._records.get(name)
            if record is None:
                raise NotFound(f"failed to unload '{name}': model is not known")
            old = record.versions
            record.versions = {}
            record.newest = None
            record.state = ModelState.UNAVAILABLE
            record.reason = "unloaded"
            for model in old.values():
                self._retire(model)
            self._forget_uploaded(record)

    def close(self) -> None:
        for name in list(self._records):
            record = self._records[name]
            for model in record.versions.values():
                self._retire(model)
            record.versions = {}
            record.newest = None
            record.state = ModelState.UNAVAILABLE
            self._forget_uploaded(record)

    def _retire(self, model: LoadedModel) -> None:
        model.close()

    @staticmethod
    def _forget_uploaded(record: ModelRecord) -> None:
        if record.uploaded_dir is not None:
            shutil.rmtree(record.uploaded_dir, ignore_errors=True)
            record.uploaded_dir = None

    def _prepare(self, names: list[str]) -> None:
        """Once-per-server backend work before any model loads (Python models' ``@on_deployment`` hooks).

        Failures are only logged here: the model's own load reports them.
        """
        for name in names:
            try:
                base, kind, paths = self._plan(name, self.root / name, None)
                prepare = getattr(kind, "prepare", None)
                if prepare is not None:
                    prepare(name, [path for _, path in paths], base, self.options)
            except Exception as exc:
                log.debug("model '%s': preparing failed: %s", name, exc)

    # -- building versions ---------------------------------------------------------
    def _plan(
        self, name: str, model_dir: Path, config_override: Optional[mc.ModelConfig]
    ) -> tuple[mc.ModelConfig, BackendKind, list[tuple[int, Path]]]:
        """The base config, the backend kind and the (version, model file) pairs to load."""
        if config_override is not None:
            base = config_override
        elif (model_dir / "config.pbtxt").is_file():
            base = read_config_file(model_dir / "config.pbtxt")
        elif (model_dir / MODEL_SETTINGS).is_file():
            base = read_model_settings(model_dir / MODEL_SETTINGS, name)
        else:
            base = mc.ModelConfig()
        kind = kind_for(base, model_dir)
        filename = base.default_model_filename or kind.default_filename
        available = sorted(
            int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and (p / filename).is_file()
        )
        if not available:
            raise Unavailable(f"model '{name}': no version directory holds '{filename}'")
        selected = _select_versions(base, available, name)
        return base, kind, [(version, model_dir / str(version) / filename) for version in selected]

    def _load_versions(
        self, name: str, model_dir: Path, config_override: Optional[mc.ModelConfig]
    ) -> dict[int, LoadedModel]:
        base, kind, paths = self._plan(name, model_dir, config_override)
        loaded: dict[int, LoadedModel] = {}
        try:
            for version, path in paths:
                loaded[version] = self._load_version(name, version, path, base, kind)
        except BaseException:
            for model in loaded.values():  # versions built before the failure release their instances
                model.close()
            raise
        return loaded

    def _load_version(
        self, name: str, version: int, path: Path, base: mc.ModelConfig, kind: BackendKind
    ) -> LoadedModel:
        options = self.options
        config, backends = kind.load(name, version, path, base, options)
        if (
            options.default_batching is not None
            and config.max_batch_size > 0
            and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
            for key, value in options.default_batching.items():
                setattr(config.dynamic_batching, key, value)
        return LoadedModel(name, version, path, config, backends, self.executor, _scheduler_for(config))


def _write_uploaded_files(name: str, files: dict[str, bytes]) -> Path:
    """Write a load request's model files into a new private directory; refuse paths that leave it."""
    root = Path(tempfile.mkdtemp(prefix=f"fastoip-upload-{name}-"))
    try:
        for relative, content in files.items():
            parts = Path(relative).parts
            if not parts or Path(relative).is_absolute() or any(part in ("..", ".") for part in parts):
                raise InvalidArgument(
                    f"load '{name}': model file 'file:{relative}' must be a relative path inside the model directory"
                )
            target = root.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _scheduler_for(config: mc.ModelConfig):  # type: ignore[no-untyped-def]
    if config.HasField("dynamic_batching"):
        from ..scheduling.batcher import DynamicBatcher

        return DynamicBatcher
    from ..scheduling.direct import DirectScheduler

    return DirectScheduler


def _select_versions(config: mc.ModelConfig, available: list[int], name: str) -> list[int]:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if choice == "all":
        return available
    if choice == "specific":
        wanted = list(policy.specific.versions)
        missing = [v for v in wanted if v not in available]
        if missing:
            raise Unavailable(f"model '{name}': version_policy asks for versions {missing}, which do not exist")
        return sorted(wanted)
    count = policy.latest.num_versions if choice == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]

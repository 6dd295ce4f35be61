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
- One load operation at a time (the load lock: a load, an unload, start-up's
  or a poll's set of models), as Triton's repository manager.  Inside one,
  models load on ``load_threads`` threads (Triton's ``--model-load-thread-count``,
  default 4) and each model's versions side by side; ensembles load after the
  other models of the set, one at a time (their steps must be there first).
- A load may bring its own model files (Triton's ``file:<version>/<name>``
  load parameters, with a ``config``): they are written to a private
  directory that serves as the model's directory until the next load or
  unload, which removes it.
- What a client can ask for through the load API stays inside what the operator
  allows: model names are names, uploaded files and configured file names stay
  inside the model's directory (``paths``), and Python code a client brings
  (uploaded ``.py`` files, a Python model made of uploaded files) loads through
  the API only with ``allow_code_loads`` (``--model-control-allow-code``).  A
  Python model the operator put in the repository loads through the API as
  Triton loads it (its code is the operator's, not the client's).  Loads the
  operator asks for (start-up, ``--load-model``, polling) are not limited.
- Every name that becomes a path under the root (a load, an unload, an ensemble
  step's model, a config override's steps) goes through ``_model_dir``, which
  refuses anything but a plain name; a model an ensemble brings with it loads
  under the same rules as the ensemble (the code guard included).
"""

from __future__ import annotations

import enum
import logging
import shutil
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, cast

from .._proto import model_config_pb2 as mc
from ..backends import BackendKind, UndeterminedBackend, kind_for
from ..errors import Cancelled, InferenceError, InternalError, InvalidArgument, NotFound, Unavailable
from ..metrics import MetricsConfig
from ..model_config import (
    MODEL_SETTINGS,
    is_model_settings_config,
    named_copy,
    parameter,
    read_config_file,
    read_model_settings,
)
from ..model_settings import find_model_settings
from ..options import RepositoryOptions
from ..scheduling.contract import Backend, ExecutionContext, SchedulerFactory
from .defaults import fill_batching_defaults, fill_defaults
from .ensemble import ENSEMBLE_KIND, ComposingModel, EnsembleModel, composing_model_of, is_ensemble, plan_ensemble
from .layout import missing_version_hint
from .loaded import LoadedModel
from .paths import check_file_name, check_inside, check_model_name, check_python_model_name, upload_parts
from .runner import RequestRunner
from .sections import log_ignored_hints, log_ignored_model_settings, refuse_unbuilt_sections
from .validation import validate_config
from .warmup import check_client_warmup, run_warmup

log = logging.getLogger("fastoip.repository")


class RepositorySource(Protocol):
    """What ``root`` is a copy of: :meth:`sync` brings the copy up to date (``remote.RemoteRepository``)."""

    def sync(self) -> bool: ...


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
    newest: LoadedModel | None = None
    #: The private directory of files that came with the last load, if they did.
    uploaded_dir: Path | None = None
    #: Unavailable because it was unloaded on purpose: strict readiness ignores it.
    unloaded: bool = False


class ModelRepository:
    """Loads models from one or more directories (Triton's repeated --model-repository) and hands out the
    loaded versions.  A model is found in the first directory that has it."""

    def __init__(
        self,
        root: Path | Sequence[Path],
        executor: Executor,
        options: RepositoryOptions | None = None,
        metrics_config: MetricsConfig | None = None,
    ) -> None:
        self.roots = [Path(root)] if isinstance(root, (str, Path)) else [Path(r) for r in root]
        if not self.roots:
            raise ValueError("a model repository needs at least one directory")
        self.root = self.roots[0]
        #: Which latency metrics every version's counters keep (the server's ``--metrics-config``).
        self.metrics_config = metrics_config or MetricsConfig()
        self.executor = executor
        self.options = options or RepositoryOptions()
        self._records: dict[str, ModelRecord] = {}
        #: Set when the server shuts down: a load in progress stops at its next step (issue 37).
        self.stopping = threading.Event()
        #: Set when the client of the load operation in progress went away (its event; issue 37): the load stops
        #: at its next step.  One load operation at a time (the load lock), so one event.
        self._client_gone: threading.Event | None = None
        #: Each model's ``newest`` version, as the records have it (``_set_newest``): the request runner's
        #: look-up of a request that names no version, one dict read in compiled code.
        self._newest: dict[str, LoadedModel] = {}
        self._load_lock = threading.Lock()
        #: Ensembles whose steps are being loaded (outermost first): a step naming one of them is a cycle.
        self._ensembles_loading: list[str] = []
        #: How requests run on the models here (the data plane's and ensemble steps' one path).
        self.runner = RequestRunner(self.get, self._newest)
        #: MLServer-layout models found by the last scan (:meth:`model_names`): name -> folder.
        self._settings_dirs: dict[str, Path] = {}
        #: Where ``root`` is copied from (an object-storage repository: ``remote.RemoteRepository``), or None.
        self.source: RepositorySource | None = None

    # -- discovery --------------------------------------------------------
    def model_names(self) -> list[str]:
        """Models in the repositories, sorted (a name in several: once, the first one's): their directories
        (Triton's layout) and the folders holding a ``model-settings.json`` deeper down or at a root (MLServer's
        layouts, :mod:`.model_settings`)."""
        names: set[str] = set()
        settings_dirs: dict[str, Path] = {}
        for root in self.roots:
            if not root.is_dir():
                continue
            found = find_model_settings(root)
            for name, folder in found.items():
                settings_dirs.setdefault(name, folder)
            containers = {folder.relative_to(root).parts[0] for folder in found.values() if folder != root}
            names |= {
                p.name
                for p in root.iterdir()
                if p.is_dir()
                and not p.name.startswith(".")
                and (p.name not in containers or (p / "config.pbtxt").is_file()
                     or ((p / MODEL_SETTINGS).is_file() and p not in found.values()))  # not named otherwise
            }
            names |= set(found)
        self._settings_dirs = settings_dirs
        return sorted(names)

    def model_dir(self, name: str) -> Path:
        """The folder of model ``name``: ``<root>/<name>`` in the first repository that has it, or where its
        model-settings.json was found."""
        for root in self.roots:
            if (root / name).is_dir():
                return root / name
        found = self._settings_dirs.get(name)
        if found is None:  # not seen by the last scan (none yet, in explicit mode): look again
            self.model_names()
            found = self._settings_dirs.get(name)
        if found is not None:
            return found
        return self.root / name

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
            # MLServer's version labels ("v0.1.0"): a version is named by its label (LoadedModel.version_str)
            for model in record.versions.values():
                if model.version_str == version:
                    return model
            if any(m.version_str != str(v) for v, m in record.versions.items()):
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found") from None
            raise InvalidArgument(f"model '{name}': version '{version}' is not a number") from None
        model = record.versions.get(number)
        if model is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return model

    def record(self, name: str) -> ModelRecord | None:
        return self._records.get(name)

    def records(self) -> list[ModelRecord]:
        return [self._records[name] for name in sorted(self._records)]

    def all_ready(self) -> bool:
        """Every model the repository tried to load is ready (Triton's strict readiness).

        A model that is unavailable because it was unloaded does not count, as in Triton's ``IsReady``.
        """
        # Snapshots (list() runs under the GIL): a load on another thread may add records or versions meanwhile.
        return all(
            r.state == ModelState.READY and all(m.is_ready() for m in list(r.versions.values()))
            for r in list(self._records.values())
            if not r.unloaded
        )

    def all_alive(self) -> bool:
        return all(m.is_alive() for r in list(self._records.values()) for m in list(r.versions.values()))

    # -- load / unload ------------------------------------------------------------
    def load_all(self) -> None:
        names = self.model_names()
        self._prepare(names)
        self.load_many(names)

    def load_many(self, names: Sequence[str], what: str = "") -> None:
        """Load (or reload) ``names`` as one load operation; a model that fails is logged (``what`` prefixes the
        line, e.g. ``"poll: "``) and the others load.

        The plain models load on ``options.load_threads`` threads, then the ensembles one at a time (their
        steps' models must be loaded to check the wiring), all under the load lock.
        """
        ensembles = sorted(name for name in names if _is_plain_name(name) and self._is_ensemble_dir(name))
        plain = sorted(name for name in names if name not in ensembles)

        def load_one(name: str) -> None:
            try:
                self._model_dir(name)
                if not self.model_dir(name).is_dir():
                    raise NotFound(f"failed to load '{name}', failed to poll from model repository: no model directory")
                self._load_locked(name, None, None, False)
            except InferenceError as exc:
                # the reason without Triton's "failed to load '<name>': " again: the fix leads the line
                reason = str(exc).removeprefix(f"failed to load '{name}': ")
                log.error("%smodel '%s' failed to load: %s", what, name, reason)

        threads = min(max(1, self.options.load_threads), len(plain))
        with self._load_lock:
            if threads > 1:
                with ThreadPoolExecutor(threads, thread_name_prefix="fastoip-load") as pool:
                    list(pool.map(load_one, plain))
            else:
                for name in plain:
                    load_one(name)
            for name in ensembles:
                load_one(name)

    def load(
        self,
        name: str,
        config_override: mc.ModelConfig | None = None,
        files: dict[str, bytes] | None = None,
        from_client: bool = False,
        client_gone: threading.Event | None = None,
    ) -> None:
        """Load (or reload) every version the policy selects; swap in when all are ready.

        ``files``: relative path -> content of the model directory to load instead of
        the repository's (needs ``config_override``).  ``from_client``: the load API
        asked for it, so only what the operator allows is loaded.  ``client_gone``: set
        when the load's client disconnects or cancels (its deadline passed): the load
        stops at its next step (waiting for the load lock, between instances, between
        warmup runs), CANCELLED, and what was serving stays as it was.
        """
        if config_override is not None and config_override.backend == "python":
            check_python_model_name(name)  # (before the other checks: Triton's answer)
        model_dir = self._model_dir(name)
        if from_client and not self.options.allow_code_loads and files:
            code = sorted(path for path in files if path.endswith(".py"))
            if code:
                raise InvalidArgument(
                    # (Triton's "failed to load" first: its model_control test reads it for a refused upload)
                    f"failed to load '{name}': model file 'file:{code[0]}' is Python code, and this server does not "
                    "load code through the API (the operator can allow it with --model-control-allow-code)"
                )
        with self._load_lock:
            self._client_gone = client_gone
            try:
                self._load_one(name, model_dir, config_override, files, from_client)
            finally:
                self._client_gone = None

    def _load_one(
        self, name: str, model_dir: Path, config_override: mc.ModelConfig | None, files: dict[str, bytes] | None,
        from_client: bool,
    ) -> None:
        """:meth:`load`'s work, under the load lock."""
        self.check_stop()  # (the client may have left while the lock was held by another load)
        uploaded = _write_uploaded_files(name, files) if files else None
        if uploaded is None and not model_dir.is_dir():
            # Nothing to load: answer the error and leave no record behind (readiness, index).
            raise NotFound(f"failed to load '{name}', failed to poll from model repository: no model directory")
        try:
            self._load_locked(name, config_override, uploaded, from_client)
        except InferenceError as exc:
            if uploaded is not None:
                shutil.rmtree(uploaded, ignore_errors=True)
            if from_client and not isinstance(exc, NotFound):
                # Triton's API answer for a model whose load failed comes first (its QA matches it)
                raise type(exc)(f"load failed for model '{name}': {exc.message}") from None
            raise
        except BaseException:
            if uploaded is not None:
                shutil.rmtree(uploaded, ignore_errors=True)
            raise

    def _load_locked(
        self, name: str, config_override: mc.ModelConfig | None, uploaded: Path | None, from_client: bool
    ) -> None:
        model_dir = uploaded or self._model_dir(name)
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = ModelRecord(name)
        record.unloaded = False  # a load that fails now makes the server unready, as in Triton
        if not model_dir.is_dir():
            record.reason = f"the repository has no model directory '{name}'"  # no server paths in messages
            if not record.versions:
                record.state = ModelState.UNAVAILABLE
            raise NotFound(f"failed to load '{name}': {record.reason}")
        previous_state = record.state
        if not record.versions:
            record.state = ModelState.LOADING
        try:
            loaded = self._load_versions(name, model_dir, config_override, from_client)
        except InferenceError as exc:
            record.reason = self._without_paths(str(exc), name, model_dir)
            record.state = previous_state if record.versions else ModelState.UNAVAILABLE
            if record.reason.startswith("failed to load"):
                if record.reason == str(exc):
                    raise
                raise type(exc)(record.reason) from None
            # Triton's words first: clients (and Triton's examples) match on "failed to load".
            raise type(exc)(f"failed to load '{name}': {record.reason}") from None
        except Exception as exc:  # a bug or an unexpected backend error: still keep serving
            record.reason = self._without_paths(f"{type(exc).__name__}: {exc}", name, model_dir)
            record.state = previous_state if record.versions else ModelState.UNAVAILABLE
            raise InvalidArgument(f"failed to load '{name}': {record.reason}") from exc
        old = record.versions
        record.versions = loaded
        self._set_newest(record, loaded[max(loaded)])
        record.state = ModelState.READY
        record.reason = ""
        for version, model in old.items():
            if loaded.get(version) is not model:
                self._retire(model)
        self._forget_uploaded(record)
        record.uploaded_dir = uploaded
        log.info("model '%s' ready, versions [%s]", name, ", ".join(loaded[v].version_str for v in sorted(loaded)))

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop serving ``name``; requests in flight finish first.

        An unknown name is a no-op (Triton).  ``unload_dependents``: an ensemble's composing models are
        unloaded with it, except those another loaded ensemble still uses.
        """
        self._model_dir(name)
        with self._load_lock:
            record = self._records.get(name)
            if record is None:
                log.info("unload '%s': no such model, nothing to do", name)
                return
            steps = self._composing_models(record) if unload_dependents else []
            self._unload_locked(record)
            for step in steps:
                step_record = self._records.get(step)
                if step_record is not None and step_record.versions and not self._used_by_an_ensemble(step):
                    self._unload_locked(step_record)

    def _composing_models(self, record: ModelRecord) -> list[str]:
        if record.newest is None or not is_ensemble(record.newest.config):
            return []
        return list(dict.fromkeys(step.model_name for step in record.newest.config.ensemble_scheduling.step))

    def _used_by_an_ensemble(self, name: str) -> bool:
        return any(name in self._composing_models(other) for other in self._records.values() if other.versions)

    def _unload_locked(self, record: ModelRecord) -> None:
        old = record.versions
        record.versions = {}
        self._set_newest(record, None)
        record.state = ModelState.UNAVAILABLE
        record.reason = "unloaded"
        record.unloaded = True
        for model in old.values():
            self._retire(model)
        self._forget_uploaded(record)

    def close(self) -> None:
        for name in list(self._records):
            record = self._records[name]
            for model in record.versions.values():
                self._retire(model)
            record.versions = {}
            self._set_newest(record, None)
            record.state = ModelState.UNAVAILABLE
            self._forget_uploaded(record)

    def _set_newest(self, record: ModelRecord, model: LoadedModel | None) -> None:
        record.newest = model
        if model is None:
            self._newest.pop(record.name, None)
        else:
            self._newest[record.name] = model

    def _retire(self, model: LoadedModel) -> None:
        model.close()

    @staticmethod
    def _forget_uploaded(record: ModelRecord) -> None:
        if record.uploaded_dir is not None:
            shutil.rmtree(record.uploaded_dir, ignore_errors=True)
            record.uploaded_dir = None

    def _load_step_model(self, name: str, step: mc.ModelEnsembling.Step, from_client: bool = False) -> None:
        """Load a step's model with its ensemble (as Triton does) and check the version the step pins."""
        if step.model_name in self._ensembles_loading:
            chain = self._ensembles_loading[self._ensembles_loading.index(step.model_name):]
            raise InvalidArgument(
                f"circular dependency between ensembles: {step.model_name} -> ... -> {chain[-1]} -> {step.model_name}"
            )
        record = self.record(step.model_name)
        if (record is None or not record.versions) and (self.model_dir(step.model_name)).is_dir():
            try:
                # Triton loads an ensemble's models with it, under the ensemble's rules (the code guard too)
                self._load_locked(step.model_name, None, None, from_client)
            except InferenceError as exc:
                if "circular dependency between ensembles" in exc.message:
                    raise
            record = self.record(step.model_name)
        if record is None and not (self.model_dir(step.model_name)).is_dir():
            return  # not in the repository: the plan says the model is not available
        missing = _step_dependency_error(name, step.model_name, record)
        if missing is not None:
            raise missing
        assert record is not None
        if step.model_version >= 0 and step.model_version not in record.versions:
            raise InvalidArgument(
                f"ensemble '{name}' depends on '{step.model_name}' whose required version {step.model_version} "
                "is not loaded."
            )

    def _prepare(self, names: list[str]) -> None:
        """Once-per-server backend work before any model loads (Python models' ``@on_deployment`` hooks).

        Failures are only logged here: the model's own load reports them.
        """
        for name in names:
            try:
                base, kind, paths = self._plan(name, self.model_dir(name), None)
                prepare = getattr(kind, "prepare", None)
                if prepare is not None:
                    prepare(name, [path for _, path in paths], base, self.options)
            except Exception as exc:
                log.debug("model '%s': preparing failed: %s", name, exc)

    def _without_paths(self, message: str, name: str, model_dir: Path) -> str:
        """A load error as a client may read it: the model's directory (a private upload directory, or the
        repository's) named by the model instead (backends such as ONNX Runtime put file paths in theirs)."""
        for path, shown in ((model_dir, f"<model '{name}'>"), *((root, "<repository>") for root in self.roots)):
            for text in {str(path.resolve()), str(path)}:
                message = message.replace(text, shown)
        return message

    def _model_dir(self, name: str) -> Path:
        """The one place a model name becomes a path: refused unless it is a plain name; under the root, or
        where its model-settings.json was found (MLServer's layouts, :meth:`model_dir`)."""
        check_model_name(name)
        return self.model_dir(name)

    # -- building versions ---------------------------------------------------------
    def _is_ensemble_dir(self, name: str) -> bool:
        path = self.model_dir(name) / "config.pbtxt"
        try:
            return path.is_file() and is_ensemble(read_config_file(path))
        except InferenceError:
            return False

    def _plan(
        self, name: str, model_dir: Path, config_override: mc.ModelConfig | None, from_client: bool = False
    ) -> tuple[mc.ModelConfig, BackendKind, list[tuple[int, Path]]]:
        """The base config, the backend kind and the (version, model file) pairs to load."""
        if config_override is not None:
            base = config_override
        elif (model_dir / "config.pbtxt").is_file():
            base = read_config_file(model_dir / "config.pbtxt")
        elif (model_dir / MODEL_SETTINGS).is_file():
            # MLServer's layouts: the file names the model
            by_name = all(model_dir != root / name for root in self.roots)
            base = read_model_settings(model_dir / MODEL_SETTINGS, name, by_name=by_name)
            log_ignored_model_settings(model_dir / MODEL_SETTINGS, name)
        else:
            base = mc.ModelConfig()
        # Triton's checks on the config as written, before any model file is looked for
        validate_config(base, name, self.options.auto_complete)
        if from_client:
            check_client_warmup(base)  # issue 37: before any session or tensor is built
        if is_ensemble(base):
            refuse_unbuilt_sections(base, name, "ensemble")
            # an ensemble has no model file: each version is a directory (Triton's layout)
            versions = _version_numbers(name, model_dir, None)
            if not versions:
                raise Unavailable(f"model '{name}': an ensemble needs a version directory (e.g. '{name}/1/')")
            selected = _select_versions(base, versions, name)
            paths = [(version, model_dir / str(version)) for version in selected]
            return base, cast(BackendKind, ENSEMBLE_KIND), paths
        if base.default_model_filename:
            check_file_name(name, "default_model_filename", base.default_model_filename)
        try:
            kind = kind_for(base, model_dir, name)
        except UndeterminedBackend as exc:
            hint = missing_version_hint(name, model_dir, "model.onnx")
            # the fix first: Triton's sentence (kept, clients match on it) points at renaming the model
            raise UndeterminedBackend(f"{hint}. ({exc.message})" if hint else exc.message) from None
        refuse_unbuilt_sections(base, name, kind.name)
        if kind.name == "python":
            check_python_model_name(name)
        if kind.name == "python" and base.default_model_filename and not base.default_model_filename.endswith(".py"):
            raise InvalidArgument(  # python_backend's stub imports only a .py file
                f"failed to load '{name}': Model name must end with '.py'. Model name is "
                f'"{base.default_model_filename}".'
            )
        if (from_client and kind.name == "python" and not self.options.allow_code_loads
                and model_dir != self._model_dir(name)):
            # Code a client brought (uploaded files: a private directory) is refused; a Python model the operator
            # put in the repository loads through the API as Triton loads it (COMPATIBILITY.md).
            raise InvalidArgument(
                f"failed to load '{name}': it is a Python model brought by the load's files, and this server does "
                "not load code through the API (the operator can allow it with --model-control-allow-code)"
            )
        if not self.options.auto_complete and kind.name == "onnxruntime" and not (base.input and base.output):
            raise InvalidArgument(
                f"model '{name}': auto-complete is disabled (--strict-model-config / --disable-auto-complete-config), "
                "so config.pbtxt must declare max_batch_size, every input and every output"
            )
        filename = base.default_model_filename or kind.default_filename
        available = _version_numbers(name, model_dir, filename)
        if not available and is_model_settings_config(base) and kind.name == "python":
            # MLServer's layout: no version folders; the implementation sits beside model-settings.json
            return base, kind, [(settings_version(base), model_dir / MODEL_SETTINGS)]
        if not available:
            if kind.name == "python":
                _log_missing_python_file(model_dir, filename)
            hint = missing_version_hint(name, model_dir, filename)
            missing = f"model '{name}': no version directory holds '{filename}'"
            raise Unavailable(f"{hint} ({missing})" if hint else missing)
        selected = _select_versions(base, available, name)
        if from_client:  # issue 37: every selected version builds its own instances
            self._check_instance_count(name, base, len(selected))
        return base, kind, [(version, model_dir / str(version) / filename) for version in selected]

    def _check_instance_count(self, name: str, config: mc.ModelConfig, versions: int) -> None:
        """Refuse a client's load whose instances, over all the versions it selects, pass CLIENT_INSTANCES_MAX,
        or that would take the server's instances (the model's old ones not counted) past SERVER_INSTANCES_MAX."""
        each = sum(max(group.count, 1) * max(len(group.gpus), 1) for group in config.instance_group) or 1
        total = each * versions
        if total > CLIENT_INSTANCES_MAX:
            raise InvalidArgument(
                f"failed to load '{name}': instance_group asks for {each} instances x {versions} versions = {total}; "
                f"a load through the API may ask for at most {CLIENT_INSTANCES_MAX} (the operator's config.pbtxt is "
                "not limited)"
            )
        others = sum(len(model.instances) for record in self._records.values() if record.name != name
                     for model in record.versions.values())
        if others + total > SERVER_INSTANCES_MAX:
            raise Unavailable(
                f"failed to load '{name}': the server runs {others} model instances; {total} more would pass "
                f"{SERVER_INSTANCES_MAX}, the most a load through the API may take it to (unload a model first)"
            )

    def _load_versions(
        self, name: str, model_dir: Path, config_override: mc.ModelConfig | None, from_client: bool = False
    ) -> dict[int, LoadedModel]:
        base, kind, paths = self._plan(name, model_dir, config_override, from_client)
        if from_client:
            for _, path in paths:  # a client's config or files: links must not lead out of the model
                check_inside(name, model_dir, path, "the model file")
        loaded: dict[int, LoadedModel] = {}
        options = self._options_for(name, model_dir)
        threads = min(max(1, self.options.load_threads), len(paths))
        if threads > 1 and kind is not ENSEMBLE_KIND:
            # Triton loads a model's versions side by side; every one must load, or none is kept
            def load_version(entry: tuple[int, Path]) -> LoadedModel:
                return self._load_version(name, entry[0], entry[1], base, kind, from_client, options)

            with ThreadPoolExecutor(threads, thread_name_prefix=f"fastoip-load-{name}") as pool:
                futures = [(version, pool.submit(load_version, (version, path))) for version, path in paths]
            failure: BaseException | None = None
            for version, future in futures:
                error = future.exception()
                if error is None:
                    loaded[version] = future.result()
                elif failure is None:
                    failure = error
            if failure is not None:
                for model in loaded.values():  # the versions that did load release their instances
                    model.close()
                raise failure
            return loaded
        try:
            for version, path in paths:
                loaded[version] = self._load_version(name, version, path, base, kind, from_client, options)
        except BaseException:
            for model in loaded.values():  # versions built before the failure release their instances
                model.close()
            raise
        return loaded

    def check_stop(self) -> None:
        """Raise when the load in progress must stop: Unavailable at shutdown, Cancelled when its client went away
        (issue 37); called between a load's steps (versions, instances, warmup runs)."""
        if self.stopping.is_set():
            raise Unavailable("the server is shutting down")
        gone = self._client_gone
        if gone is not None and gone.is_set():
            raise Cancelled("the load's client went away (disconnected, cancelled, or its deadline passed)")

    def _options_for(self, name: str, model_dir: Path) -> RepositoryOptions:
        """The options one load runs under: its ONNX graphs bounded when ``onnx_max_tensor_bytes_for`` names them
        (``uploaded``: the load brought its files, a private directory; ``all``; ``none``)."""
        bound_for = self.options.onnx_max_tensor_bytes_for
        uploaded = model_dir != self.model_dir(name)
        bounded = bound_for == "all" or (bound_for == "uploaded" and uploaded)
        return replace(self.options, bound_onnx_graph=bounded, check_stop=self.check_stop)

    def _load_version(
        self, name: str, version: int, path: Path, base: mc.ModelConfig, kind: BackendKind, from_client: bool,
        options: RepositoryOptions,
    ) -> LoadedModel:
        if kind is ENSEMBLE_KIND:
            return self._load_ensemble(name, version, path, base, from_client)
        self.check_stop()
        config, backends = kind.load(name, version, path, base, options)
        log_ignored_hints(config, name, onnx=kind.name == "onnxruntime")
        fill_defaults(config, kind.default_filename)  # what Triton's config API shows
        # Triton's onnxruntime auto-complete gives a model that batches (> 1) a dynamic batcher; it does not run
        # when the config lists both inputs (batch inputs count) and outputs.
        listed_io = bool(base.input or base.batch_input) and bool(base.output)
        auto_batcher = (options.auto_complete and kind.name == "onnxruntime" and config.max_batch_size > 1
                        and not listed_io)
        if (
            (options.default_batching is not None or auto_batcher)
            and config.max_batch_size > 0
            and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
            for key, value in (options.default_batching or {}).items():
                setattr(config.dynamic_batching, key, value)
        fill_batching_defaults(config)  # what Triton's config API shows
        model = LoadedModel(
            name, version, path, config, backends, self.executor, _scheduler_for(config, path.parent.parent),
            metrics_config=_model_metrics_config(self.metrics_config, config),
        )
        if config.model_warmup:
            try:
                run_warmup(model, config, path.parent.parent, check_stop=self.check_stop)
            except BaseException:
                model.close()
                raise
            model.stats.clear()
        return model

    def _load_ensemble(
        self, name: str, version: int, path: Path, base: mc.ModelConfig, from_client: bool
    ) -> LoadedModel:
        config = named_copy(base, name)
        fill_defaults(config)
        self._ensembles_loading.append(name)
        try:
            for index, step in enumerate(config.ensemble_scheduling.step):
                try:
                    self._model_dir(step.model_name)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"ensemble '{name}' step {index}: {exc}") from None
            # Triton's dependency graph: steps no repository holds are named before any step loads
            absent = [step for step in dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step)
                      if self.record(step) is None and not self.model_dir(step).is_dir()]
            if absent:
                raise InvalidArgument(
                    f"ensemble {name} contains models that are not available or ambiguous: {', '.join(absent)}"
                )
            for step in config.ensemble_scheduling.step:
                self._load_step_model(name, step, from_client)
        finally:
            self._ensembles_loading.pop()

        def lookup(model_name: str) -> ComposingModel | None:
            try:
                return composing_model_of(self.get(model_name).config)
            except InferenceError:
                return None

        plan = plan_ensemble(config, lookup)
        # Triton's ensemble writes whether a step is decoupled: then the ensemble is (clients stream it)
        config.model_transaction_policy.decoupled = plan.decoupled
        return EnsembleModel(name, version, path, config, self.executor, plan, self.runner, self.metrics_config)


def _is_plain_name(name: str) -> bool:
    """Whether ``name`` may become a path (the load itself reports one that may not)."""
    try:
        check_model_name(name)
    except InvalidArgument:
        return False
    return True


def _step_dependency_error(name: str, step: str, record: ModelRecord | None) -> InvalidArgument | None:
    """Triton's words when a step's model has no loaded version (None when it has one)."""
    if record is not None and record.versions:
        return None
    reason = record.reason if record is not None and record.reason else ""
    detail = f" Model '{step}' loading failed with error: {reason}" if reason else ""
    return InvalidArgument(f"ensemble '{name}' depends on '{step}' which has no loaded version.{detail}")


def settings_version(config: mc.ModelConfig) -> int:
    """The version number of a model in MLServer's layout: ``parameters.version`` when it is a number, else 1
    (a label such as "v0.1.0" names version 1 to clients: :func:`fastoip.model_config.version_name`)."""
    text = parameter(config, "version").strip()
    return int(text) if text.isdigit() else 1


#: Instances one load through the API may ask for, all its versions together (issues 27, 37: each is a session
#: and threads; 100 took 526 MB; 6 versions x 32 took 383 threads).
CLIENT_INSTANCES_MAX = 32
#: Model instances a load through the API may take the whole server to (its own old versions not counted).
SERVER_INSTANCES_MAX = 256


#: Triton's version numbers are int64: a directory named by a larger number is not a version.
VERSION_MAX = 2**63 - 1


def _version_numbers(name: str, model_dir: Path, filename: str | None) -> list[int]:
    """The version directories of ``model_dir`` (holding ``filename`` when given), sorted; a number past int64
    (e.g. 10^20) is skipped with a warning (issue 27)."""
    versions = []
    for path in model_dir.iterdir():
        if not (path.name.isdigit() and path.is_dir()) or (filename is not None and not (path / filename).is_file()):
            continue
        number = int(path.name)
        if number > VERSION_MAX:
            log.warning("model '%s': version directory '%s' is past int64 and is not a version", name, path.name[:40])
            continue
        versions.append(number)
    return sorted(versions)


def _log_missing_python_file(model_dir: Path, filename: str) -> None:
    """python_backend's words for a version folder without the model file, with its path, in the operator's log
    (Triton's QA greps them; a client's error never carries server paths)."""
    folders = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    if folders:
        newest = max(folders, key=lambda folder: int(folder.name))
        log.error("Failed to preinitialize Python stub: Python model file not found in '%s'",
                  (newest / filename).absolute())


def _write_uploaded_files(name: str, files: dict[str, bytes]) -> Path:
    """Write a load request's model files into a new private directory; refuse paths that leave it.

    A file-system failure is the server's trouble: INTERNAL, in Triton's words, without server paths.
    """
    try:
        checked = [(upload_parts(name, relative), content) for relative, content in files.items()]
    except InvalidArgument as exc:  # Triton's words first (its QA matches "failed to load"), then which path
        raise InvalidArgument(f"failed to load '{name}': {exc.message}") from None
    failed = f"failed to load '{name}', failed to poll from model repository"
    try:
        # The name (cut short: the directory name must fit NAME_MAX) tells an operator whose files these are.
        root = Path(tempfile.mkdtemp(prefix=f"fastoip-upload-{name[:64]}-"))
    except OSError as exc:
        raise InternalError(f"{failed}: cannot store its model files: {exc.strerror or type(exc).__name__}") from None
    try:
        for parts, content in checked:
            target = root.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    except OSError as exc:  # disk full, permissions, a name the file system refuses
        shutil.rmtree(root, ignore_errors=True)
        raise InternalError(
            f"{failed}: writing its model file 'file:{'/'.join(parts)[:64]}' failed: "
            f"{exc.strerror or type(exc).__name__}"
        ) from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _scheduler_for(config: mc.ModelConfig, model_dir: Path | None = None) -> SchedulerFactory:
    if config.HasField("sequence_batching"):
        from ..scheduling.execute import run_jobs
        from ..scheduling.sequence_batcher import SequenceBatcher, SequenceTarget
        from ..scheduling.sequence_settings import sequence_settings

        settings = sequence_settings(config, model_dir)

        def sequence_batcher(
            context: ExecutionContext, instances: Sequence[Backend], executor: Executor
        ) -> SequenceBatcher:
            target = SequenceTarget(context.name, context.config, list(instances))
            return SequenceBatcher(target, settings, lambda backend, jobs: run_jobs(context, backend, jobs))

        return sequence_batcher
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
        # Triton loads the versions that exist and logs the others.
        present = sorted({v for v in policy.specific.versions if v in available})
        for version in sorted(set(policy.specific.versions) - set(present)):
            log.error("version %d is specified for model '%s', but the version directory is not present",
                      version, name)
        if not present:
            raise Unavailable(f"at least one version must be available under the version policy of model '{name}'")
        return present
    count = policy.latest.num_versions if choice == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]


#: The metric families a model's ``model_metrics`` may customise (Triton's core has this one).
CUSTOMIZABLE_METRICS = ("nv_inference_first_response_histogram_ms",)


def _model_metrics_config(server: MetricsConfig, config: mc.ModelConfig) -> MetricsConfig:
    """The server's metrics settings with the histogram buckets a model's ``model_metrics`` sets (Triton's)."""
    settings = server
    for control in config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family in CUSTOMIZABLE_METRICS:
            settings = replace(settings, first_response_buckets_ms=tuple(control.histogram_options.buckets))
        else:  # Triton's words
            log.warning("Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.",
                        family)
    return settings

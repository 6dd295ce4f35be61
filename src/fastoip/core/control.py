"""Model control: the repository index, load, unload, polling, and the extension list.

Rules:
- Only this module changes which models are served.  Start-up loading,
  polling and explicit load / unload follow ``model_control_mode``
  (``none``, ``poll``, ``explicit``) as Triton's ``--model-control-mode`` does.
- Load and unload block until done (they build or drain whole model versions):
  event-loop frontends call them in an executor.
- The extension list is decided here, once, from what this server implements.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .. import cuda
from ..errors import InvalidArgument, Unavailable
from ..model_config import config_from_json
from ..repository import ModelRepository, ModelState
from ..repository.poller import RepositoryPoller
from .answers import RepositoryIndexEntry

log = logging.getLogger("fastoip.core")

#: Server-metadata extensions: exactly what this server implements (Triton's names).
#: ``binary_tensor_data`` is the HTTP binary extension; Triton's core lists it whatever frontends run.
EXTENSIONS = (
    "classification",
    "model_configuration",
    "statistics",
    "parameters",
    "model_repository",
    "schedule_policy",
    "system_shared_memory",
    "trace",
    "logging",
    "binary_tensor_data",
)

MODEL_CONTROL_MODES = ("none", "poll", "explicit")


def server_extensions() -> tuple[str, ...]:
    """The extensions of this process: ``cuda_shared_memory`` only where a CUDA runtime is present."""
    return EXTENSIONS + (("cuda_shared_memory",) if cuda.runtime() is not None else ())


class ModelControl:
    """Index, load, unload and poll the repository, as the model control mode allows."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        model_control_mode: str = "none",
        startup_models: list[str] | None = None,
        poll_interval: float = 15.0,
    ) -> None:
        if model_control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model control mode must be none, poll or explicit, not '{model_control_mode}'")
        self.repository = repository
        self.model_control_mode = model_control_mode
        self.startup_models = list(startup_models or [])
        self.poll_interval = poll_interval
        self.poller: RepositoryPoller | None = None
        self.extensions = server_extensions()

    def load_models(self) -> None:
        """Load what the model control mode says to load at start-up (and start polling in poll mode)."""
        if self.model_control_mode == "explicit":
            if "*" in self.startup_models:
                self.repository.load_all()
            else:  # one load operation, as Triton loads its --load-model list
                self.repository.load_many(self.startup_models)
            return
        if self.startup_models:
            raise ValueError("--load-model is only valid with --model-control-mode explicit")
        self.repository.load_all()
        if not self.repository.model_names():
            self._say_no_model_found()
        if self.model_control_mode == "poll":
            self.poller = RepositoryPoller(self.repository, self.poll_interval)
            self.poller.remember_current()
            self.poller.start()

    def _say_no_model_found(self) -> None:
        """Loud, not ready-with-nothing in silence: the usual cause is a wrong path or a misplaced file."""
        for root in self.repository.roots:
            where = f"'{root}' ({root.absolute()})" if not root.is_absolute() else f"'{root}'"
            log.error(
                "model repository %s holds no model: expected <model>/config.pbtxt or <model>/<version>/<model file> "
                "folders (Triton's layout) or model-settings.json files (MLServer's layout)%s",
                where, "" if root.is_dir() else "; it is not a directory",
            )

    def repository_index(self, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        """Every model in the repository (one entry per loaded version), sorted by name then version."""
        known = {r.name: r for r in self.repository.records()}
        index: list[RepositoryIndexEntry] = []
        for name in sorted(set(self.repository.model_names()) | set(known)):
            record = known.get(name)
            if record is None:
                index.append(RepositoryIndexEntry(name, "", "", ""))
            elif record.versions:
                # reason: why the latest load failed, while older versions keep serving
                for version in sorted(record.versions):
                    state, reason = record.state.value, record.reason
                    down = getattr(record.versions[version], "down_reason", None)
                    if state == ModelState.READY.value and down is not None and (why := down()):
                        state, reason = ModelState.UNAVAILABLE.value, why  # loaded, but it cannot serve
                    index.append(RepositoryIndexEntry(name, record.versions[version].version_str, state, reason))
            else:
                index.append(RepositoryIndexEntry(name, "", record.state.value, record.reason))
        if ready_only:
            index = [entry for entry in index if entry.state == ModelState.READY.value]
        return index

    def load_model(
        self, name: str, parameters: dict[str, Any] | None = None, client_gone: threading.Event | None = None
    ) -> None:
        """Load or reload ``name`` (explicit mode); the old versions serve until the new ones are ready.

        ``parameters`` are the load request's, as Triton reads them: ``config`` (a
        ModelConfig as JSON) overrides config.pbtxt; ``file:<path>`` (bytes) are the
        files of a model directory to load instead of the repository's, and need a ``config``.
        ``client_gone``: set when the load's client went away; the load stops at its next step (issue 37).
        """
        self.check_explicit("load")
        override = None
        files: dict[str, bytes] = {}
        for key, value in (parameters or {}).items():
            if key.startswith("file:"):
                if not isinstance(value, bytes):
                    raise InvalidArgument(f"load '{name}': '{key}' must carry the file's bytes")
                files[key[len("file:") :]] = value
            elif key == "config":
                override = config_from_json(name, value)
        if files and override is None:
            raise InvalidArgument(  # Triton's words first (its QA matches them), then what is missing
                f"failed to load '{name}', failed to poll from model repository: model files in the request need a "
                "'config' parameter too"
            )
        self.repository.load(name, override, files or None, from_client=True, client_gone=client_gone)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Stop serving ``name`` (explicit mode); requests in flight finish first.

        ``unload_dependents`` (Triton's parameter): an ensemble's composing models go too, those no other
        loaded ensemble uses.  A name the server does not know is a no-op, as in Triton.
        """
        self.check_explicit("unload")
        self.repository.unload(name, unload_dependents)

    def check_explicit(self, action: str) -> None:
        """Unavailable unless the server takes model control requests (explicit mode)."""
        if self.model_control_mode == "poll":
            raise Unavailable(f"explicit model {action} is not allowed if polling is enabled")
        if self.model_control_mode == "none":
            raise Unavailable(
                f"explicit model {action} is not allowed in model control mode 'none' "
                "(start the server with --model-control-mode explicit)"
            )

    def stop_polling(self) -> None:
        if self.poller is not None:
            self.poller.stop()

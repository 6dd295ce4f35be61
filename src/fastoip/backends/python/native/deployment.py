"""``@on_deployment`` hooks: run once per server process, before any instance of the model is built."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ....errors import InvalidArgument
from ....lifecycle import DEPLOYMENT, hook_names
from ..describe import describe as _describe
from ..event_loop import call

log = logging.getLogger("fastoip.python")

_deploy_lock = threading.Lock()
#: (file, class) -> None once the hooks ran, or the failure message not reported by a load yet.
_deployments: dict[tuple[str, str], str | None] = {}


def _deployment_key(cls: type, path: Path) -> tuple[str, str]:
    source = str(path.resolve()) if cls.__module__.startswith("_fastoip_model_") else cls.__module__
    return source, cls.__qualname__


def run_deployment_hooks(cls: type, path: Path, model_name: str, *, from_load: bool) -> None:
    key = _deployment_key(cls, path)
    with _deploy_lock:
        if key in _deployments:
            failure = _deployments[key]
            if failure is None:
                return
            if from_load:
                # Report the failure the pre-load pass saw once; a later load tries again.
                del _deployments[key]
                raise InvalidArgument(failure)
            return
        try:
            for name in hook_names(cls, DEPLOYMENT):
                log.info("model '%s': on_deployment hook %s", model_name, name)
                call(getattr(cls, name))
        except Exception as exc:
            message = f"model '{model_name}': on_deployment hook failed: {_describe(exc)}"
            if from_load:
                raise InvalidArgument(message) from exc
            _deployments[key] = message
            raise InvalidArgument(message) from exc
        _deployments[key] = None

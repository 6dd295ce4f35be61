"""``fastoip mlserver start <folder>``: a folder served as ``mlserver start <folder>`` serves it.

Rules:
- The server's settings are MLServer's, read by MLServer's own ``Settings`` class (``mlserver/settings.py``,
  ``mlserver/cli/serve.py``), so names and precedence are exactly MLServer's: the folder's ``settings.json``
  first, then ``MLSERVER_*`` environment variables, then a ``.env`` file in the working directory, then
  MLServer's defaults (HTTP 8080, gRPC 8081, metrics 8082 on 0.0.0.0); the folder is the model repository.
- They become ``fastoip serve`` flags (:func:`serve_arguments`); flags given after the folder are ``fastoip
  serve``'s own and come last, so they win.  A setting fastoip does not act on is said once at start
  (:func:`unused_settings`), never dropped in silence.
- MLServer puts the working directory and the folder on ``sys.path`` so that ``implementation`` imports a
  module beside the settings; so does this (and ``PYTHONPATH``, for the worker processes the server starts).
- Without mlserver installed this is an error naming the extra to install: the settings are MLServer's to read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

#: MLServer's server-settings file in the folder (``mlserver.cli.serve.DEFAULT_SETTINGS_FILENAME``).
SETTINGS_FILE = "settings.json"
#: What to install when mlserver is missing.
EXTRA = "pip install 'fastoip[mlserver]'"

#: Settings fastoip does not act on, with what a user should know (said at start when one is not its default).
_NOT_USED = {
    "parallel_workers": "MLServer runtimes run in the server process unless a model's parameters.fastoip_hosting "
                        "is \"process\" (then its own parallel_workers are its worker processes)",
    "cors_settings": "no CORS headers are sent",
    "gzip_enabled": "responses are compressed when the client asks (Accept-Encoding)",
    "root_path": "routes are served at /",
    "kafka_enabled": "there is no Kafka server",
    "tracing_server": "tracing is set with --trace-config",
    "cache_enabled": "the response cache is set with --cache-config and each model's config",
    "use_structured_logging": "logs use --log-format",
    "logging_settings": "logging is set with --log-level",
    "model_repository_implementation": "the repository is the folder",
    "metrics_rest_server_prefix": "metrics use Triton's names",
}


class MLServerMissing(RuntimeError):
    """mlserver is not installed (its message names the extra to install)."""


def mlserver_settings(folder: str) -> Any:
    """MLServer's ``Settings`` as ``mlserver start <folder>`` loads them (``settings.json``, then ``MLSERVER_*``)."""
    try:
        from mlserver.settings import Settings
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "mlserver":
            raise
        raise MLServerMissing(
            f"fastoip mlserver start reads MLServer's settings with MLServer's own classes: {EXTRA}"
        ) from None
    path = Path(folder) / SETTINGS_FILE
    settings = Settings.parse_file(str(path)) if path.is_file() else Settings()
    settings.model_repository_root = folder  # MLServer: the folder given wins over any setting
    return settings


def serve_arguments(settings: Any) -> list[str]:
    """The ``fastoip serve`` flags that serve as MLServer would with ``settings``."""
    argv = [
        "--model-repository", str(settings.model_repository_root),
        "--host", str(settings.host),
        "--http-port", str(int(settings.http_port)),
        "--grpc-port", str(int(settings.grpc_port)),
        "--metrics-port", str(int(settings.metrics_port)) if settings.metrics_endpoint else "-1",
        "--log-level", "DEBUG" if settings.debug else "INFO",
        "--id", str(settings.server_name),
        "--mlserver-grpc-stream",  # MLServer's stub reads ModelStreamInfer's messages (server/grpc/mlserver_shapes)
    ]
    if not settings.load_models_at_startup:
        argv += ["--model-control-mode", "explicit"]  # nothing loaded until the repository API asks
    if settings.grpc_max_message_length:
        argv += ["--grpc-max-message-size", str(int(settings.grpc_max_message_length))]
    return argv


def unused_settings(settings: Any) -> list[str]:
    """One line per setting that differs from MLServer's default and that fastoip does not act on."""
    defaults = type(settings).model_fields
    lines = []
    for name, consequence in _NOT_USED.items():
        field = defaults.get(name)
        if field is not None and getattr(settings, name) != field.get_default(call_default_factory=True):
            lines.append(f"settings.json / MLSERVER_{name.upper()}: '{name}' is not used by fastoip: {consequence}")
    endpoint = settings.metrics_endpoint
    if endpoint and endpoint != "/metrics":
        lines.append(f"metrics_endpoint '{endpoint}' is not used by fastoip: metrics are served at /metrics")
    return lines


def extend_import_path(folder: str) -> None:
    """The working directory and ``folder`` first on ``sys.path``, as ``mlserver start`` puts them, and on
    ``PYTHONPATH`` for the worker processes the server starts."""
    parts = [os.path.abspath(folder), os.getcwd()]
    for part in reversed(parts):
        sys.path.insert(0, part)
    existing = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*parts, existing] if existing else parts)

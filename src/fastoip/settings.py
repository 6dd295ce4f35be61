"""Runtime settings clients may read and change: logging and request tracing.

Rules:
- Log settings use Triton's names (log_info, log_warning, log_error,
  log_verbose_level, log_format, log_file) and drive Python logging for the
  ``fastoip`` loggers.  ``log_file`` other than "" is refused (logs go to stderr).
- Trace settings use Triton's names.  ``trace_level`` is OFF or TIMESTAMPS
  (TENSORS is refused); with TIMESTAMPS every ``trace_rate``-th request, up
  to ``trace_count`` (-1 = no limit), is written as one JSON line with its
  timestamps to ``trace_file``.  Settings can be global or per model; a model's
  settings fall back to the global ones.
"""

from __future__ import annotations

import json
import logging
import threading

from .errors import InvalidArgument

LogValue = bool | int | str

LOG_DEFAULTS: dict[str, LogValue] = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}

TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
    "trace_mode": ["triton"],
}


class LogSettings:
    def __init__(self) -> None:
        # Start from the level the process was started with (``--log-level``); change it only on update.
        level = logging.getLogger("fastoip").getEffectiveLevel()
        self.values: dict[str, LogValue] = dict(LOG_DEFAULTS)
        self.values.update(
            log_info=level <= logging.INFO,
            log_warning=level <= logging.WARNING,
            log_error=level <= logging.ERROR,
            log_verbose_level=1 if level <= logging.DEBUG else 0,
        )

    def update(self, changes: dict[str, LogValue]) -> dict[str, LogValue]:
        for key, value in changes.items():
            if key not in LOG_DEFAULTS:
                raise InvalidArgument(f"unknown log setting '{key}' (known: {', '.join(LOG_DEFAULTS)})")
            expected = type(LOG_DEFAULTS[key])
            if type(value) is not expected:
                raise InvalidArgument(f"log setting '{key}' must be {expected.__name__}, got {value!r}")
            if key == "log_file" and value:
                raise InvalidArgument("log_file is not supported: fastoip logs to stderr")
            if key == "log_format" and value not in ("default", "ISO8601"):
                raise InvalidArgument("log_format must be 'default' or 'ISO8601'")
            self.values[key] = value
        self._apply()
        return dict(self.values)

    def _apply(self) -> None:
        v = self.values
        if int(v["log_verbose_level"]) > 0:
            level = logging.DEBUG
        elif v["log_info"]:
            level = logging.INFO
        elif v["log_warning"]:
            level = logging.WARNING
        elif v["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        logging.getLogger("fastoip").setLevel(level)


class TraceSettings:
    """Global and per-model trace settings, and the trace writer."""

    def __init__(self) -> None:
        self.global_values: dict[str, list[str]] = {k: list(v) for k, v in TRACE_DEFAULTS.items()}
        self.model_values: dict[str, dict[str, list[str]]] = {}
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self._written: dict[str, int] = {}
        self.active = False

    def get(self, model: str = "") -> dict[str, list[str]]:
        values = dict(self.global_values)
        if model:
            values.update(self.model_values.get(model, {}))
        return {k: list(v) for k, v in values.items()}

    def update(self, changes: dict[str, list[str] | None], model: str = "") -> dict[str, list[str]]:
        target = self.model_values.setdefault(model, {}) if model else self.global_values
        for key, value in changes.items():
            if key not in TRACE_DEFAULTS:
                raise InvalidArgument(f"unknown trace setting '{key}' (known: {', '.join(TRACE_DEFAULTS)})")
            if value is None or value == []:  # clear: back to the global/default value
                if model:
                    target.pop(key, None)
                else:
                    target[key] = list(TRACE_DEFAULTS[key])
                continue
            if key == "trace_level" and any(level not in ("OFF", "TIMESTAMPS") for level in value):
                raise InvalidArgument(f"trace_level {value} is not supported (OFF or TIMESTAMPS)")
            if key in ("trace_rate", "trace_count", "log_frequency"):
                try:
                    [int(x) for x in value]
                except ValueError:
                    raise InvalidArgument(f"trace setting '{key}' must be an integer, got {value}") from None
            if key == "trace_mode" and value != ["triton"]:
                raise InvalidArgument("trace_mode must be 'triton' (OpenTelemetry is not supported)")
            target[key] = list(value)
        self.active = any(
            "TIMESTAMPS" in vals.get("trace_level", []) for vals in [self.global_values, *self.model_values.values()]
        )
        with self._lock:
            self._seen.clear()
            self._written.clear()
        return self.get(model)

    def record(self, model: str, version: str, request_id: str, stamps: list[tuple[str, int]]) -> None:
        """Write one request's timestamps if its model traces TIMESTAMPS and it is sampled."""
        values = self.get(model)
        if "TIMESTAMPS" not in values["trace_level"] or not values["trace_file"][0]:
            return
        rate = max(1, int(values["trace_rate"][0]))
        limit = int(values["trace_count"][0])
        with self._lock:
            seen = self._seen.get(model, 0) + 1
            self._seen[model] = seen
            if (seen - 1) % rate:
                return
            written = self._written.get(model, 0)
            if 0 <= limit <= written:
                return
            self._written[model] = written + 1
            line = {
                "id": seen,
                "model_name": model,
                "model_version": version,
                "request_id": request_id,
                "timestamps": [{"name": name, "ns": ns} for name, ns in stamps],
            }
            with open(values["trace_file"][0], "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")

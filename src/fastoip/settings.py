"""Runtime log settings clients may read and change (trace settings: :mod:`fastoip.tracing.manager`).

Rules:
- Log settings use Triton's names (log_info, log_warning, log_error,
  log_verbose_level, log_format, log_file) and drive Python logging for the
  ``fastoip`` loggers.  ``log_file`` reads the file given at start (``--log-file``, "" for stderr); changing
  it is refused, in Triton's words;
  ``log_verbose_level`` is an unsigned 32-bit integer, as in Triton's gRPC API.
"""

from __future__ import annotations

import logging

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

    def started_with(self, log_file: str, log_format: str) -> None:
        """Report the file and format the process was started with (``--log-file``, ``--log-format``)."""
        self.values.update(log_file=log_file, log_format=log_format)

    def update(self, changes: dict[str, LogValue]) -> dict[str, LogValue]:
        for key, value in changes.items():
            if key not in LOG_DEFAULTS:
                raise InvalidArgument(f"unknown log setting '{key}' (known: {', '.join(LOG_DEFAULTS)})")
            expected = type(LOG_DEFAULTS[key])
            if type(value) is not expected:
                raise InvalidArgument(f"log setting '{key}' must be {expected.__name__}, got {value!r}")
            if key == "log_file" and value:
                # Triton's words; the log file is set at start (--log-file)
                raise InvalidArgument("log file location can not be updated through network protocol")
            if key == "log_verbose_level" and not 0 <= int(value) <= 0xFFFFFFFF:  # the gRPC field is uint32
                raise InvalidArgument(f"log_verbose_level must be an unsigned 32-bit integer, got {value!r}")
            if key == "log_format" and value not in ("default", "ISO8601"):
                raise InvalidArgument(f"invalid argument for log_format, got: {value} (expected default or ISO8601)")
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

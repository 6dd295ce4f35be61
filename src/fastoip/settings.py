"""Runtime log settings clients may read and change (trace settings: :mod:`fastoip.tracing.manager`).

Rules:
- Log settings use Triton's names (log_info, log_warning, log_error,
  log_verbose_level, log_format, log_file) and drive Python logging for the
  ``fastoip`` loggers.  ``log_file`` reads the file given at start (``--log-file``, "" for stderr); changing
  it is refused, in Triton's words;
  ``log_verbose_level`` is an unsigned 32-bit integer, as in Triton's gRPC API.
- The switches are independent, as Triton's logger's: info, warning and error records pass when their own
  switch is on, debug records (fastoip's verbose messages) when ``log_verbose_level`` > 0, whatever
  ``log_info`` says (Triton's ``LOG_VERBOSE`` is gated by the level alone).  The ``fastoip`` logger's level
  is the lowest level any switch lets through; :data:`SWITCHES`, a filter, drops the records of a level
  switched off between (``--log-info=false --log-verbose=1``).  It sits on the ``fastoip`` logger and on the
  handlers ``fastoip serve`` installs (a logger's filters do not see its children's records).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

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


class LevelSwitches(logging.Filter):
    """Drops the ``fastoip`` records whose level is switched off (process-wide, as the logger's level is)."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True
        self.verbose = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("fastoip"):
            return True  # another library's record on a handler fastoip installed: not Triton's switches
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0


#: The one set of switches of this process (the ``fastoip`` logger is one per process too).
SWITCHES = LevelSwitches()


def switches_for_level(level: int) -> dict[str, LogValue]:
    """The switches a Python log level means (``--log-level``, or an embedding process's own level)."""
    return {
        "log_info": level <= logging.INFO,
        "log_warning": level <= logging.WARNING,
        "log_error": level <= logging.ERROR,
        "log_verbose_level": 1 if level <= logging.DEBUG else 0,
    }


class LogSettings:
    def __init__(self) -> None:
        # Start from the level the process was started with (``--log-level``); change it only on update.
        level = logging.getLogger("fastoip").getEffectiveLevel()
        self.values: dict[str, LogValue] = dict(LOG_DEFAULTS)
        self.values.update(switches_for_level(level))
        logger = logging.getLogger("fastoip")
        if SWITCHES not in logger.filters:
            logger.addFilter(SWITCHES)

    def started_with(self, log_file: str, log_format: str, switches: Mapping[str, LogValue] | None = None) -> None:
        """Report the file and format the process was started with (``--log-file``, ``--log-format``), and set
        Triton's switches it was started with (``--log-info`` etc.; None: those of the level it runs at)."""
        self.values.update(log_file=log_file, log_format=log_format)
        if switches:
            self.update(dict(switches))

    def update(self, changes: dict[str, LogValue]) -> dict[str, LogValue]:
        for key, value in changes.items():
            if key not in LOG_DEFAULTS:
                raise InvalidArgument(f"unknown log setting '{key}' (known: {', '.join(LOG_DEFAULTS)})")
            expected = type(LOG_DEFAULTS[key])
            if type(value) is not expected:
                raise InvalidArgument(f"log setting '{key}' must be {expected.__name__}, got {value!r}")
            if key == "log_file":
                # Triton's words; the log file is set at start (--log-file); "" too (issue 37: it answered 200
                # and changed nothing)
                raise InvalidArgument("log file location can not be updated through network protocol")
            if key == "log_verbose_level" and not 0 <= int(value) <= 0xFFFFFFFF:  # the gRPC field is uint32
                raise InvalidArgument(f"log_verbose_level must be an unsigned 32-bit integer, got {value!r}")
            if key == "log_format" and value not in ("default", "ISO8601"):
                raise InvalidArgument(f"invalid argument for log_format, got: {value} (expected default or ISO8601)")
            self.values[key] = value
        self._apply()
        return dict(self.values)

    def _apply(self) -> None:
        apply_switches(self.values)


def apply_switches(values: Mapping[str, LogValue]) -> None:
    """Set the process's switches and the ``fastoip`` logger's level from Triton's log settings (``values``
    holds log_info, log_warning, log_error and log_verbose_level)."""
    SWITCHES.info, SWITCHES.warning = bool(values["log_info"]), bool(values["log_warning"])
    SWITCHES.error, SWITCHES.verbose = bool(values["log_error"]), int(values["log_verbose_level"])
    if SWITCHES.verbose > 0:
        level = logging.DEBUG
    elif SWITCHES.info:
        level = logging.INFO
    elif SWITCHES.warning:
        level = logging.WARNING
    elif SWITCHES.error:
        level = logging.ERROR
    else:
        level = logging.CRITICAL + 1
    logging.getLogger("fastoip").setLevel(level)

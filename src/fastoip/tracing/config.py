"""``--trace-config`` and Triton's deprecated ``--trace-file``, ``--trace-level``, ... flags, as Triton reads them.

Rules (Triton's ``docs/user_guide/trace.md`` and ``src/command_line_parser.cc``):
- ``--trace-config <setting>=<value>`` sets a global setting: ``level`` (repeatable;
  the levels add up, and an explicit OFF anywhere turns tracing off), ``rate``,
  ``count``, ``mode`` (triton or opentelemetry).  Level values read as Triton
  reads them, in any case: off/false; timestamps/on/true/min/max; tensors.
- ``--trace-config triton,<setting>=<value>``: ``file``, ``log-frequency``.
- ``--trace-config opentelemetry,<setting>=<value>``: ``url`` (OTLP/HTTP,
  default ``http://localhost:4318/v1/traces``), ``resource`` (``key=value``,
  repeatable), ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms),
  ``bsp_max_export_batch_size`` (defaults from ``OTEL_BSP_*`` when set, as Triton).
- The deprecated flags give the starting values; ``--trace-config`` wins over them.
- Anything else is refused with a message naming it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The levels a trace can record, in Triton's order; no level is OFF.
LEVELS = ("TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"
#: The default ``service.name`` resource (Triton's is ``triton-inference-server``; ``resource=`` changes it).
DEFAULT_SERVICE_NAME = "fastoip"

_LEVEL_WORDS = {
    "off": "", "false": "",
    "timestamps": "TIMESTAMPS", "on": "TIMESTAMPS", "true": "TIMESTAMPS", "min": "TIMESTAMPS", "max": "TIMESTAMPS",
    "tensors": "TENSORS",
}


@dataclass
class TraceConfig:
    """Every trace setting the command line gives, with Triton's defaults."""

    #: Some of :data:`LEVELS`, in that order; empty: OFF.
    levels: tuple[str, ...] = ()
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    otel_url: str = DEFAULT_OTLP_URL
    otel_resource: dict[str, str] = field(default_factory=lambda: {"service.name": DEFAULT_SERVICE_NAME})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @property
    def enabled(self) -> bool:
        return bool(self.levels)


def parse_level(value: str, flag: str = "--trace-config level") -> str:
    """One level word as Triton reads it: "" for OFF, else TIMESTAMPS or TENSORS."""
    level = _LEVEL_WORDS.get(value.lower())
    if level is None:
        raise ValueError(f"{flag}: expected OFF, TIMESTAMPS or TENSORS, got '{value}'")
    return level


def _integer(setting: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{setting}: expected an integer, got '{value}'") from None
    if number < minimum:
        raise ValueError(f"{setting}: must be >= {minimum}, got {number}")
    return number


def _bsp_default(name: str, default: int) -> int:
    value = os.environ.get(name)
    return _integer(name, value, 0) if value else default


def parse_trace_config(
    entries: Sequence[str],
    *,
    trace_file: str | None = None,
    trace_levels: Sequence[str] = (),
    trace_rate: int | None = None,
    trace_count: int | None = None,
    trace_log_frequency: int | None = None,
) -> TraceConfig:
    """Every ``--trace-config`` value in order (later ones win) over the deprecated flags' values."""
    config = TraceConfig(
        bsp_max_queue_size=_bsp_default("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
        bsp_schedule_delay_ms=_bsp_default("OTEL_BSP_SCHEDULE_DELAY", 5000),
        bsp_max_export_batch_size=_bsp_default("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
    )
    levels = {parse_level(value, "--trace-level") for value in trace_levels}
    if trace_file is not None:
        config.file = trace_file
    if trace_rate is not None:
        config.rate = _integer("--trace-rate", str(trace_rate), 0)
    if trace_count is not None:
        config.count = _integer("--trace-count", str(trace_count), -1)
    if trace_log_frequency is not None:
        config.log_frequency = _integer("--trace-log-frequency", str(trace_log_frequency), 0)
    resource: dict[str, str] = {}
    for entry in entries:
        head = entry.split("=", 1)[0]
        scope, rest = entry.split(",", 1) if "," in head else ("", entry)  # "triton,file=a,b.json": scope triton
        setting, equals, value = rest.partition("=")
        if not equals or not setting or not value:
            raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {entry}")
        if scope == "":
            if setting == "level":
                levels.add(parse_level(value))
            elif setting == "rate":
                config.rate = _integer("--trace-config rate", value, 0)
            elif setting == "count":
                config.count = _integer("--trace-config count", value, -1)
            elif setting == "mode":
                if value.lower() not in MODES:
                    raise ValueError(
                        f"--trace-config mode: invalid value for trace mode option: {value}. "
                        'Available options are "triton" and "opentelemetry"'
                    )
                config.mode = value.lower()
            else:
                raise ValueError(f"--trace-config: unknown global setting '{setting}' (level, rate, count, mode)")
        elif scope.lower() == "triton":
            if setting == "file":
                config.file = value
            elif setting == "log-frequency":
                config.log_frequency = _integer("--trace-config triton,log-frequency", value, 0)
            else:
                raise ValueError(f"--trace-config triton: unknown setting '{setting}' (file, log-frequency)")
        elif scope.lower() == "opentelemetry":
            if setting == "url":
                config.otel_url = value if "://" in value else f"http://{value}"
            elif setting == "resource":
                key, equals, attribute = value.partition("=")
                if not equals or not key:
                    raise ValueError(f"--trace-config opentelemetry,resource: expected key=value, got '{value}'")
                resource[key] = attribute
            elif setting == "bsp_max_queue_size":
                config.bsp_max_queue_size = _integer(setting, value, 1)
            elif setting == "bsp_schedule_delay":
                config.bsp_schedule_delay_ms = _integer(setting, value, 0)
            elif setting == "bsp_max_export_batch_size":
                config.bsp_max_export_batch_size = _integer(setting, value, 1)
            else:
                raise ValueError(
                    f"--trace-config opentelemetry: unknown setting '{setting}' "
                    "(url, resource, bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)"
                )
        else:
            raise ValueError(f"--trace-config: unknown mode '{scope}' (triton or opentelemetry)")
    # an explicit OFF anywhere turns tracing off, as Triton does
    config.levels = () if "" in levels else tuple(level for level in LEVELS if level in levels)
    config.otel_resource.update(resource)
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise ValueError("--trace-config opentelemetry: bsp_max_export_batch_size must be <= bsp_max_queue_size")
    return config

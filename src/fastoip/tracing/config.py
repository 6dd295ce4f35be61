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
- OpenTelemetry's standard environment variables are honoured in opentelemetry mode, as defaults that
  ``--trace-config`` overrides: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the URL as it is) or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` appended, as the SDK does), ``OTEL_SERVICE_NAME`` and
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` (+ ``OTEL_TRACES_SAMPLER_ARG``) as the rate:
  ``[parentbased_]always_on`` every request, ``[parentbased_]always_off`` none (count 0),
  ``[parentbased_]traceidratio`` one request in round(1/ratio); a request with a ``traceparent`` is traced
  whatever the rate (parent-based either way), and ``OTEL_SDK_DISABLED=true`` turns tracing off.  The exporter
  reads the others itself (``OTEL_EXPORTER_OTLP_HEADERS``, ``_TIMEOUT``, ``_COMPRESSION``, ``_CERTIFICATE``).
- Anything else is refused with a message naming it.
"""

from __future__ import annotations

import os
import urllib.parse
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


SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")


def _otel_environment(config: TraceConfig, rate_given: bool, url_given: bool) -> None:
    """OpenTelemetry's standard environment variables, under what the command line said (opentelemetry mode)."""
    env = os.environ
    traces, base = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not url_given and (traces or base):
        config.otel_url = traces if traces else f"{base.rstrip('/')}/v1/traces"  # type: ignore[union-attr]
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        config.levels = ()
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and not rate_given:
        if sampler not in SAMPLERS:
            raise ValueError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got '{sampler}'")
        if sampler.endswith("always_on"):
            config.rate = 1
        elif sampler.endswith("always_off"):
            config.count = 0
        else:
            argument = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
            try:
                ratio = float(argument)
            except ValueError:
                raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got '{argument}'") from None
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got '{argument}'")
            if ratio == 0.0:
                config.count = 0
            else:
                config.rate = max(1, round(1 / ratio))


def _otel_resource_environment() -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,...``, values percent-encoded) and ``OTEL_SERVICE_NAME`` over it."""
    resource = {}
    for item in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, equals, value = item.partition("=")
        if equals and key.strip():
            resource[key.strip()] = urllib.parse.unquote(value.strip())
    if os.environ.get("OTEL_SERVICE_NAME"):
        resource["service.name"] = os.environ["OTEL_SERVICE_NAME"]
    return resource


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
    rate_given = trace_rate is not None or trace_count is not None
    url_given = False
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
                rate_given = True
            elif setting == "count":
                config.count = _integer("--trace-config count", value, -1)
                rate_given = True
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
                url_given = True
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
    if config.mode == "opentelemetry":
        _otel_environment(config, rate_given, url_given)
        config.otel_resource.update(_otel_resource_environment())
    config.otel_resource.update(resource)
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise ValueError("--trace-config opentelemetry: bsp_max_export_batch_size must be <= bsp_max_queue_size")
    return config

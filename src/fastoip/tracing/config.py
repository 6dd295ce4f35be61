"""``--trace-config`` as Triton spells it.

Rules (Triton's ``docs/user_guide/trace.md``):
- ``--trace-config <setting>=<value>`` sets a global setting: ``level`` (OFF,
  TIMESTAMPS, TENSORS; repeatable), ``rate``, ``count``, ``mode`` (triton or
  opentelemetry).
- ``--trace-config triton,<setting>=<value>``: ``file``, ``log-frequency``.
- ``--trace-config opentelemetry,<setting>=<value>``: ``url`` (OTLP/HTTP,
  default ``http://localhost:4318/v1/traces``), ``resource`` (``key=value``,
  repeatable), ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms),
  ``bsp_max_export_batch_size``.
- Anything else is refused with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"


@dataclass
class TraceConfig:
    """Every ``--trace-config`` setting, with Triton's defaults."""

    levels: list[str] = field(default_factory=lambda: ["OFF"])
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    otel_url: str = DEFAULT_OTLP_URL
    otel_resource: dict[str, str] = field(default_factory=lambda: {"service.name": "fastoip"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @property
    def enabled(self) -> bool:
        return any(level != "OFF" for level in self.levels)


def _integer(setting: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"--trace-config {setting}: expected an integer, got '{value}'") from None
    if number < minimum:
        raise ValueError(f"--trace-config {setting}: must be >= {minimum}, got {number}")
    return number


def parse_trace_config(entries: list[str]) -> TraceConfig:
    """Parse every ``--trace-config`` value in order (later ones win; ``level`` and ``resource`` add up)."""
    config = TraceConfig()
    levels: list[str] = []
    resource: dict[str, str] = {}
    for entry in entries:
        head = entry.split("=", 1)[0]
        scope, rest = entry.split(",", 1) if "," in head else ("", entry)  # "triton,file=a,b.json": scope triton
        setting, equals, value = rest.partition("=")
        if not equals:
            raise ValueError(f"--trace-config '{entry}': expected [<mode>,]<setting>=<value>")
        if scope == "":
            if setting == "level":
                if value.upper() not in LEVELS:
                    raise ValueError(f"--trace-config level: expected one of {', '.join(LEVELS)}, got '{value}'")
                levels.append(value.upper())
            elif setting == "rate":
                config.rate = _integer("rate", value, 0)
            elif setting == "count":
                config.count = _integer("count", value, -1)
            elif setting == "mode":
                if value not in MODES:
                    raise ValueError(f"--trace-config mode: expected triton or opentelemetry, got '{value}'")
                config.mode = value
            else:
                raise ValueError(f"--trace-config: unknown global setting '{setting}' (level, rate, count, mode)")
        elif scope == "triton":
            if setting == "file":
                config.file = value
            elif setting == "log-frequency":
                config.log_frequency = _integer("triton,log-frequency", value, 0)
            else:
                raise ValueError(f"--trace-config triton: unknown setting '{setting}' (file, log-frequency)")
        elif scope == "opentelemetry":
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
    if levels:
        config.levels = levels
    config.otel_resource.update(resource)
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise ValueError("--trace-config opentelemetry: bsp_max_export_batch_size must be <= bsp_max_queue_size")
    return config

"""Triton's ``--metrics-config``: which latency metrics a server keeps.

Rules:
- A value, never process state: each server (``ServeOptions.metrics_config``) hands its own to its Core,
  which gives it to every model version's counters and to the Prometheus rendering; two servers in
  one process (``fastoip.Server``) keep their own settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Triton's default summary quantiles: (quantile, allowed error).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001),
                                                       (0.999, 0.001))
#: Triton's default first-response histogram buckets, in milliseconds.
DEFAULT_FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100, 500, 2000, 5000)

@dataclass(frozen=True)
class MetricsConfig:
    """Triton's ``--metrics-config`` settings (server-wide, as in Triton)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    #: prometheus-cpp's summary window: quantiles describe the last ``max_age_s`` seconds.
    summary_max_age_s: float = 60.0
    #: ``nv_inference_first_response_histogram_ms`` buckets (a model's ``model_metrics`` may set its own).
    first_response_buckets_ms: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS

    @classmethod
    def parse(cls, settings: Iterable[str]) -> MetricsConfig:
        """``["summary_latencies=true", "summary_quantiles=0.5:0.05,0.9:0.01"]``: Triton's spelling."""
        values: dict[str, Any] = {}
        for setting in settings:
            key, sep, value = setting.partition("=")
            key, value = key.strip(), value.strip().strip('"')
            if not sep:
                raise ValueError(f"--metrics-config {setting!r}: expected <setting>=<value>")
            if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
                if value not in ("true", "false"):
                    raise ValueError(f"--metrics-config {key}={value}: expected true or false")
                values[key] = value == "true"
            elif key == "summary_quantiles":
                values[key] = _parse_quantiles(value)
            else:
                raise ValueError(
                    f"--metrics-config {key}: unknown setting (known: counter_latencies, summary_latencies, "
                    "histogram_latencies, summary_quantiles)"
                )
        return cls(**values)


def _parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for item in text.split(","):
        quantile, sep, error = item.partition(":")
        try:
            pair = (float(quantile), float(error))
        except ValueError:
            raise ValueError(f"summary_quantiles {item!r}: expected <quantile>:<error>") from None
        if not sep or not 0.0 <= pair[0] <= 1.0:
            raise ValueError(f"summary_quantiles {item!r}: expected <quantile>:<error>, quantile in [0, 1]")
        pairs.append(pair)
    return tuple(pairs)

"""Statistics and Prometheus metrics, one job per module.

- :mod:`.config`: Triton's ``--metrics-config`` (a value each server hands its Core; no process state);
- :mod:`.counters`: what one model version accumulates (:class:`VersionCounters`);
- :mod:`.prometheus`: the Prometheus text, under Triton's names;
- :mod:`.gateway`: queue and token metrics under the names the inference gateway's endpoint picker reads;
- :mod:`.custom`: the metric families a model defines (``pb_utils.MetricFamily``), one registry per Core.
"""

from .config import MetricsConfig
from .counters import (
    FAILURE_REASONS,
    BatchStats,
    LatencyMetrics,
    TimedCount,
    VersionCounters,
    WindowQuantiles,
    failure_reason,
)
from .prometheus import (
    EXPORTED_NAMES,
    ModelCounters,
    add_registry,
    exposition_text,
    model_counters,
    model_families,
    prometheus_text,
)

__all__ = [
    "EXPORTED_NAMES",
    "FAILURE_REASONS",
    "BatchStats",
    "LatencyMetrics",
    "MetricsConfig",
    "ModelCounters",
    "TimedCount",
    "VersionCounters",
    "WindowQuantiles",
    "add_registry",
    "exposition_text",
    "failure_reason",
    "model_counters",
    "model_families",
    "prometheus_text",
]

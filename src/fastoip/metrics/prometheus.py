"""Prometheus text of the Core's statistics, under Triton's metric names, help texts and labels.

Rules:
- ``nv_inference_*{model, version}`` as Triton names them, so dashboards and alerts written for Triton
  read fastoip unchanged.
- Families are built as ``prometheus_client`` ``Metric`` objects and the histogram is the library's
  ``Histogram``; the text is written by ``exposition_text`` because the library's writer renames every
  counter family to ``<name>_total`` in its ``# TYPE`` line, and Triton's counters
  (``nv_inference_request_success``) have no such suffix.  Tests read the text back with
  ``prometheus_client.parser``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ..metric_names import METRIC_NAME, safe_label_name
from .config import MetricsConfig
from .counters import FAILURE_REASONS, SUMMARIES, VersionCounters
from .gateway import GATEWAY_NAMES


@dataclass(frozen=True)
class ModelCounters:
    """What the Prometheus counters need from one version's statistics (see ``model_counters``)."""

    model: str
    version: str
    success: int
    failure: int
    inference_count: int
    execution_count: int
    success_ns: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    cache_hits: int = 0
    cache_hit_ns: int = 0
    cache_misses: int = 0
    cache_miss_ns: int = 0


def model_counters(statistics: Iterable[Any]) -> list[ModelCounters]:
    """The one place that reads the Core's statistics answer (Triton's ModelStatistics shape).

    Accepts today's dicts and objects with the same field names (``inference_stats.success.count``).
    """

    def get(node: Any, key: str) -> Any:
        return node[key] if isinstance(node, Mapping) else getattr(node, key)

    counters = []
    for stats in statistics:
        inference = get(stats, "inference_stats")
        counters.append(ModelCounters(
            model=str(get(stats, "name")),
            version=str(get(stats, "version")),
            success=int(get(get(inference, "success"), "count")),
            failure=int(get(get(inference, "fail"), "count")),
            inference_count=int(get(stats, "inference_count")),
            execution_count=int(get(stats, "execution_count")),
            success_ns=int(get(get(inference, "success"), "ns")),
            queue_ns=int(get(get(inference, "queue"), "ns")),
            compute_input_ns=int(get(get(inference, "compute_input"), "ns")),
            compute_infer_ns=int(get(get(inference, "compute_infer"), "ns")),
            compute_output_ns=int(get(get(inference, "compute_output"), "ns")),
            cache_hits=int(get(get(inference, "cache_hit"), "count")),
            cache_hit_ns=int(get(get(inference, "cache_hit"), "ns")),
            cache_misses=int(get(get(inference, "cache_miss"), "count")),
            cache_miss_ns=int(get(get(inference, "cache_miss"), "ns")),
        ))
    return counters


#: Triton's per-model counters: (name, help, value).
_COUNTERS: tuple[tuple[str, str, Callable[[ModelCounters], int]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda c: c.success),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda c: c.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda c: c.execution_count),
)
#: Latency counters, which ``counter_latencies=false`` turns off (Triton counts successful requests only).
_LATENCY_COUNTERS: tuple[tuple[str, str, Callable[[ModelCounters], int]], ...] = (
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda c: c.success_ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda c: c.queue_ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda c: c.compute_input_ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda c: c.compute_infer_ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda c: c.compute_output_ns // 1000),
)

#: Triton's per-model response-cache counters, only for versions the cache applies to (and, as in Triton,
#: only while latency counters are on).
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelCounters], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda c: c.cache_hits),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda c: c.cache_misses),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda c: c.cache_hit_ns // 1000),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda c: c.cache_miss_ns // 1000),
)

#: Every metric family name fastoip can export (the dashboard and autoscaling manifests use only these).
EXPORTED_NAMES: frozenset[str] = frozenset(
    [name for name, _, _ in _COUNTERS + _LATENCY_COUNTERS + _CACHE_COUNTERS]
    + ["nv_inference_request_failure", "nv_inference_pending_request_count",
       "nv_inference_first_response_histogram_ms"]
    + [name for name, _ in SUMMARIES.values()]
    + sorted(GATEWAY_NAMES)
)


def model_families(
    statistics: Iterable[Any],
    pending: Mapping[tuple[str, str], int],
    failures: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
    latency: Mapping[tuple[str, str], VersionCounters] | None = None,
    config: MetricsConfig | None = None,
    cached: frozenset[tuple[str, str]] = frozenset(),
) -> list[Metric]:
    """Triton's per-model families from the Core's statistics, pending counts and failure reasons.

    ``cached``: the (model, version) pairs the response cache applies to; only they get the
    ``nv_cache_*`` families, as in Triton.
    """
    config = config or MetricsConfig()
    counters = model_counters(statistics)
    labelled = [({"model": c.model, "version": c.version}, c) for c in counters]
    families: list[Metric] = []
    for name, help_text, value in _COUNTERS[:1]:
        families.append(_family(name, help_text, "counter", ((labels, value(c)) for labels, c in labelled)))
    failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                     "counter")
    for _, c in labelled:
        reasons = (failures or {}).get((c.model, c.version)) or {"OTHER": c.failure}
        for reason in FAILURE_REASONS:
            # labels in name order, as Triton's (prometheus-cpp) writes them: Triton's QA matches the line
            failure.add_sample(failure.name, {"model": c.model, "reason": reason, "version": c.version},
                               reasons.get(reason, 0))
    families.append(failure)
    for name, help_text, value in _COUNTERS[1:] + (_LATENCY_COUNTERS if config.counter_latencies else ()):
        families.append(_family(name, help_text, "counter", ((labels, value(c)) for labels, c in labelled)))
    families.append(_family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        ((labels, pending.get((c.model, c.version), 0)) for labels, c in labelled),
    ))
    with_cache = [(labels, c) for labels, c in labelled if (c.model, c.version) in cached]
    if with_cache and config.counter_latencies:
        for name, help_text, value in _CACHE_COUNTERS:
            families.append(_family(name, help_text, "counter", ((labels, value(c)) for labels, c in with_cache)))
    by_name: dict[str, Metric] = {}
    for labels, c in labelled:
        stats = (latency or {}).get((c.model, c.version))
        uses_cache = (c.model, c.version) in cached
        for family in stats.latency_families(labels, uses_cache) if stats is not None else ():
            merged = by_name.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            merged.samples.extend(family.samples)
    families.extend(by_name.values())
    return families


def _family(name: str, help_text: str, kind: str, samples: Iterable[tuple[dict[str, str], float]]) -> Metric:
    family = Metric(name, help_text, kind)
    for labels, value in samples:
        family.add_sample(name, labels, value)
    return family


def prometheus_text(
    snapshots: list[dict],
    pending: dict[tuple[str, str], int],
    models: Mapping[tuple[str, str], VersionCounters] | None = None,
    cached: frozenset[tuple[str, str]] = frozenset(),
    config: MetricsConfig | None = None,
) -> str:
    """Prometheus text exposition (format 0.0.4) of ``snapshots``; ``pending``: queued requests per model.

    ``models``: the versions' ``VersionCounters``, for failure reasons and latency summaries/histograms;
    ``cached``: the versions the response cache applies to; ``config``: the server's metrics settings.
    """
    failures = {key: stats.failure_counts() for key, stats in (models or {}).items()}
    families = model_families(snapshots, pending, failures, models, config, cached)
    for registry in _registries:
        families = [*families, *registry.collect()]
    return exposition_text(families)


#: Other prometheus_client registries exported after fastoip's families (MLServer runtimes' custom metrics).
#: Process-wide, as prometheus_client's own default registry that MLServer runtimes write to.
_registries: list[Any] = []


def add_registry(registry: Any) -> None:
    """Export ``registry``'s families (a prometheus_client ``CollectorRegistry``) on /metrics too."""
    if registry not in _registries:
        _registries.append(registry)


def exposition_text(families: Iterable[Metric]) -> str:
    """Prometheus text format 0.0.4, family names exactly as given (see the module docstring).

    What a family holds is written so that it can never be read as another line: a family or sample whose name
    breaks Prometheus' rules is left out (one bad family never fails the whole scrape), label names are escaped
    to underscores and label values as the format says (a label could forge ``nv_inference_request_success``).
    """
    lines: list[str] = []
    for family in families:
        if not METRIC_NAME.fullmatch(family.name):
            continue
        documentation = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {documentation}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            if not METRIC_NAME.fullmatch(sample.name):
                continue
            labels = ",".join(
                f'{safe_label_name(str(key))}="{_escape(str(value))}"' for key, value in sample.labels.items()
            )
            lines.append(f"{sample.name}{{{labels}}} {_value(sample.value)}" if labels
                         else f"{sample.name} {_value(sample.value)}")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:  # the exposition format escapes backslash, quote and newline in label values
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    # integers as integers (cumulative nanosecond counters exceed a float's exact range); the rest as Go does
    return str(value) if isinstance(value, int) else floatToGoString(value)

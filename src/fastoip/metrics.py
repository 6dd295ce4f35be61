"""Per model-version statistics: the numbers behind Triton's ModelStatistics and its Prometheus metrics.

Rules:
- Counters only grow; durations are cumulative nanoseconds, as Triton reports them.
- A request is counted once, as success or failure; a failure carries Triton's
  reason (REJECTED, CANCELED, BACKEND, OTHER).  Executions are counted per batch,
  with per-batch-size compute time split into input, infer and output.
- Updates come from many threads: each update takes one lock for a handful of
  integer additions.  Latency summaries and histograms (``--metrics-config``)
  cost nothing unless turned on.
- ``prometheus_text`` renders under Triton's metric names, help texts and labels
  (``nv_inference_*{model, version}``), so dashboards and alerts written for
  Triton read fastoip unchanged.

Exposition: families are built as ``prometheus_client`` ``Metric`` objects and the
histogram is the library's ``Histogram``; the text is written by ``exposition_text``
because the library's writer renames every counter family to ``<name>_total`` in
its ``# TYPE`` line, and Triton's counters (``nv_inference_request_success``) have
no such suffix.  Tests read the text back with ``prometheus_client.parser``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from .errors import Cancelled, DeadlineExceeded, InternalError, Unavailable

#: Triton's default summary quantiles: (quantile, allowed error).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001),
                                                       (0.999, 0.001))
#: Triton's default first-response histogram buckets, in milliseconds.
DEFAULT_FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100, 500, 2000, 5000)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(frozen=True)
class MetricsConfig:
    """Triton's ``--metrics-config`` settings (server-wide, as in Triton)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    #: prometheus-cpp's summary window: quantiles describe the last ``max_age_s`` seconds.
    summary_max_age_s: float = 60.0

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


_config = MetricsConfig()


def configure(config: MetricsConfig) -> None:
    """Set the process-wide metrics settings; models loaded afterwards follow them (the server sets it first)."""
    global _config
    _config = config


def current_config() -> MetricsConfig:
    return _config


def failure_reason(error: BaseException | None) -> str:
    """Triton's failure reason for an error: queue refusals and timeouts are REJECTED, a backend's error BACKEND."""
    if isinstance(error, Cancelled):
        return "CANCELED"
    if isinstance(error, (Unavailable, DeadlineExceeded)):
        return "REJECTED"
    if isinstance(error, InternalError):
        return "BACKEND"
    return "OTHER"


@dataclass
class Duration:
    """A count and a cumulative duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchStats:
    """Compute time of executions of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class WindowQuantiles:
    """Quantiles of the observations of the last ``max_age_s`` seconds, plus all-time count and sum.

    Like prometheus-cpp's summary, the window is made of ``age_buckets`` slices that
    rotate out one at a time.  Each slice keeps a uniform sample of at most
    ``slice_capacity`` values (reservoir sampling), so memory is bounded at any rate
    and quantiles are those of the sample.  The caller holds the lock.
    """

    def __init__(
        self,
        max_age_s: float = 60.0,
        age_buckets: int = 5,
        slice_capacity: int = 2048,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.count = 0
        self.sum = 0.0
        self._slice_s = max_age_s / age_buckets
        self._capacity = slice_capacity
        self._clock = clock
        # (slice start, values kept, values seen)
        self._slices: list[tuple[float, list[float], list[int]]] = []
        self._age_buckets = age_buckets
        self._random = random.Random(0)

    def observe(self, value: float, times: int = 1) -> None:
        self.count += times
        self.sum += value * times
        now = self._clock()
        if not self._slices or now - self._slices[-1][0] >= self._slice_s:
            self._slices.append((now, [], [0]))
            del self._slices[: -self._age_buckets]
        _, kept, seen = self._slices[-1]
        for _ in range(times):
            seen[0] += 1
            if len(kept) < self._capacity:
                kept.append(value)
            else:
                slot = self._random.randrange(seen[0])
                if slot < self._capacity:
                    kept[slot] = value

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Nearest-rank quantiles over the window; NaN when it saw nothing (as prometheus-cpp)."""
        horizon = self._clock() - self._slice_s * self._age_buckets
        values = sorted(v for start, kept, _ in self._slices if start + self._slice_s > horizon for v in kept)
        if not values:
            return [float("nan")] * len(qs)
        last = len(values) - 1
        return [values[min(last, max(0, round(q * last)))] for q in qs]


class LatencyMetrics:
    """The per-request latency summaries and histogram that ``--metrics-config`` turns on."""

    SUMMARIES = ("request", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self.summaries: dict[str, WindowQuantiles] | None = (
            {key: WindowQuantiles(config.summary_max_age_s) for key in self.SUMMARIES}
            if config.summary_latencies
            else None
        )
        self.first_response_ms: Histogram | None = (
            Histogram("nv_inference_first_response_histogram_ms", "", buckets=DEFAULT_FIRST_RESPONSE_BUCKETS_MS,
                      registry=None)
            if config.histogram_latencies
            else None
        )


class ModelStatistics:
    """Statistics of one loaded model version."""

    def __init__(self, name: str, version: str, config: MetricsConfig | None = None) -> None:
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.batches: dict[int, BatchStats] = {}
        config = config or _config
        self.latency: LatencyMetrics | None = (
            LatencyMetrics(config) if config.summary_latencies or config.histogram_latencies else None
        )
        self._summaries = self.latency.summaries if self.latency is not None else None

    def clear(self) -> None:
        """Forget everything recorded so far (warm-up runs are not the model's traffic, as in Triton)."""
        with self.lock:
            self.last_inference_ms = 0
            self.inference_count = 0
            self.execution_count = 0
            self.success, self.fail, self.queue = Duration(), Duration(), Duration()
            self.failures = dict.fromkeys(FAILURE_REASONS, 0)
            self.compute_input, self.compute_infer, self.compute_output = Duration(), Duration(), Duration()
            self.cache_hit, self.cache_miss = Duration(), Duration()
            self.batches = {}

    def record_cache(self, hit: bool, lookup_ns: int) -> None:
        """One response-cache lookup (Triton's cache_hit / cache_miss statistics: count and time)."""
        with self.lock:
            duration = self.cache_hit if hit else self.cache_miss
            duration.count += 1
            duration.ns += lookup_ns
            if self._summaries is not None:
                self._summaries["cache_hit" if hit else "cache_miss"].observe(lookup_ns / 1000)

    def record_execution(
        self, batch_size: int, request_count: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One backend execution of ``batch_size`` items made of ``request_count`` requests."""
        now_ms = int(time.time() * 1000)
        with self.lock:
            self.execution_count += 1
            self.inference_count += batch_size
            self.last_inference_ms = now_ms
            # Triton counts compute durations once per request, not per batch.
            compute = self.compute_input
            compute.count += request_count
            compute.ns += input_ns * request_count
            compute = self.compute_infer
            compute.count += request_count
            compute.ns += infer_ns * request_count
            compute = self.compute_output
            compute.count += request_count
            compute.ns += output_ns * request_count
            stats = self.batches.get(batch_size)
            if stats is None:
                stats = self.batches[batch_size] = BatchStats()
            stats.compute_input.add(input_ns)
            stats.compute_infer.add(infer_ns)
            stats.compute_output.add(output_ns)
            summaries = self._summaries
            if summaries is not None:  # each request of the batch saw these compute times, as in Triton
                summaries["compute_input"].observe(input_ns / 1000, request_count)
                summaries["compute_infer"].observe(infer_ns / 1000, request_count)
                summaries["compute_output"].observe(output_ns / 1000, request_count)

    def record_request(
        self, ok: bool, total_ns: int, queue_ns: int = 0, error: BaseException | None = None
    ) -> None:
        """One request finished (successfully or not, ``error`` saying why) after ``total_ns``."""
        with self.lock:
            if ok:
                self.success.count += 1
                self.success.ns += total_ns
                self.queue.count += 1
                self.queue.ns += queue_ns
                if self.latency is not None:
                    self._observe_success(total_ns, queue_ns)
            else:
                self.fail.count += 1
                self.fail.ns += total_ns
                self.failures[failure_reason(error)] += 1

    def _observe_success(self, total_ns: int, queue_ns: int) -> None:
        latency = self.latency
        assert latency is not None
        if latency.summaries is not None:
            latency.summaries["request"].observe(total_ns / 1000)
            latency.summaries["queue"].observe(queue_ns / 1000)
        if latency.first_response_ms is not None:  # one response per request: the first is the whole request
            latency.first_response_ms.observe(total_ns // 1_000_000)

    def failure_counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.failures)

    def latency_families(self, labels: Mapping[str, str], cache_enabled: bool = False) -> list[Metric]:
        """Summary and histogram families of this version (empty unless turned on).

        ``cache_enabled``: the response cache applies to this version.  Then, as in Triton,
        the cache hit/miss summaries appear and the request summary does not (Triton
        leaves it out because cache bookkeeping would make it misleading).
        """
        latency = self.latency
        if latency is None:
            return []
        families = []
        if latency.summaries is not None:
            qs = [q for q, _ in latency.config.summary_quantiles]
            hidden = ("request",) if cache_enabled else _CACHE_SUMMARIES
            with self.lock:
                snapshot = {key: (s.quantiles(qs), s.count, s.sum)
                            for key, s in latency.summaries.items() if key not in hidden}
            for key, (values, count, total) in snapshot.items():
                name, help_text = _SUMMARIES[key]
                family = Metric(name, help_text, "summary")
                for q, value in zip(qs, values, strict=True):
                    family.add_sample(name, {**labels, "quantile": floatToGoString(q)}, value)
                family.add_sample(name + "_sum", dict(labels), total)
                family.add_sample(name + "_count", dict(labels), count)
                families.append(family)
        if latency.first_response_ms is not None:
            name = "nv_inference_first_response_histogram_ms"
            family = Metric(name, "Duration from request to first response in milliseconds", "histogram")
            for collected in latency.first_response_ms.collect():
                for sample in collected.samples:
                    if not sample.name.endswith("_created"):
                        family.add_sample(sample.name, {**labels, **sample.labels}, sample.value)
            families.append(family)
        return families

    def snapshot(self) -> dict:
        """A plain-dict copy in Triton's ModelStatistics JSON shape."""
        with self.lock:

            def dur(d: Duration) -> dict:
                return {"count": d.count, "ns": d.ns}

            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": dur(self.success),
                    "fail": dur(self.fail),
                    "queue": dur(self.queue),
                    "compute_input": dur(self.compute_input),
                    "compute_infer": dur(self.compute_infer),
                    "compute_output": dur(self.compute_output),
                    "cache_hit": dur(self.cache_hit),
                    "cache_miss": dur(self.cache_miss),
                },
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": dur(b.compute_input),
                        "compute_infer": dur(b.compute_infer),
                        "compute_output": dur(b.compute_output),
                    }
                    for size, b in sorted(self.batches.items())
                ],
            }


_SUMMARIES = {
    "request": ("nv_inference_request_summary_us",
                "Summary of inference request duration in microseconds (includes cached requests)"),
    "queue": ("nv_inference_queue_summary_us",
              "Summary of inference queuing duration in microseconds (includes cached requests)"),
    "compute_input": ("nv_inference_compute_input_summary_us",
                      "Cumulative compute input duration in microseconds (does not include cached requests)"),
    "compute_infer": ("nv_inference_compute_infer_summary_us",
                      "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    "compute_output": ("nv_inference_compute_output_summary_us",
                       "Cumulative inference compute output duration in microseconds "
                       "(does not include cached requests)"),
    "cache_hit": ("nv_cache_hit_summary_per_model",
                  "Summary of cache hit counts/durations per model, in microseconds."),
    "cache_miss": ("nv_cache_miss_summary_per_model",
                   "Summary of cache miss counts/durations per model, in microseconds."),
}
#: Summaries only a version with the response cache has.
_CACHE_SUMMARIES = ("cache_hit", "cache_miss")


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
    + [name for name, _ in _SUMMARIES.values()]
)


def model_families(
    statistics: Iterable[Any],
    pending: Mapping[tuple[str, str], int],
    failures: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
    latency: Mapping[tuple[str, str], ModelStatistics] | None = None,
    config: MetricsConfig | None = None,
    cached: frozenset[tuple[str, str]] = frozenset(),
) -> list[Metric]:
    """Triton's per-model families from the Core's statistics, pending counts and failure reasons.

    ``cached``: the (model, version) pairs the response cache applies to; only they get the
    ``nv_cache_*`` families, as in Triton.
    """
    config = config or _config
    counters = model_counters(statistics)
    labelled = [({"model": c.model, "version": c.version}, c) for c in counters]
    families: list[Metric] = []
    for name, help_text, value in _COUNTERS[:1]:
        families.append(_family(name, help_text, "counter", ((labels, value(c)) for labels, c in labelled)))
    failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                     "counter")
    for labels, c in labelled:
        reasons = (failures or {}).get((c.model, c.version)) or {"OTHER": c.failure}
        for reason in FAILURE_REASONS:
            failure.add_sample(failure.name, {**labels, "reason": reason}, reasons.get(reason, 0))
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
    models: Mapping[tuple[str, str], ModelStatistics] | None = None,
    cached: frozenset[tuple[str, str]] = frozenset(),
) -> str:
    """Prometheus text exposition (format 0.0.4) of ``snapshots``; ``pending``: queued requests per model.

    ``models``: the versions' ``ModelStatistics``, for failure reasons and latency summaries/histograms;
    ``cached``: the versions the response cache applies to.
    """
    failures = {key: stats.failure_counts() for key, stats in (models or {}).items()}
    families = model_families(snapshots, pending, failures, models, cached=cached)
    for registry in _registries:
        families = [*families, *registry.collect()]
    return exposition_text(families)


#: Other prometheus_client registries exported after fastoip's families (MLServer runtimes' custom metrics).
_registries: list[Any] = []


def add_registry(registry: Any) -> None:
    """Export ``registry``'s families (a prometheus_client ``CollectorRegistry``) on /metrics too."""
    if registry not in _registries:
        _registries.append(registry)


def exposition_text(families: Iterable[Metric]) -> str:
    """Prometheus text format 0.0.4, family names exactly as given (see the module docstring)."""
    lines: list[str] = []
    for family in families:
        documentation = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {documentation}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels.items())
            lines.append(f"{sample.name}{{{labels}}} {_value(sample.value)}" if labels
                         else f"{sample.name} {_value(sample.value)}")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:  # the exposition format escapes backslash, quote and newline in label values
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    # integers as integers (cumulative nanosecond counters exceed a float's exact range); the rest as Go does
    return str(value) if isinstance(value, int) else floatToGoString(value)

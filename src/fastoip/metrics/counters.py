"""What one model version accumulates: the numbers behind Triton's statistics and its Prometheus metrics.

Rules:
- Counters only grow; durations are cumulative nanoseconds, as Triton reports them.
- A request is counted once, as success or failure; a failure carries Triton's
  reason (REJECTED, CANCELED, BACKEND, OTHER).  Executions are counted per batch,
  with per-batch-size compute time split into input, infer and output.
- Updates come from many threads: each update takes one lock for a handful of
  integer additions.  Latency summaries and histograms (the server's
  :class:`~.config.MetricsConfig`) cost nothing unless turned on.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ..errors import Cancelled, DeadlineExceeded, InternalError, Unavailable
from .config import MetricsConfig

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


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
class TimedCount:
    """A count and a cumulative duration in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchStats:
    """Compute time of executions of one batch size."""

    compute_input: TimedCount = field(default_factory=TimedCount)
    compute_infer: TimedCount = field(default_factory=TimedCount)
    compute_output: TimedCount = field(default_factory=TimedCount)


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
            Histogram("nv_inference_first_response_histogram_ms", "", buckets=config.first_response_buckets_ms,
                      registry=None)
            if config.histogram_latencies
            else None
        )


class VersionCounters:
    """The statistics one loaded model version accumulates (the Core answers them as ``ModelStatistics``)."""

    def __init__(self, name: str, version: str, config: MetricsConfig | None = None) -> None:
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = TimedCount()
        self.fail = TimedCount()
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.queue = TimedCount()
        self.compute_input = TimedCount()
        self.compute_infer = TimedCount()
        self.compute_output = TimedCount()
        self.cache_hit = TimedCount()
        self.cache_miss = TimedCount()
        self.batches: dict[int, BatchStats] = {}
        config = config or MetricsConfig()
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
            self.success, self.fail, self.queue = TimedCount(), TimedCount(), TimedCount()
            self.failures = dict.fromkeys(FAILURE_REASONS, 0)
            self.compute_input, self.compute_infer, self.compute_output = TimedCount(), TimedCount(), TimedCount()
            self.cache_hit, self.cache_miss = TimedCount(), TimedCount()
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
        lock = self.lock
        lock.acquire()  # (not `with`: a request's every lock is taken without mypyc's two lookups and calls)
        try:
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
        finally:
            lock.release()

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
                name, help_text = SUMMARIES[key]
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

            def dur(d: TimedCount) -> dict:
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


#: Triton's latency summary families: key -> (name, help).
SUMMARIES = {
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

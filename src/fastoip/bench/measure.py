"""Measurement windows, perf_analyzer's stability rule, percentiles, server-side deltas.

One level (a concurrency or a request rate) is measured like this:

1. start the load, let it run ``warmup_ms`` (discarded);
2. cut back-to-back windows of ``window_ms``; at each boundary read the
   server's statistics (when it has the ``statistics`` extension);
3. stop as soon as the last 3 windows are *stable*: each one's throughput and
   latency (the average, or ``--percentile``'s value) lies within
   ``stability_pct`` % of the three windows' mean (perf_analyzer's rule); or
   after ``max_trials`` windows, flagged ``stable: false``; or after 3 windows
   in a row without a single success (a dead server is not measured longer);
4. report the last 3 windows merged: pooled latencies, summed counts over
   their summed duration.

perf_analyzer's other measurement modes: ``measurement_mode="count_windows"``
ends each window once ``measurement_request_count`` requests completed (success
or failure) instead of after ``window_ms``; ``request_count`` measures a single
window that ends once that many requests completed, without the stability rule
(the generator keeps its level until then, so a window may hold a few more);
``warmup_request_count`` warms up until that many requests completed instead of
for ``warmup_ms``.  Counted windows are cut in short slices (``TICK_S`` /
``COUNT_TICK_S``) that are merged, so their boundaries are as precise as a slice.

Latencies are per successful request, from just before the send to the
completion callback (``time.perf_counter_ns``); failed requests are counted by
status and kept out of the percentiles.  Throughput counts successes only:
``throughput_req_per_s`` requests and ``throughput_infer_per_s`` = requests x
batch size.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .control import DURATIONS
from .load import Generator, Sample, now_ns

PERCENTILES = (50, 90, 95, 99)
#: Windows merged into the reported figure (and inspected by the stability rule).
STABLE_WINDOWS = 3
#: The progress display is refreshed this often during a window.
TICK_S = 0.5
#: Counted windows and warm-ups look at the completions this often.
COUNT_TICK_S = 0.01


@dataclass
class MeasureOptions:
    window_ms: int = 5000
    warmup_ms: int = 1000
    max_trials: int = 10
    stability_pct: float = 10.0
    #: Stability on this latency percentile instead of the average.
    percentile: Optional[int] = None
    drain_s: float = 10.0
    measurement_mode: str = "time_windows"  # time_windows | count_windows
    measurement_request_count: int = 50
    #: > 0: one window of this many completed requests, no stability rule.
    request_count: int = 0
    #: > 0: warm up until this many requests completed (instead of warmup_ms).
    warmup_request_count: int = 0
    #: No counted window or warm-up lasts longer than this: a server that stopped answering ends it.
    count_timeout_s: float = 120.0


def machine_busy_seconds() -> Optional[float]:
    """CPU seconds all CPUs spent busy since boot (Linux /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def latency_summary(lat_ns: np.ndarray) -> dict[str, Optional[float]]:
    """avg and p50/p90/p95/p99 in microseconds (None without samples)."""
    if lat_ns.size == 0:
        return {"avg": None, **{f"p{p}": None for p in PERCENTILES}}
    values = np.percentile(lat_ns, PERCENTILES)
    summary: dict[str, Optional[float]] = {"avg": float(lat_ns.mean()) / 1e3}
    summary.update({f"p{p}": float(v) / 1e3 for p, v in zip(PERCENTILES, values)})
    return summary


def stats_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Counter differences between two statistics snapshots (see control.STAT_KEYS)."""
    if before is None or after is None:
        return None
    delta: dict[str, Any] = {}
    for key in DURATIONS:
        delta[key] = [after[key][0] - before[key][0], after[key][1] - before[key][1]]
    for key in ("inference_count", "execution_count"):
        delta[key] = after[key] - before[key]
    return delta


def sum_deltas(deltas: list[Optional[dict]]) -> Optional[dict]:
    if not deltas or any(d is None for d in deltas):
        return None
    total: dict[str, Any] = {}
    for key in DURATIONS:
        total[key] = [sum(d[key][0] for d in deltas), sum(d[key][1] for d in deltas)]  # type: ignore[index]
    for key in ("inference_count", "execution_count"):
        total[key] = sum(d[key] for d in deltas)  # type: ignore[index]
    return total


def server_split(delta: Optional[dict]) -> Optional[dict]:
    """The server's own view of a window: average µs per request in each stage, batch size."""
    if delta is None:
        return None

    def avg_us(key: str) -> Optional[float]:
        count, ns = delta[key]
        return ns / count / 1e3 if count > 0 else None

    executions = delta["execution_count"]
    return {
        "requests": delta["success"][0],
        "failures": delta["fail"][0],
        "request_us": avg_us("success"),
        "queue_us": avg_us("queue"),
        "compute_input_us": avg_us("compute_input"),
        "compute_infer_us": avg_us("compute_infer"),
        "compute_output_us": avg_us("compute_output"),
        "inference_count": delta["inference_count"],
        "execution_count": executions,
        "avg_batch_size": delta["inference_count"] / executions if executions > 0 else None,
    }


@dataclass
class Window:
    start_ns: int
    end_ns: int
    sample: Sample
    server: Optional[dict] = None
    server_cpu_s: Optional[float] = None
    machine_cpu_s: Optional[float] = None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def successes(self) -> int:
        return int(self.sample.lat_ns.size)

    @property
    def req_per_s(self) -> float:
        return self.successes / self.duration_s if self.duration_s > 0 else 0.0

    def latency_us(self, percentile: Optional[int]) -> Optional[float]:
        lat = self.sample.lat_ns
        if lat.size == 0:
            return None
        value = lat.mean() if percentile is None else np.percentile(lat, percentile)
        return float(value) / 1e3


def is_stable(windows: list[Window], stability_pct: float, percentile: Optional[int]) -> bool:
    """perf_analyzer's rule on the last 3 windows (module docstring)."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    throughput = [w.req_per_s for w in last]
    latency = [w.latency_us(percentile) for w in last]
    if any(t <= 0 for t in throughput) or any(v is None for v in latency):
        return False
    for values in (throughput, latency):
        mean = sum(values) / len(values)  # type: ignore[arg-type]
        if any(abs(v - mean) > mean * stability_pct / 100.0 for v in values):  # type: ignore[operator]
            return False
    return True


@dataclass
class LevelResult:
    """One measured level: every window, and the merged last ones."""

    mode: str  # concurrency | request_rate
    level: float
    batch_size: int
    stable: bool
    windows: list[Window] = field(default_factory=list)
    window_ms: int = 0

    @property
    def reported(self) -> list[Window]:
        return self.windows[-STABLE_WINDOWS:]

    def merged(self) -> tuple[Sample, float]:
        windows = self.reported
        return Sample.merge([w.sample for w in windows]), sum(w.duration_s for w in windows)

    def to_dict(self) -> dict:
        """The result row of the JSON schema (report.py) without model/target."""
        sample, duration = self.merged()
        requests = int(sample.lat_ns.size)
        req_per_s = requests / duration if duration > 0 else 0.0
        server_cpu = [w.server_cpu_s for w in self.reported]
        machine_cpu = [w.machine_cpu_s for w in self.reported]
        other = None
        if duration > 0 and machine_cpu and all(c is not None for c in machine_cpu):
            used = sample.cpu_ns / 1e9 + sum(c for c in server_cpu if c is not None)
            other = max(0.0, 100.0 * (sum(machine_cpu) - used) / duration)  # type: ignore[arg-type]
        return {
            "mode": self.mode,
            "concurrency": int(self.level) if self.mode == "concurrency" else None,
            "request_rate": float(self.level) if self.mode == "request_rate" else None,
            "batch_size": self.batch_size,
            "throughput_infer_per_s": req_per_s * self.batch_size,
            "throughput_req_per_s": req_per_s,
            "latency_us": latency_summary(sample.lat_ns),
            "errors": dict(sorted(sample.errors.items())),
            "requests": requests,
            "stable": self.stable,
            "windows": len(self.windows),
            "window_ms": self.window_ms,
            "duration_s": duration,
            "send_rate_per_s": sample.sent / duration if duration > 0 else 0.0,
            "late_sends": sample.late,
            "client_cpu_percent": 100.0 * sample.cpu_ns / 1e9 / duration if duration > 0 else None,
            "server_cpu_percent": (
                100.0 * sum(server_cpu) / duration  # type: ignore[arg-type]
                if duration > 0 and server_cpu and all(c is not None for c in server_cpu)
                else None
            ),
            "other_cpu_percent": other,
            "server": server_split(sum_deltas([w.server for w in self.reported])),
        }


def completed(sample: Sample) -> int:
    return int(sample.lat_ns.size) + sum(sample.errors.values())


def cut_counted(generator: Generator, a: int, count: int, timeout_s: float) -> tuple[Sample, int]:
    """Cut slices from ``a`` on until ``count`` requests completed (or ``timeout_s``); the merged sample and its end."""
    slices: list[Sample] = []
    done, start = 0, now_ns()
    while done < count and now_ns() - start < timeout_s * 1e9:
        time.sleep(COUNT_TICK_S)
        b = now_ns()
        piece = generator.cut(a, b)
        slices.append(piece)
        done += completed(piece)
        a = b
    return Sample.merge(slices), a


def measure_level(
    generator: Generator,
    mode: str,
    level: float,
    batch_size: int,
    options: MeasureOptions,
    stats: Optional[Callable[[], Optional[dict]]] = None,
    server_cpu: Optional[Callable[[], Optional[float]]] = None,
    progress: Optional[Callable[[str, "LevelResult"], None]] = None,
) -> LevelResult:
    """Run one level to stability (module docstring); the generator is stopped on return."""
    result = LevelResult(mode, level, batch_size, False, window_ms=options.window_ms)
    if mode == "concurrency":
        generator.start_concurrency(int(level))
    else:
        generator.start_rate(float(level))
    try:
        if progress:
            progress("warmup", result)
        if options.warmup_request_count > 0:
            cut_counted(generator, 0, options.warmup_request_count, options.count_timeout_s)
        else:
            time.sleep(options.warmup_ms / 1e3)
        before = stats() if stats else None
        cpu_before = server_cpu() if server_cpu else None
        machine_before = machine_busy_seconds()
        a = now_ns()
        generator.cut(0, a)  # drop the warm-up
        step = int(options.window_ms * 1e6)
        counted = options.request_count or (
            options.measurement_request_count if options.measurement_mode == "count_windows" else 0
        )
        while len(result.windows) < (1 if options.request_count else max(1, options.max_trials)):
            if counted:
                sample, b = cut_counted(generator, a, counted, options.count_timeout_s)
            else:
                b = a + step
                while True:
                    remaining = b - now_ns()
                    if remaining <= 0:
                        break
                    time.sleep(min(remaining / 1e9, TICK_S))
                    if progress and remaining > TICK_S * 1e9:
                        progress("tick", result)
                b = now_ns()
                sample = generator.cut(a, b)
            machine_after = machine_busy_seconds()
            after = stats() if stats else None
            cpu_after = server_cpu() if server_cpu else None
            cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
            machine = (
                machine_after - machine_before if machine_after is not None and machine_before is not None else None
            )
            result.windows.append(Window(a, b, sample, stats_delta(before, after), cpu, machine))
            a, before, cpu_before, machine_before = b, after, cpu_after, machine_after
            if progress:
                progress("window", result)
            if options.request_count:
                result.stable = completed(sample) >= options.request_count  # the one window asked for, complete
                break
            if is_stable(result.windows, options.stability_pct, options.percentile):
                result.stable = True
                break
            last = result.windows[-STABLE_WINDOWS:]
            if len(last) == STABLE_WINDOWS and all(w.successes == 0 for w in last):
                break
    finally:
        generator.stop(options.drain_s)
    return result

"""Per model-version statistics: the numbers behind Triton's ModelStatistics and its Prometheus metrics.

Rules:
- Counters only grow; durations are cumulative nanoseconds, as Triton reports them.
- A request is counted once, as success or failure, with its whole duration
  (queue + compute).  Executions are counted per batch, with per-batch-size
  compute time split into input, infer and output.
- Updates come from many threads: each update takes one lock for a handful of
  integer additions.
- ``prometheus_text`` renders snapshots under Triton's metric names and labels
  (``nv_inference_*{model, version}``), so dashboards and alerts written for
  Triton read fastoip unchanged.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


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


class ModelStatistics:
    """Statistics of one loaded model version."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.batches: dict[int, BatchStats] = {}

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

    def record_request(self, ok: bool, total_ns: int, queue_ns: int = 0) -> None:
        """One request finished (successfully or not) after ``total_ns``."""
        with self.lock:
            if ok:
                self.success.count += 1
                self.success.ns += total_ns
                self.queue.count += 1
                self.queue.ns += queue_ns
            else:
                self.fail.count += 1
                self.fail.ns += total_ns

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
                    "cache_hit": {"count": 0, "ns": 0},
                    "cache_miss": {"count": 0, "ns": 0},
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


#: Triton's per-model counters: (name, help, value from a snapshot).
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     lambda s: s["inference_stats"]["fail"]["count"]),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)",
     lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "Number of model executions performed (a batch counts once)",
     lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"]) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s["inference_stats"]["compute_output"]["ns"] // 1000),
)


def prometheus_text(snapshots: list[dict], pending: dict[tuple[str, str], int]) -> str:
    """Prometheus text exposition (format 0.0.4) of ``snapshots``; ``pending``: queued requests per model."""
    lines: list[str] = []
    for name, help_text, value in _COUNTERS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} counter")
        lines += [f"{name}{{{_labels(s['name'], s['version'])}}} {value(s)}" for s in snapshots]
    name = "nv_inference_pending_request_count"
    lines.append(f"# HELP {name} Instantaneous number of pending requests awaiting execution per-model")
    lines.append(f"# TYPE {name} gauge")
    lines += [f"{name}{{{_labels(s['name'], s['version'])}}} {pending.get((s['name'], s['version']), 0)}" for s in snapshots]
    return "\n".join(lines) + "\n"


def _labels(model: str, version: str) -> str:
    def quoted(text: str) -> str:  # the exposition format escapes backslash, quote and newline
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    return f"model={quoted(model)},version={quoted(version)}"

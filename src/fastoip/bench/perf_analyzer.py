"""perf_analyzer compatibility: its CSV layout, its GPU metrics collection, the flags fastoip bench refuses.

Rules:
- ``-f`` writes perf_analyzer's latency report exactly: the header
  ``Concurrency`` (or ``Request Rate``), ``Inferences/Second``, ``Client Send``,
  the server columns when the server reports statistics (``Network+Server
  Send/Recv``, ``Server Queue``, ``Server Compute Input/Infer/Output``),
  ``Client Recv``, ``p50/p90/p95/p99 latency``, and with ``--verbose-csv``
  ``Avg latency`` (unless ``--percentile``), ``request/response``, ``response
  wait`` and, with ``--collect-metrics``, the four GPU columns; rows sorted by
  increasing throughput; times in whole microseconds; rates as C++ streams
  print a double.
- fastoip's client times each request as a whole (send to completion): it does
  not split off the time to serialize and send or to receive and deserialize,
  so ``Client Send`` and ``Client Recv`` are 0 and ``Network+Server Send/Recv``
  keeps that time, as perf_analyzer's own async gRPC client mostly reports.
- A perf_analyzer flag fastoip bench cannot honour is refused by name with the
  reason (``REFUSED``), never accepted and ignored.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterable
from typing import Any

from .target import BenchError

LATENCY_PERCENTILES = (50, 90, 95, 99)
GPU_COLUMNS = ("Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory")

#: perf_analyzer flags fastoip bench does not honour, with the reason given when one is passed.
REFUSED: dict[str, str] = {
    "--sequence-length": "fastoip bench does not drive sequence models yet (the server has a sequence batcher)",
    "--sequence-length-variation": "sequence models are not supported",
    "--sequence-id-range": "sequence models are not supported",
    "--num-of-sequences": "sequence models are not supported",
    "--serial-sequences": "sequence models are not supported",
    "--binary-search": "no latency-bounded search: give the levels with --concurrency-range",
    "--latency-threshold": "no latency-bounded search: give the levels with --concurrency-range",
    "--request-intervals": "only constant and poisson schedules (--request-distribution)",
    "--periodic-concurrency-range": "only fixed concurrency levels",
    "--request-period": "only fixed concurrency levels",
    "--service-kind": "only Triton/KServe V2 servers (gRPC or HTTP)",
    "--endpoint": "only Triton/KServe V2 servers (gRPC or HTTP)",
    "--model-signature-name": "only Triton/KServe V2 servers (gRPC or HTTP)",
    "--triton-server-directory": "no in-process C API: fastoip bench measures a server over the network",
    "--model-repository": "no in-process C API: fastoip bench measures a server over the network",
    "--bls-composing-models": "no per-composing-model statistics",
    "--output-shared-memory-size": "output regions are sized from the model's fixed output shapes",
    "--input-tensor-format": "gRPC sends raw contents; HTTP: --http-binary / --no-http-binary",
    "--output-tensor-format": "gRPC sends raw contents; HTTP: --http-binary / --no-http-binary",
    "--max-threads": "the load generators are asynchronous: no thread per request",
    "--enable-mpi": "no MPI: use --processes for several client processes",
    "--trace-level": "set tracing on the server (its trace settings API)",
    "--trace-rate": "set tracing on the server (its trace settings API)",
    "--trace-count": "set tracing on the server (its trace settings API)",
    "--log-frequency": "progress is shown live; -q turns it off",
    "--fixed-schedule": "only constant and poisson schedules (--request-distribution)",
    "--session-concurrency": "only fixed concurrency levels",
    "--grpc-method": "only inference.GRPCInferenceService/ModelInfer (and ModelStreamInfer)",
}


def cpp_double(value: float) -> str:
    """A double as C++'s ``operator<<`` writes it by default (``%g``, 6 significant digits)."""
    return format(value, "g")


def _us(value: float | None) -> int:
    return int(value) if value is not None else 0


def csv_text(rows: list[dict], verbose: bool = False, percentile: int | None = None, metrics: bool = False) -> str:
    """perf_analyzer's ``-f`` file for ``rows`` (one model's result rows, all of one mode)."""
    if not rows:
        return ""
    concurrency = rows[0]["mode"] == "concurrency"
    server_stats = all(row.get("server") for row in rows)
    header = ["Concurrency" if concurrency else "Request Rate", "Inferences/Second", "Client Send"]
    if server_stats:
        header += ["Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
                   "Server Compute Output"]
    header += ["Client Recv", *(f"p{p} latency" for p in LATENCY_PERCENTILES)]
    if verbose:
        header += (["Avg latency"] if percentile is None else []) + ["request/response", "response wait"]
        if metrics:
            header += list(GPU_COLUMNS)
    lines = [",".join(header)]
    for row in sorted(rows, key=lambda r: r["throughput_infer_per_s"]):
        latency = row["latency_us"]
        avg = _us(latency["avg"])
        send_us = recv_us = 0  # not measured apart (module docstring)
        fields = [str(row["concurrency"]) if concurrency else cpp_double(row["request_rate"]),
                  cpp_double(row["throughput_infer_per_s"]), str(send_us)]
        if server_stats:
            server = row["server"]
            queue = _us(server["queue_us"])
            stages = [_us(server[key]) for key in ("compute_input_us", "compute_infer_us", "compute_output_us")]
            network = max(0, avg - send_us - recv_us - (queue + sum(stages)))
            fields += [str(network), str(queue), *(str(v) for v in stages)]
        fields += [str(recv_us), *(str(_us(latency[f"p{p}"])) for p in LATENCY_PERCENTILES)]
        if verbose:
            fields += [str(avg)] if percentile is None else []
            fields += [str(send_us + recv_us), str(avg - send_us - recv_us)]
            if metrics:
                fields += _gpu_fields(row.get("metrics") or {})
        lines.append(",".join(fields))
    return "\n".join(lines) + "\n"


def _gpu_fields(metrics: dict) -> list[str]:
    """``uuid:value;`` per GPU in each of the four columns, as perf_analyzer writes them."""
    return [
        "".join(f"{uuid}:{cpp_double(value)};" for uuid, value in sorted(metrics.get(key, {}).items()))
        for key in ("gpu_utilization", "gpu_power_usage", "gpu_memory_used_bytes", "gpu_memory_total_bytes")
    ]


def write_csv(rows: list[dict], path: str, verbose: bool, percentile: int | None, metrics: bool) -> None:
    with open(path, "w", newline="") as handle:
        handle.write(csv_text(rows, verbose, percentile, metrics))


# --------------------------------------------------------------------------- --collect-metrics
class MetricsCollector:
    """Scrapes a Triton-style ``/metrics`` every ``interval_ms`` while a level is measured.

    Like perf_analyzer: per GPU (label ``gpu_uuid``) the average utilization and power
    and the largest memory use over the scrapes, and the total memory.  A server without
    GPU metrics gives empty maps; a scrape that fails is an error (``errors`` counts them).
    """

    FAMILIES = {
        "nv_gpu_utilization": "gpu_utilization",
        "nv_gpu_power_usage": "gpu_power_usage",
        "nv_gpu_memory_used_bytes": "gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes": "gpu_memory_total_bytes",
    }

    def __init__(self, url: str, interval_ms: int) -> None:
        self.url = url if "://" in url else f"http://{url}"
        self.interval_s = interval_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scrapes: list[dict[str, dict[str, float]]] = []
        self.errors = 0

    def check(self) -> None:
        """One scrape before measuring: a wrong URL fails the run up front."""
        try:
            self._scrape()
        except (OSError, ValueError) as exc:
            raise BenchError(f"--metrics-url {self.url}: {exc}", stage="metrics") from None

    def _scrape(self) -> dict[str, dict[str, float]]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=max(1.0, self.interval_s)) as response:  # noqa: S310
            text = response.read().decode()
        found: dict[str, dict[str, float]] = {key: {} for key in self.FAMILIES.values()}
        for family in text_string_to_metric_families(text):
            key = self.FAMILIES.get(family.name)
            if key is not None:
                for sample in family.samples:
                    found[key][sample.labels.get("gpu_uuid", "")] = float(sample.value)
        return found

    def start(self) -> None:
        self._scrapes, self.errors = [], 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fastoip-bench-metrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self._scrapes.append(self._scrape())
            except (OSError, ValueError):
                self.errors += 1
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> dict[str, Any]:
        """The level's summary (the ``metrics`` object of a JSON result row)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        scrapes = self._scrapes
        summary: dict[str, Any] = {"scrapes": len(scrapes), "scrape_errors": self.errors}
        for key, combine in (("gpu_utilization", _mean), ("gpu_power_usage", _mean),
                             ("gpu_memory_used_bytes", max), ("gpu_memory_total_bytes", max)):
            uuids = {uuid for scrape in scrapes for uuid in scrape[key]}
            summary[key] = {uuid: combine([s[key][uuid] for s in scrapes if uuid in s[key]]) for uuid in uuids}
        return summary


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


# --------------------------------------------------------------------------- --profile-export-file
def experiment(mode: str, level: float, windows: list[Any], wall_offset_ns: int) -> dict[str, Any]:
    """One level in perf_analyzer's profile export: each successful request's send and response times.

    ``windows``: the reported measurement windows (``measure.Window``), times on the ``now_ns`` clock;
    ``wall_offset_ns`` turns them into nanoseconds since the epoch, as perf_analyzer writes them.
    fastoip bench keeps no per-request data: ``request_inputs`` and ``response_outputs`` stay empty,
    and failed requests (which keep no start time) are not listed.
    """
    requests = []
    for window in windows:
        ends, latencies = window.sample.end_ns, window.sample.lat_ns
        for end, latency in sorted(zip(ends.tolist(), latencies.tolist(), strict=True), key=lambda p: p[0] - p[1]):
            requests.append({
                "timestamp": end - latency + wall_offset_ns,
                "request_inputs": {},
                "response_timestamps": [end + wall_offset_ns],
                "response_outputs": [],
            })
    boundaries = [windows[0].start_ns + wall_offset_ns] if windows else []
    boundaries += [window.end_ns + wall_offset_ns for window in windows]
    return {
        "experiment": {"mode": "concurrency" if mode == "concurrency" else "request_rate",
                       "value": int(level) if mode == "concurrency" else float(level)},
        "requests": requests,
        "window_boundaries": boundaries,
    }


def profile_document(experiments: list[dict[str, Any]], version: str) -> dict[str, Any]:
    return {"experiments": experiments, "version": version, "service_kind": "triton", "endpoint": ""}

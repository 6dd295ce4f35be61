"""Prometheus metrics on their own port, under Triton's names, agreeing with ModelStatistics."""

from __future__ import annotations

import http.client
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from fastoip.host_metrics import CPU_NAMES, PINNED_NAMES
from fastoip.metrics import EXPORTED_NAMES
from serverproc import ServerProcess
from simple_model import simple_inputs


# One server on the default gRPC frontend, not one per frontend: metrics are the Core's and the metrics port's, and
# tests/e2e/test_grpc_differential.py keeps the two frontends' answers byte-identical.
@pytest.fixture(scope="module")
def metrics_server(demo_repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, metrics=True) as proc:
        yield proc


def scrape(port: int, method: str = "GET", path: str = "/metrics") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        conn.close()


def families(text: str) -> dict[str, tuple[str, str]]:
    """Family name -> (type, help), as Prometheus' own parser reads the exposition."""
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}


def parsed(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample; a counter's sample under its family's name.

    The parser reads the text and, as OpenMetrics does, calls a counter's samples ``<family>_total``:
    the name fastoip wrote (Triton's, without the suffix) is the family's.
    """
    return [
        (family.name if family.type == "counter" else s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def samples(text: str) -> dict[tuple[str, str, str], float]:
    """(sample name, model, version) -> value for the per-model samples without further labels."""
    return {
        (name, labels["model"], labels["version"]): value
        for name, labels, value in parsed(text)
        if set(labels) == {"model", "version"}
    }


def labelled(text: str, name: str, model: str) -> dict[str, float]:
    """The samples of ``name`` for ``model`` keyed by their extra label (reason, quantile, le)."""
    found = {}
    for sample_name, labels, value in parsed(text):
        if sample_name == name and labels.get("model") == model:
            extra = {k: v for k, v in labels.items() if k not in ("model", "version")}
            found[",".join(f"{k}={v}" for k, v in sorted(extra.items()))] = value
    return found


def test_metrics_count_what_statistics_count(metrics_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(metrics_server.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    def ten() -> None:
        for _ in range(10):
            client.infer("simple", simple_inputs(tg, a, a))

    threads = [threading.Thread(target=ten) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bad = [tg.InferInput("INPUT0", [1, 16], "INT32")]
    bad[0].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException):
        client.infer("simple", bad)  # refused before it runs

    status, content_type, text = scrape(metrics_server.metrics_port)
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    kinds = families(text)
    # Triton's names exactly: counters keep their names (no _total), gauges and help as Triton's.
    assert "\nnv_inference_request_success{" in text
    assert kinds["nv_inference_request_success"] == (
        "counter", "Number of successful inference requests, all batch sizes")
    assert kinds["nv_inference_pending_request_count"][0] == "gauge"
    assert not any(name.endswith("_total") for name in kinds)
    assert set(kinds) - CPU_NAMES - PINNED_NAMES <= EXPORTED_NAMES
    assert "nv_inference_request_summary_us" not in kinds  # summaries only when asked
    got = samples(text)
    stats = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    key = ("simple", "1")
    assert got[("nv_inference_request_success", *key)] == int(inference["success"]["count"]) >= 40
    failures = labelled(text, "nv_inference_request_failure", "simple")
    assert set(failures) == {"reason=REJECTED", "reason=CANCELED", "reason=BACKEND", "reason=OTHER"}
    # Triton's line exactly, labels in name order (Triton's python-backend QA matches it with a regex)
    assert 'nv_inference_request_failure{model="simple",reason="BACKEND",version="1"} ' in text
    assert sum(failures.values()) == int(inference["fail"].get("count", 0))
    assert got[("nv_inference_count", *key)] == int(stats["inference_count"])
    assert got[("nv_inference_exec_count", *key)] == int(stats["execution_count"])
    assert got[("nv_inference_queue_duration_us", *key)] == int(inference["queue"]["ns"]) // 1000
    assert got[("nv_inference_compute_infer_duration_us", *key)] == int(inference["compute_infer"]["ns"]) // 1000
    assert got[("nv_inference_request_duration_us", *key)] == int(inference["success"]["ns"]) // 1000
    assert got[("nv_inference_compute_input_duration_us", *key)] == int(inference["compute_input"]["ns"]) // 1000
    assert got[("nv_inference_compute_output_duration_us", *key)] == int(inference["compute_output"]["ns"]) // 1000
    assert got[("nv_inference_pending_request_count", *key)] == 0
    # Every loaded model is listed, also those nobody asked.
    assert ("nv_inference_count", "mlp", "1") in got


def test_only_get_metrics_is_served(metrics_server: ServerProcess) -> None:
    status, _, body = scrape(metrics_server.metrics_port, path="/v2/health/ready")
    assert status == 404 and '"error"' in body
    status, _, body = scrape(metrics_server.metrics_port, method="POST")
    assert status == 405 and "only GET /metrics" in body
    assert scrape(metrics_server.metrics_port)[0] == 200


def test_metrics_port_can_be_turned_off(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, "--metrics-port", "-1") as proc:
        assert proc.metrics_port == 0
        assert "metrics listening" not in proc.output()
        assert tg.InferenceServerClient(proc.grpc_url).is_server_ready()


def test_metrics_port_in_use_is_a_clear_start_failure(demo_repo: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(demo_repo),
             "--grpc-port", "0", "--http-port", "-1", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 1
    # claimed before any model loads (fastoip.server.ports): the flag, the address and what to do
    assert f"fastoip: cannot start: --metrics-port {port}: cannot bind 127.0.0.1:{port}: Address already in use" \
        in result.stderr


def test_cpu_metrics_read_proc_and_gpu_families_only_with_nvml(metrics_server: ServerProcess) -> None:
    text = scrape(metrics_server.metrics_port)[2]
    kinds = families(text)
    assert CPU_NAMES <= set(kinds)
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in CPU_NAMES}
    assert 0.0 <= values["nv_cpu_utilization"] <= 1.0
    assert 0 < values["nv_cpu_memory_used_bytes"] < values["nv_cpu_memory_total_bytes"]
    meminfo = Path("/proc/meminfo").read_text().split()
    assert values["nv_cpu_memory_total_bytes"] == int(meminfo[meminfo.index("MemTotal:") + 1]) * 1024
    # No NVML on this host's test run means no GPU family at all (never zeros standing in for a GPU).
    try:
        import pynvml

        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # no library or no driver: no GPU
        has_gpu = False
    assert ("nv_gpu_utilization" in kinds) == has_gpu


FAILING_MODEL = """
    import fastoip

    class Failing(fastoip.Model):
        def predict(self, inputs, parameters):
            if parameters.get("fail"):
                raise ValueError("asked to fail")
            return {"OUT": inputs["X"]}
"""


def test_latency_summaries_histograms_and_failure_reasons(tmp_path: Path) -> None:
    folder = tmp_path / "failing" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(FAILING_MODEL))
    (tmp_path / "failing" / "config.pbtxt").write_text(textwrap.dedent("""
        backend: "python"
        input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """))
    with ServerProcess(tmp_path, "--metrics-config", "summary_latencies=true", "--metrics-config",
                       "histogram_latencies=true", "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
                       metrics=True) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        x = tg.InferInput("X", [3], "INT32")
        x.set_data_from_numpy(np.arange(3, dtype=np.int32))
        for _ in range(20):
            client.infer("failing", [x])
        for _ in range(3):
            with pytest.raises(InferenceServerException, match="asked to fail"):
                client.infer("failing", [x], parameters={"fail": True})
        text = scrape(proc.metrics_port)[2]
        stats = client.get_inference_statistics("failing", as_json=True)["model_stats"][0]["inference_stats"]

    kinds = families(text)
    assert kinds["nv_inference_request_summary_us"][0] == "summary"
    assert kinds["nv_inference_first_response_histogram_ms"] == (
        "histogram", "Duration from request to first response in milliseconds")
    assert set(kinds) - CPU_NAMES - PINNED_NAMES <= EXPORTED_NAMES

    failures = labelled(text, "nv_inference_request_failure", "failing")
    assert failures == {"reason=BACKEND": 3, "reason=REJECTED": 0, "reason=CANCELED": 0, "reason=OTHER": 0}
    assert int(stats["fail"]["count"]) == 3

    request = labelled(text, "nv_inference_request_summary_us", "failing")
    assert set(request) == {"quantile=0.5", "quantile=0.99"}  # the quantiles asked for, spelled as Triton does
    assert 0 < request["quantile=0.5"] <= request["quantile=0.99"]
    got = samples(text)
    assert got[("nv_inference_request_summary_us_count", "failing", "1")] == int(stats["success"]["count"]) == 20
    assert got[("nv_inference_request_summary_us_sum", "failing", "1")] == pytest.approx(
        int(stats["success"]["ns"]) / 1000)
    assert got[("nv_inference_queue_summary_us_count", "failing", "1")] == 20
    assert got[("nv_inference_compute_infer_summary_us_count", "failing", "1")] == int(stats["compute_infer"]["count"])

    buckets = labelled(text, "nv_inference_first_response_histogram_ms_bucket", "failing")
    assert [float(key.split("=")[1]) for key in buckets] == [100.0, 500.0, 2000.0, 5000.0, float("inf")]
    assert buckets["le=+Inf"] == 20  # cumulative: every successful request is in the last bucket
    assert list(buckets.values()) == sorted(buckets.values())
    assert got[("nv_inference_first_response_histogram_ms_count", "failing", "1")] == 20


def test_counter_latencies_can_be_turned_off_and_bad_settings_are_refused(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, "--metrics-config", "counter_latencies=false", metrics=True) as proc:
        kinds = families(scrape(proc.metrics_port)[2])
    assert "nv_inference_request_success" in kinds and "nv_inference_queue_duration_us" not in kinds
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(demo_repo),
         "--metrics-config", "summary_latencies=yes"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1  # a bad flag value, as the other Triton flags answer it
    assert "summary_latencies=yes: expected true or false" in result.stderr


def test_summary_window_forgets_old_observations_and_stays_bounded() -> None:
    from fastoip.metrics import WindowQuantiles

    now = [0.0]
    window = WindowQuantiles(max_age_s=60.0, age_buckets=5, slice_capacity=100, clock=lambda: now[0])
    for value in range(1000):  # 1000 values into one 12 s slice that keeps 100 of them
        window.observe(float(value))
    assert window.count == 1000 and window.sum == sum(range(1000))
    low, high = window.quantiles([0.0, 1.0])
    assert 0 <= low < high <= 999
    now[0] = 30.0
    window.observe(5000.0)
    assert window.quantiles([1.0]) == [5000.0]
    now[0] = 61.0  # the first slice (0-12 s) still overlaps the last 60 s: it stays, as a rotating bucket does
    assert window.quantiles([0.0])[0] < 1000
    now[0] = 73.0  # now all of it is older than 60 s
    assert window.quantiles([0.0, 0.5, 1.0]) == [5000.0, 5000.0, 5000.0]
    now[0] = 200.0
    assert all(q != q for q in window.quantiles([0.5]))  # NaN: nothing in the window, as prometheus-cpp
    assert window.count == 1001  # count and sum stay cumulative


def test_failure_reasons_follow_tritons() -> None:
    from fastoip.errors import Cancelled, DeadlineExceeded, InternalError, InvalidArgument, Unavailable
    from fastoip.metrics import failure_reason

    assert failure_reason(Unavailable("Exceeds maximum queue size")) == "REJECTED"
    assert failure_reason(DeadlineExceeded("deadline exceeded before the request could run")) == "REJECTED"
    assert failure_reason(Cancelled("request cancelled by the client")) == "CANCELED"
    assert failure_reason(InternalError("onnxruntime failed")) == "BACKEND"
    assert failure_reason(InvalidArgument("bad")) == "OTHER"


def test_response_cache_families_follow_statistics(tmp_path: Path) -> None:
    """Triton's ``nv_cache_*`` families: only for models the cache applies to, equal to ModelStatistics."""
    from onnx import TensorProto

    from models import identity_model_bytes

    for name, extra in (("cached", "response_cache { enable: true }\n"), ("uncached", "")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4], name=name))
        (tmp_path / name / "config.pbtxt").write_text("max_batch_size: 4\n" + extra)
    with ServerProcess(tmp_path, "--cache-config", "local,size=1048576", "--metrics-config",
                       "summary_latencies=true", metrics=True) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        for model in ("cached", "uncached"):
            for values in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]):
                x = tg.InferInput("INPUT0", [1, 4], "FP32")
                x.set_data_from_numpy(np.array([values], dtype=np.float32))
                client.infer(model, [x])
        text = scrape(proc.metrics_port)[2]
        stats = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]["inference_stats"]

    kinds = families(text)
    assert kinds["nv_cache_num_hits_per_model"] == ("counter", "Number of cache hits per model")
    assert kinds["nv_cache_num_misses_per_model"] == ("counter", "Number of cache misses per model")
    assert kinds["nv_cache_hit_duration_per_model"] == (
        "counter", "Total cache hit duration per model, in microseconds")
    assert kinds["nv_cache_miss_duration_per_model"] == (
        "counter", "Total cache miss (insert+lookup) duration per model, in microseconds")
    assert kinds["nv_cache_hit_summary_per_model"][0] == "summary"
    assert kinds["nv_cache_miss_summary_per_model"][0] == "summary"
    assert set(kinds) - CPU_NAMES - PINNED_NAMES <= EXPORTED_NAMES
    got = samples(text)
    hits, misses = int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])
    assert (hits, misses) == (3, 2)
    assert got[("nv_cache_num_hits_per_model", "cached", "1")] == hits
    assert got[("nv_cache_num_misses_per_model", "cached", "1")] == misses
    assert got[("nv_cache_hit_duration_per_model", "cached", "1")] == int(stats["cache_hit"]["ns"]) // 1000
    assert got[("nv_cache_miss_duration_per_model", "cached", "1")] == int(stats["cache_miss"]["ns"]) // 1000
    assert got[("nv_cache_hit_summary_per_model_count", "cached", "1")] == hits
    assert got[("nv_cache_miss_summary_per_model_count", "cached", "1")] == misses
    assert got[("nv_cache_hit_summary_per_model_sum", "cached", "1")] == pytest.approx(
        int(stats["cache_hit"]["ns"]) / 1000)
    # a model without the cache has no cache samples; with the cache, Triton drops the request summary
    assert not any(name.startswith("nv_cache_") and model == "uncached" for name, model, _ in got)
    assert ("nv_inference_request_summary_us_count", "uncached", "1") in got
    assert ("nv_inference_request_summary_us_count", "cached", "1") not in got
    assert got[("nv_inference_count", "cached", "1")] == misses  # hits do not run the model


def test_cache_families_follow_counter_latencies_and_the_cached_set() -> None:
    """Triton creates the cache counters only with latency counters on, and only for cached versions."""
    from fastoip.metrics import MetricsConfig, VersionCounters, model_families

    stats = VersionCounters("m", "1", MetricsConfig())
    stats.record_cache(True, 4_000)
    stats.record_cache(False, 9_000)
    snapshots = [stats.snapshot()]
    on = {f.name: f for f in model_families(snapshots, {}, cached=frozenset({("m", "1")}))}
    assert [s.value for s in on["nv_cache_num_hits_per_model"].samples] == [1]
    assert [s.value for s in on["nv_cache_miss_duration_per_model"].samples] == [9]
    assert not any(name.startswith("nv_cache_") for name in
                   {f.name for f in model_families(snapshots, {})})  # not a cached version
    off = model_families(snapshots, {}, config=MetricsConfig(counter_latencies=False), cached=frozenset({("m", "1")}))
    assert not any(f.name.startswith("nv_cache_") for f in off)

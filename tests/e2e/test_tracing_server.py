"""Tracing end to end: ``fastoip serve --trace-config ...`` with real sockets and unchanged tritonclient.

- OpenTelemetry mode: a real OTLP/HTTP receiver in this process gets the spans of one request, with the
  client's trace id (``traceparent`` sent as gRPC metadata or an HTTP header) and the queue / compute spans,
  over HTTP and each gRPC frontend (ModelInfer and ModelStreamInfer).
- Triton mode: the trace file is one JSON array with TIMESTAMPS and TENSORS entries; the trace settings
  API (gRPC TraceSetting, HTTP v2/trace/setting) changes what is traced.
"""

from __future__ import annotations

import json
import queue
import secrets
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from otlp_receiver import OtlpReceiver, otlp_receiver
from serverproc import ServerProcess, wait_until

pytest.importorskip("opentelemetry.sdk")

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)
CHILD_SPANS = {"queue", "compute", "compute_input", "compute_infer", "compute_output"}


def grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    return inputs


def http_inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A, binary_data=True)
    inputs[1].set_data_from_numpy(B, binary_data=False)
    return inputs


def new_parent() -> tuple[str, str, str]:
    """(trace id, parent span id, traceparent header) as an OpenTelemetry client would send them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


# -- OpenTelemetry mode ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def otel(demo_repo: Path, grpc_frontend: str) -> Iterator[tuple[ServerProcess, OtlpReceiver]]:
    """A server in OpenTelemetry mode tracing only requests that carry a trace context (rate=0, as Triton's
    docs suggest), exporting every 50 ms to a receiver in this process."""
    with otlp_receiver() as receiver:
        args = ["--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                "--trace-config", "rate=0", "--trace-config", f"opentelemetry,url={receiver.url}",
                "--trace-config", "opentelemetry,bsp_schedule_delay=50",
                "--trace-config", "opentelemetry,resource=deployment=test"]
        with ServerProcess(demo_repo, *args, http=True, grpc_frontend=grpc_frontend) as server:
            yield server, receiver


def assert_request_spans(receiver: OtlpReceiver, trace_id: str, parent_span_id: str, request_id: str) -> None:
    assert wait_until(lambda: {"InferRequest", "simple"} | CHILD_SPANS <= set(receiver.spans_of(trace_id)),
                      timeout=20), receiver.spans_of(trace_id).keys()
    spans = receiver.spans_of(trace_id)
    root, model = spans["InferRequest"], spans["simple"]
    assert root.parent_span_id.hex() == parent_span_id  # the client's span is the parent
    assert model.parent_span_id == root.span_id
    for name in ("queue", "compute"):
        assert spans[name].parent_span_id == model.span_id
    for name in ("compute_input", "compute_infer", "compute_output"):
        assert spans[name].parent_span_id == spans["compute"].span_id
    assert model.start_time_unix_nano <= spans["queue"].start_time_unix_nano
    assert spans["queue"].end_time_unix_nano <= spans["compute"].start_time_unix_nano
    assert spans["compute"].end_time_unix_nano <= model.end_time_unix_nano
    attributes = {a.key: a.value for a in model.attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.request_id"].string_value == request_id
    assert [e.name for e in spans["compute"].events][0] == "COMPUTE_START"


def test_grpc_request_spans_carry_the_clients_trace_id(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    server, receiver = otel
    trace_id, span_id, traceparent = new_parent()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("simple", grpc_inputs(), request_id="grpc-traced",
                          headers={"traceparent": traceparent, "tracestate": "vendor=1"})
    assert np.array_equal(result.as_numpy("OUTPUT0"), A + B)
    assert_request_spans(receiver, trace_id, span_id, "grpc-traced")
    resource = {a.key: a.value.string_value for a in receiver.resources[-1].attributes}
    assert resource["deployment"] == "test"


def test_http_request_spans_carry_the_clients_trace_id(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    server, receiver = otel
    trace_id, span_id, traceparent = new_parent()
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("simple", http_inputs(), request_id="http-traced", headers={"traceparent": traceparent})
    assert np.array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert_request_spans(receiver, trace_id, span_id, "http-traced")


def test_stream_request_spans_carry_the_streams_trace_id(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    server, receiver = otel
    trace_id, span_id, traceparent = new_parent()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)),
                        headers={"traceparent": traceparent})
    try:
        client.async_stream_infer("simple", grpc_inputs(), request_id="stream-traced")
        result, error = answers.get(timeout=20)
        assert error is None
    finally:
        client.stop_stream()
    assert_request_spans(receiver, trace_id, span_id, "stream-traced")


def test_requests_without_a_trace_context_are_not_traced_at_rate_0(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    server, receiver = otel
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = receiver.trace_ids()
    for _ in range(3):
        client.infer("simple", grpc_inputs())
    client.infer("simple", grpc_inputs(), headers={"traceparent": "00-not-a-valid-context-01"})
    trace_id, span_id, traceparent = new_parent()
    client.infer("simple", grpc_inputs(), request_id="marker", headers={"traceparent": traceparent})
    assert_request_spans(receiver, trace_id, span_id, "marker")  # exported after the untraced ones
    assert receiver.trace_ids() - before == {trace_id}


def test_settings_api_answers_the_opentelemetry_settings(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    server, receiver = otel
    settings = httpclient.InferenceServerClient(server.http_url).get_trace_settings()
    assert settings["trace_mode"] == "opentelemetry" and settings["url"] == receiver.url
    assert "trace_file" not in settings and "log_frequency" not in settings  # Triton answers those in triton mode
    # the level turns tracing off for propagated requests too
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.update_trace_settings(model_name="simple", settings={"trace_level": ["OFF"]})
    try:
        trace_id, _, traceparent = new_parent()
        grpc.infer("simple", grpc_inputs(), headers={"traceparent": traceparent})
        marker_id, marker_span, marker_parent = new_parent()
        grpc.infer("identity_fp32", [fp32_input()], request_id="other-model", headers={"traceparent": marker_parent})
        assert wait_until(lambda: "identity_fp32" in receiver.spans_of(marker_id), timeout=20)
        assert receiver.spans_of(trace_id) == {}
    finally:
        grpc.update_trace_settings(model_name="simple", settings={"trace_level": []})


def fp32_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
    return tensor


# -- Triton mode -----------------------------------------------------------------------------------
def entries_by_id(path: Path) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for entry in json.loads(path.read_text()):  # one JSON array (json.loads fails on anything else)
        grouped.setdefault(entry["id"], []).append(entry)
    return grouped


def test_triton_trace_file_and_the_settings_api(demo_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "level=TENSORS", "--trace-config", "rate=1"]
    with ServerProcess(demo_repo, *args, http=True) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        http = httpclient.InferenceServerClient(server.http_url)
        grpc.infer("simple", grpc_inputs(), request_id="first")
        (trace,) = entries_by_id(path).values()
        head = trace[0]
        assert head == {"id": head["id"], "model_name": "simple", "model_version": 1, "request_id": "first"}
        names = [e["timestamps"][0]["name"] for e in trace if "timestamps" in e]
        names = [n for n in names if not n.startswith(("GRPC_", "HTTP_"))]  # the frontend's: test_trace_frontend
        assert names == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
        tensors = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in trace if "tensor" in e}
        assert set(tensors) == {("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
                                ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")}
        assert tensors["TENSOR_BACKEND_OUTPUT", "OUTPUT0"] == {
            "name": "OUTPUT0", "data": ",".join(str(v) for v in (A + B).ravel()), "shape": "1,16", "dtype": "INT32"}

        # the settings API: TIMESTAMPS only, every 2nd request of simple, 1 trace left
        updated = http.update_trace_settings(model_name="simple", settings={"trace_level": ["TIMESTAMPS"],
                                                                            "trace_rate": "2", "trace_count": "1"})
        assert updated["trace_level"] == ["TIMESTAMPS"] and updated["trace_file"] == str(path)
        assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # global unchanged
        for _ in range(4):
            http.infer("simple", http_inputs())
        traces = entries_by_id(path)
        assert len(traces) == 2  # the 2nd request; then no count left
        assert not any("tensor" in e for e in traces[max(traces)])
        assert http.get_trace_settings(model_name="simple")["trace_count"] == "0"

        # global OFF turns off what the model did not set itself; the model's level still traces
        grpc.update_trace_settings(settings={"trace_level": ["OFF"]})
        grpc.update_trace_settings(model_name="simple", settings={"trace_count": ["-1"], "trace_rate": ["1"]})
        grpc.infer("identity_fp32", [fp32_input()])
        grpc.infer("simple", grpc_inputs())
        traces = entries_by_id(path)
        assert len(traces) == 3 and traces[max(traces)][0]["model_name"] == "simple"

        with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
            grpc.update_trace_settings(settings={"trace_file": [str(tmp_path / "elsewhere.json")]})
        with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
            grpc.get_trace_settings(model_name="nope")

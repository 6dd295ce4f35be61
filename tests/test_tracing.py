"""Tracing on its own: Triton's --trace-config, its trace file format, and OTLP/HTTP spans sent to a real receiver."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest

from fastoip.tracing import TraceRecord, parse_trace_config
from fastoip.tracing.triton_file import TraceFile


def record(trace_id: int = 1, carrier: dict[str, str] | None = None) -> TraceRecord:
    base = time.monotonic_ns()
    names = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
             "COMPUTE_END", "REQUEST_END"]
    rec = TraceRecord(trace_id, "simple", "1", "req-7", carrier=carrier or {})
    for i, name in enumerate(names):
        rec.stamp(name, base + i * 1000)
    return rec


def test_trace_config_reads_tritons_spelling() -> None:
    config = parse_trace_config([
        "level=TIMESTAMPS", "level=TENSORS", "rate=5", "count=10", "mode=opentelemetry",
        "triton,file=/tmp/a,b.json", "triton,log-frequency=50", "opentelemetry,url=collector:4318/v1/traces",
        "opentelemetry,resource=service.name=svc", "opentelemetry,resource=deployment=blue",
        "opentelemetry,bsp_schedule_delay=100",
    ])
    assert config.levels == ["TIMESTAMPS", "TENSORS"] and config.enabled
    assert (config.rate, config.count, config.mode) == (5, 10, "opentelemetry")
    assert (config.file, config.log_frequency) == ("/tmp/a,b.json", 50)
    assert config.otel_url == "http://collector:4318/v1/traces"
    assert config.otel_resource == {"service.name": "svc", "deployment": "blue"}
    assert config.bsp_schedule_delay_ms == 100
    assert not parse_trace_config([]).enabled


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("level=LOUD", "level"), ("rate=x", "integer"), ("mode=jaeger", "mode"), ("colour=red", "unknown global"),
        ("triton,colour=red", "triton: unknown"), ("zipkin,url=x", "unknown mode"), ("level", "expected"),
        ("opentelemetry,resource=novalue", "key=value"),
    ],
)
def test_bad_trace_config_is_refused_by_name(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_trace_config([entry])


def test_trace_file_is_a_json_array_after_every_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    writer = TraceFile(str(path))
    first = record(1)
    first.tensors.append(("TENSOR_QUEUE_INPUT", "INPUT0", "INT32", (1, 3), np.array([[1, 2, 3]], dtype=np.int32)))
    writer.write(first.triton_entries())
    entries = json.loads(path.read_text())
    assert entries[0] == {"id": 1, "model_name": "simple", "model_version": 1, "request_id": "req-7"}
    assert [e["timestamps"][0]["name"] for e in entries if "timestamps" in e][0] == "REQUEST_START"
    assert entries[-1]["tensor"] == {"name": "INPUT0", "data": "1,2,3", "shape": "1,3", "dtype": "INT32"}
    writer.write(record(2).triton_entries())
    assert {e["id"] for e in json.loads(path.read_text())} == {1, 2}


def test_trace_file_rotates_every_log_frequency_traces(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    writer = TraceFile(str(path), log_frequency=2)
    for trace_id in (1, 2, 3):
        writer.write(record(trace_id).triton_entries())
    assert {e["id"] for e in json.loads((tmp_path / "trace.json.0").read_text())} == {1, 2}
    assert not (tmp_path / "trace.json.1").exists()
    writer.flush()
    assert {e["id"] for e in json.loads((tmp_path / "trace.json.1").read_text())} == {3}


class Receiver(BaseHTTPRequestHandler):
    """A real OTLP/HTTP trace receiver: decodes ExportTraceServiceRequest bodies."""

    spans: list = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                Receiver.spans.extend(scope_spans.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def receiver() -> Iterator[str]:
    pytest.importorskip("opentelemetry.sdk")
    Receiver.spans = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()


def test_spans_reach_an_otlp_receiver_with_the_callers_trace_id(receiver: str) -> None:
    from fastoip.tracing.otel import OtelExporter

    exporter = OtelExporter(parse_trace_config([f"opentelemetry,url={receiver}", "mode=opentelemetry"]))
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    exporter.export(record(carrier={"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01"}))
    exporter.shutdown()
    by_name = {span.name: span for span in Receiver.spans}
    assert set(by_name) == {"InferRequest", "simple", "queue", "compute", "compute_input", "compute_infer",
                            "compute_output"}
    assert {span.trace_id.hex() for span in Receiver.spans} == {client_trace}
    assert by_name["InferRequest"].parent_span_id.hex() == "00f067aa0ba902b7"
    assert by_name["simple"].parent_span_id == by_name["InferRequest"].span_id
    assert by_name["compute_infer"].parent_span_id == by_name["compute"].span_id
    assert [e.name for e in by_name["simple"].events][0] == "REQUEST_START"
    attributes = {a.key: a.value for a in by_name["simple"].attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.request_id"].string_value == "req-7"
    assert by_name["queue"].end_time_unix_nano - by_name["queue"].start_time_unix_nano == 1000

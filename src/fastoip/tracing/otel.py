"""OpenTelemetry export of traced requests (``--trace-config mode=opentelemetry``), through the OTel SDK.

Rules (Triton's ``trace.md`` "OpenTelemetry trace support", with the spans fastoip adds):
- Spans per request: ``InferRequest`` (the top-level span; parent: the caller's
  W3C ``traceparent`` / ``tracestate`` when it sent one) -> a span named after the
  model (REQUEST_START to REQUEST_END) -> ``queue`` (QUEUE_START to COMPUTE_START)
  and ``compute`` (COMPUTE_START to COMPUTE_END) -> ``compute_input``,
  ``compute_infer``, ``compute_output`` when the backend reported those stamps.
  Every Triton timestamp is also an event on the model span.
- Attributes: ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
  ``triton.request_id``, as Triton sets them.
- Monotonic stamps are moved to the wall clock with one offset taken at start-up.
- Export is OTLP/HTTP through the SDK's batch span processor; the SDK is the
  optional extra ``fastoip[otel]``, imported only when this mode is chosen.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .config import TraceConfig
from .record import TraceRecord

_CHILDREN = (
    ("queue", "QUEUE_START", "COMPUTE_START"),
    ("compute", "COMPUTE_START", "COMPUTE_END"),
)
_COMPUTE_PARTS = (
    ("compute_input", "COMPUTE_START", "COMPUTE_INPUT_END"),
    ("compute_infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("compute_output", "COMPUTE_OUTPUT_START", "COMPUTE_END"),
)


class OtelExporter:
    """Turns finished TraceRecords into spans and hands them to the SDK's batch exporter."""

    def __init__(self, config: TraceConfig, exporter: Optional[Any] = None) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise RuntimeError(
                "--trace-config mode=opentelemetry needs the OpenTelemetry SDK: pip install 'fastoip[otel]'"
            ) from exc
        self._provider = TracerProvider(resource=Resource.create(dict(config.otel_resource)))
        self._processor = BatchSpanProcessor(
            exporter or OTLPSpanExporter(endpoint=config.otel_url),
            max_queue_size=config.bsp_max_queue_size,
            schedule_delay_millis=config.bsp_schedule_delay_ms,
            max_export_batch_size=config.bsp_max_export_batch_size,
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("fastoip")
        self._propagator = TraceContextTextMapPropagator()
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def export(self, record: TraceRecord) -> None:
        """Build ``record``'s spans (ended, with their real times) and queue them for export."""
        from opentelemetry import trace as otel_trace

        stamps = dict(record.timestamps)
        if "REQUEST_START" not in stamps or "REQUEST_END" not in stamps:
            return
        wall = {name: ns + self._offset_ns for name, ns in record.timestamps}
        first = min(wall.values())
        last = max(wall.values())
        parent = self._propagator.extract(record.carrier) if record.carrier else None
        root = self._tracer.start_span("InferRequest", context=parent, start_time=first)
        for name in ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END",
                     "HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"):
            if name in wall:
                root.add_event(name, timestamp=wall[name])
        root_context = otel_trace.set_span_in_context(root)
        model = self._tracer.start_span(record.model_name, context=root_context, start_time=wall["REQUEST_START"])
        model.set_attribute("triton.model_name", record.model_name)
        model.set_attribute("triton.model_version", record.model_version)
        model.set_attribute("triton.trace_id", record.trace_id)
        if record.request_id:
            model.set_attribute("triton.request_id", record.request_id)
        if record.parent_id is not None:
            model.set_attribute("triton.trace_parent_id", record.parent_id)
        for name, ns in record.timestamps:
            model.add_event(name, timestamp=ns + self._offset_ns)
        model_context = otel_trace.set_span_in_context(model)
        for span_name, begin, end in _CHILDREN:
            if begin in wall and end in wall:
                child = self._tracer.start_span(span_name, context=model_context, start_time=wall[begin])
                if span_name == "compute":
                    compute_context = otel_trace.set_span_in_context(child)
                    for part, part_begin, part_end in _COMPUTE_PARTS:
                        if part_begin in wall and part_end in wall:
                            self._tracer.start_span(part, context=compute_context,
                                                    start_time=wall[part_begin]).end(end_time=wall[part_end])
                child.end(end_time=wall[end])
        model.end(end_time=wall["REQUEST_END"])
        root.end(end_time=last)

    def shutdown(self) -> None:
        """Export what is still batched and stop the exporter."""
        self._provider.shutdown()

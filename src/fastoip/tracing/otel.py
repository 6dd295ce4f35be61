"""OpenTelemetry export of traced requests (``--trace-config mode=opentelemetry``), through the OTel SDK.

Rules (Triton's ``src/tracer.cc`` in OpenTelemetry mode, plus the spans fastoip adds):
- Spans per request, all of kind SERVER:
  ``InferRequest`` (the top-level span; its parent is the caller's W3C
  ``traceparent`` / ``tracestate`` when it sent a valid one) -> a span named
  after the model (REQUEST_START to REQUEST_END; events REQUEST_START,
  QUEUE_START, REQUEST_END) -> ``compute`` (COMPUTE_START to COMPUTE_END;
  events COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END),
  as Triton builds them.  fastoip adds ``queue`` (QUEUE_START to COMPUTE_START,
  under the model span) and ``compute_input``, ``compute_infer``,
  ``compute_output`` (under ``compute``), so a trace backend shows where the
  time went without reading events.  Frontend timestamps (GRPC_*, HTTP_*) are
  events on the top-level span.
- Attributes on the model span, as Triton sets them: ``triton.model_name``,
  ``triton.model_version`` (int), ``triton.trace_id``, ``triton.trace_parent_id``
  (0: none), ``triton.request_id`` (when there is one).
- Monotonic stamps are moved to the wall clock with one offset taken at start-up (Triton does the same).
- Export is OTLP/HTTP through the SDK's batch span processor; the SDK is the
  optional extra ``fastoip[otel]``, imported only when this mode is chosen.
"""

from __future__ import annotations

import time
from typing import Any

from .config import TraceConfig
from .record import TraceRecord

#: Stamps that are events of the model span (and REQUEST_END, at its end), and of the compute span (Triton's split).
_MODEL_EVENTS = ("REQUEST_START", "QUEUE_START")
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
_COMPUTE_PARTS = (
    ("compute_input", "COMPUTE_START", "COMPUTE_INPUT_END"),
    ("compute_infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("compute_output", "COMPUTE_OUTPUT_START", "COMPUTE_END"),
)


SDK_MISSING = "--trace-config mode=opentelemetry needs the OpenTelemetry SDK: pip install 'fastoip[otel]'"


def require_sdk() -> None:
    """Raise RuntimeError (:data:`SDK_MISSING`) when the OpenTelemetry SDK or its OTLP/HTTP exporter is absent."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(SDK_MISSING) from exc


class OtelExporter:
    """Turns finished TraceRecords into spans and hands them to the SDK's batch exporter."""

    def __init__(self, config: TraceConfig, exporter: Any | None = None) -> None:
        require_sdk()
        from opentelemetry import trace as otel_trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._api = otel_trace
        self._server_kind = otel_trace.SpanKind.SERVER
        self._provider = TracerProvider(resource=Resource.create(dict(config.otel_resource)))
        self._processor = BatchSpanProcessor(
            exporter or OTLPSpanExporter(endpoint=config.otel_url),
            max_queue_size=config.bsp_max_queue_size,
            schedule_delay_millis=config.bsp_schedule_delay_ms,
            max_export_batch_size=config.bsp_max_export_batch_size,
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("triton-server")  # Triton's tracer name
        self._propagator = TraceContextTextMapPropagator()
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def is_valid_parent(self, carrier: dict[str, str]) -> bool:
        """True when ``carrier`` holds a valid W3C ``traceparent`` (Triton then traces the request whatever
        its rate and count)."""
        if "traceparent" not in carrier:
            return False
        context = self._propagator.extract(carrier)
        return bool(self._api.get_current_span(context).get_span_context().is_valid)

    def _span(self, name: str, parent: Any, start_ns: int) -> Any:
        return self._tracer.start_span(name, context=parent, kind=self._server_kind, start_time=start_ns)

    def export(self, record: TraceRecord) -> None:
        """Build ``record``'s spans (ended, with their real times) and queue them for export."""
        wall = {name: ns + self._offset_ns for name, ns in record.timestamps}
        if "REQUEST_START" not in wall or "REQUEST_END" not in wall:
            return
        set_in = self._api.set_span_in_context
        parent = self._propagator.extract(record.carrier) if record.carrier else None
        root = self._span("InferRequest", parent, min(wall.values()))
        for name, ns in wall.items():
            if name.startswith(("GRPC_", "HTTP_")):
                root.add_event(name, timestamp=ns)
        model = self._span(record.model_name, set_in(root), wall["REQUEST_START"])
        version = record.model_version
        model.set_attribute("triton.model_name", record.model_name)
        model.set_attribute("triton.model_version", int(version) if version.isdigit() else version)
        model.set_attribute("triton.trace_id", record.trace_id)
        model.set_attribute("triton.trace_parent_id", record.parent_id or 0)
        if record.request_id:
            model.set_attribute("triton.request_id", record.request_id)
        for name in _MODEL_EVENTS:
            if name in wall:
                model.add_event(name, timestamp=wall[name])
        model_context = set_in(model)
        if "QUEUE_START" in wall and "COMPUTE_START" in wall:
            self._span("queue", model_context, wall["QUEUE_START"]).end(end_time=wall["COMPUTE_START"])
        if "COMPUTE_START" in wall and "COMPUTE_END" in wall:
            compute = self._span("compute", model_context, wall["COMPUTE_START"])
            for name in _COMPUTE_EVENTS:
                if name in wall:
                    compute.add_event(name, timestamp=wall[name])
            compute_context = set_in(compute)
            for part, begin, end in _COMPUTE_PARTS:
                if begin in wall and end in wall:
                    self._span(part, compute_context, wall[begin]).end(end_time=wall[end])
            compute.end(end_time=wall["COMPUTE_END"])
        model.add_event("REQUEST_END", timestamp=wall["REQUEST_END"])
        model.end(end_time=wall["REQUEST_END"])
        root.end(end_time=max(wall.values()))

    def shutdown(self) -> None:
        """Export what is still batched and stop the exporter."""
        self._provider.shutdown()

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
- A child trace (``parent_id``: an ensemble step, a BLS request) has no
  ``InferRequest`` span of its own: its model span hangs under its parent's
  model span, as Triton's child traces.  Children finish before their parent,
  so a child waits (up to :data:`MAX_WAITING` of them) until its parent is
  exported; a child whose parent is gone (exported long ago, or never) is
  exported on its own, under the caller's W3C context.
- Monotonic stamps are moved to the wall clock with one offset taken at start-up (Triton does the same).
- Export is OTLP/HTTP through the SDK's batch span processor; the SDK is the
  optional extra ``fastoip[otel]``, imported only when this mode is chosen.
"""

from __future__ import annotations

import collections
import threading
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


#: Child traces waiting for their parent's export, at most (beyond it the oldest is exported on its own).
MAX_WAITING = 4096
#: Exported traces whose model span a late child may still hang under.
MAX_REMEMBERED = 4096

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
        self._lock = threading.Lock()
        #: parent trace id -> its children's records, until the parent is exported.
        self._waiting: collections.OrderedDict[int, list[TraceRecord]] = collections.OrderedDict()
        self._waiting_count = 0
        #: trace id -> the context of its model span, for the last MAX_REMEMBERED exported traces.
        self._exported: collections.OrderedDict[int, Any] = collections.OrderedDict()

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
        """Build ``record``'s spans (ended, with their real times) and queue them for export; a child's wait
        for its parent's (see the module rules)."""
        alone: list[TraceRecord] = []
        parent_context = None
        waits = False
        with self._lock:
            if record.parent_id is not None:
                parent_context = self._exported.get(record.parent_id)
                waits = parent_context is None
                if waits:
                    self._waiting.setdefault(record.parent_id, []).append(record)
                    self._waiting_count += 1
                    while self._waiting_count > MAX_WAITING:
                        _, oldest = self._waiting.popitem(last=False)
                        self._waiting_count -= len(oldest)
                        alone += oldest
        for orphan in alone:
            self._export_tree(orphan, None)
        if not waits:
            self._export_tree(record, parent_context)

    def _export_tree(self, record: TraceRecord, parent_context: Any) -> None:
        """``record``'s spans (under ``parent_context``, a parent's model span, when given), then its waiting
        children's under its own model span."""
        context = self._export_one(record, parent_context)
        with self._lock:
            if context is not None:
                self._exported[record.trace_id] = context
                while len(self._exported) > MAX_REMEMBERED:
                    self._exported.popitem(last=False)
            children = self._waiting.pop(record.trace_id, [])
            self._waiting_count -= len(children)
        for child in children:  # under this model span; on their own when it has none
            self._export_tree(child, context)

    def _export_one(self, record: TraceRecord, parent_context: Any) -> Any:
        """``record``'s spans; the context of its model span (None: it had no request timestamps)."""
        wall = {name: ns + self._offset_ns for name, ns in record.timestamps}
        if "REQUEST_START" not in wall or "REQUEST_END" not in wall:
            return None
        set_in = self._api.set_span_in_context
        root = None
        if parent_context is None:
            parent = self._propagator.extract(record.carrier) if record.carrier else None
            root = self._span("InferRequest", parent, min(wall.values()))
            for name, ns in wall.items():
                if name.startswith(("GRPC_", "HTTP_")):
                    root.add_event(name, timestamp=ns)
            parent_context = set_in(root)
        model = self._span(record.model_name, parent_context, wall["REQUEST_START"])
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
        if root is not None:
            root.end(end_time=max(wall.values()))
        return model_context

    def shutdown(self) -> None:
        """Export what is still waiting or batched and stop the exporter."""
        with self._lock:
            orphans = [child for children in self._waiting.values() for child in children]
            self._waiting.clear()
            self._waiting_count = 0
        for orphan in orphans:
            self._export_tree(orphan, None)
        self._provider.shutdown()

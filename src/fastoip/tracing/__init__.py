"""Request tracing as Triton does it: its trace file (``mode=triton``) or OpenTelemetry spans (``mode=opentelemetry``)."""

from .config import TraceConfig, parse_trace_config
from .record import TraceRecord

__all__ = ["TraceConfig", "TraceRecord", "parse_trace_config"]

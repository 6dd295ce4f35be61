"""Request tracing as Triton does it: its trace file (``mode=triton``) or OpenTelemetry spans.

Read :mod:`.manager` first (settings, sampling, where traces go); :mod:`.config` reads the command line,
:mod:`.context` the caller's W3C trace context, :mod:`.record` is one traced request, :mod:`.triton_file`
and :mod:`.otel` write it out.
"""

from .config import TraceConfig, parse_trace_config
from .context import TraceHeaders
from .frontend import FrontendTrace
from .manager import Trace, TraceManager
from .record import TraceRecord

__all__ = ["FrontendTrace", "Trace", "TraceConfig", "TraceHeaders", "TraceManager", "TraceRecord", "parse_trace_config"]

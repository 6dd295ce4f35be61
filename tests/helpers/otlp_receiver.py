"""A real OTLP/HTTP trace receiver for tests: decodes ``ExportTraceServiceRequest`` bodies (opentelemetry-proto)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpReceiver:
    """Spans received so far, and the URL to send them to."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.spans: list[Any] = []
        self.resources: list[Any] = []
        self.lock = threading.Lock()

    def spans_of(self, trace_id: str) -> dict[str, Any]:
        """Span name -> span, for the spans of one trace (hex id)."""
        with self.lock:
            return {span.name: span for span in self.spans if span.trace_id.hex() == trace_id}

    def trace_ids(self) -> set[str]:
        with self.lock:
            return {span.trace_id.hex() for span in self.spans}


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 (ephemeral port), serving until the block ends."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    receiver: OtlpReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            with receiver.lock:
                for resource_spans in message.resource_spans:
                    receiver.resources.append(resource_spans.resource)
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend(scope_spans.spans)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = OtlpReceiver(f"http://127.0.0.1:{server.server_address[1]}/v1/traces")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()

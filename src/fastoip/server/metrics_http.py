"""The metrics endpoint: ``GET /metrics`` in Prometheus text format on its own port (Triton's 8002).

Rules:
- Only translates: the per-model text comes from ``Core.prometheus_metrics``; the
  host families (``nv_cpu_*``, ``nv_gpu_*`` where NVML sees a GPU) are the
  process's, from ``fastoip.host_metrics``, read at scrape time.
- Its own small threaded stdlib HTTP server, away from the inference frontends:
  scrapes are rare, and a slow scraper never holds up the inference event loop.
- Anything but ``GET /metrics`` answers 404 (or 405 for another method on it),
  with a JSON ``{"error"}`` body like the other frontends.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..core import Core
from ..host_metrics import HostMetrics
from ..metrics import exposition_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer:
    """Serves ``/metrics`` from a daemon thread until ``stop()``."""

    def __init__(self, core: Core, host: str, port: int) -> None:
        handler = type("MetricsHandler", (_Handler,), {"core": core, "host": HostMetrics()})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics port {host}:{port}: {exc.strerror}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fastoip-metrics", daemon=True)

    def start(self) -> int:
        """Start serving; returns the bound port."""
        self._thread.start()
        return self._server.server_address[1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    core: Core
    host: HostMetrics
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, "application/json", json.dumps({"error": f"not found: {self.path}"}).encode())
            return
        body = self.core.prometheus_metrics() + exposition_text(self.host.collect())
        self._send(200, CONTENT_TYPE, body.encode())

    def _refuse(self) -> None:
        status = 405 if self.path.split("?", 1)[0] == "/metrics" else 404
        error = {"error": f"{self.command} {self.path}: only GET /metrics"}
        self._send(status, "application/json", json.dumps(error).encode())

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass  # scrapes every few seconds would flood the log

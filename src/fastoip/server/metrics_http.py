"""The metrics endpoint: ``GET /metrics`` in Prometheus text format on its own port (Triton's 8002).

Rules:
- Only translates: the per-model text comes from ``Core.prometheus_metrics``; the
  host families (``nv_cpu_*``, ``nv_gpu_*`` where NVML sees a GPU) are the
  process's, from ``fastoip.host_metrics``, read at scrape time.
- Its own small threaded stdlib HTTP server, away from the inference frontends:
  scrapes are rare, and a slow scraper never holds up the inference event loop.
- Anything but ``GET /metrics`` answers 404 (or 405 for another method on it),
  with a JSON ``{"error"}`` body like the other frontends.
- Bounded (issue 27): at most ``MAX_CONNECTIONS`` connections at once (one
  more is closed when accepted), and a connection that sends nothing for
  ``IDLE_TIMEOUT_S`` is closed, so idle clients cannot hold a thread each.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..core import Core
from ..host_metrics import HostMetrics
from ..metrics import exposition_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Connections (one thread each) the metrics port serves at once; scrapers need one or two.
MAX_CONNECTIONS = 32
#: Seconds a metrics connection may send nothing (between or inside requests) before it is closed.
IDLE_TIMEOUT_S = 10.0


class _BoundedServer(ThreadingHTTPServer):
    """The stdlib's threaded server with a cap on connections (threads) at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: closed before a thread is started
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """Serves ``/metrics`` from a daemon thread until ``stop()``."""

    def __init__(self, core: Core, host: str, port: int) -> None:
        handler = type("MetricsHandler", (_Handler,), {"core": core, "host": HostMetrics()})
        try:
            self._server = _BoundedServer((host, port), handler)
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
    timeout = IDLE_TIMEOUT_S  # the socket's timeout: an idle keep-alive connection ends (issue 27)

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

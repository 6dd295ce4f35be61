"""The HTTP frontend's server: uvicorn (httptools + uvloop) in its own thread.

Rules:
- The server runs in its own thread with its own uvloop: ``start()`` returns
  once the socket listens; ``stop()`` closes the listener, lets requests in
  flight finish within the timeout, then joins the thread.
- Connections are uvicorn's httptools protocol with fastoip's limits and timeouts
  (:mod:`.protocol`); TLS is uvicorn's (``ssl`` module) when a certificate is given.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from dataclasses import dataclass

import uvicorn

from ...core import Core
from ..forward_headers import forwarder
from ..restricted import RestrictedFeatures
from .body_budget import BodyBudget
from .endpoints import HttpFrontend
from .intake import BODY_BYTES_IN_FLIGHT, MAX_BINARY_INPUT_BYTES
from .json_pool import DEFAULT_WORKERS, JsonPool
from .openai.frontend import OpenAIFrontend
from .protocol import HttpLimits, protocol_with
from .router import Router

log = logging.getLogger("fastoip.http")


@dataclass(frozen=True)
class HttpTls:
    """HTTPS with Python's ssl module, as uvicorn configures it."""

    #: PEM certificate chain (may hold the key too).
    certfile: str
    #: PEM private key ("" when certfile holds it).
    keyfile: str = ""
    #: PEM CA certificates client certificates must chain to.
    ca_certs: str = ""
    #: Refuse clients without a certificate chaining to ca_certs (mutual TLS).
    require_client_cert: bool = False


class _Uvicorn(uvicorn.Server):
    """uvicorn.Server that says when its listener is up."""

    def __init__(self, config: uvicorn.Config, listening: threading.Event) -> None:
        super().__init__(config)
        self.listening = listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class HttpServer:
    """The HTTP frontend in a background thread with its own uvloop event loop."""

    def __init__(
        self,
        core: Core,
        host: str,
        port: int,
        *,
        max_body_size: int = 64 * 1024 * 1024,
        max_binary_size: int = MAX_BINARY_INPUT_BYTES,
        body_bytes_in_flight: int = BODY_BYTES_IN_FLIGHT,
        limits: HttpLimits | None = None,
        tls: HttpTls | None = None,
        restricted: RestrictedFeatures | None = None,
        forward_header_pattern: str | None = None,
        json_workers: int = DEFAULT_WORKERS,
        openai_only: bool = False,
    ) -> None:
        self.core = core
        self.host = host
        self.port = port
        self.max_body_size = max_body_size
        self.max_binary_size = max_binary_size
        self.body_budget = BodyBudget(body_bytes_in_flight)
        self.limits = limits or HttpLimits()
        self.tls = tls
        self.restricted = restricted
        self.forward_header_pattern = forward_header_pattern
        self.json_pool = JsonPool(json_workers)
        #: Serve OpenAI's API alone (``--openai-port``) instead of the whole HTTP API.
        self.openai_only = openai_only
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def start(self) -> int:
        """Bind, start serving in a thread, and return the bound port once listening."""
        sock = _bind(self.host, self.port)
        bound_port = sock.getsockname()[1]
        app: Router
        if self.openai_only:
            app = OpenAIFrontend(self.core, self.max_body_size, self.json_pool)
        else:
            app = HttpFrontend(self.core, self.max_body_size, self.json_pool, self.max_binary_size, self.body_budget)
            app.forward_headers = forwarder(self.forward_header_pattern)
        if self.restricted:
            app.restrict(self.restricted)
        tls = self.tls
        config = uvicorn.Config(
            app,
            http=protocol_with(self.limits),
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # keep the process's logging as app.py set it up
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_keep_alive=int(self.limits.keep_alive_timeout),  # the protocol reads the float from limits
            ssl_certfile=tls.certfile if tls else None,
            ssl_keyfile=(tls.keyfile or None) if tls else None,
            ssl_ca_certs=(tls.ca_certs or None) if tls else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.require_client_cert else ssl.CERT_NONE,
        )
        listening = threading.Event()
        self._server = _Uvicorn(config, listening)
        self._thread = threading.Thread(target=self._run, args=(sock, listening), name="fastoip-http", daemon=True)
        self._thread.start()
        listening.wait()
        if self._failure is not None:
            raise OSError(f"the HTTP server failed to start on {self.host}:{bound_port}: {self._failure}")
        self.port = bound_port
        return bound_port

    def _run(self, sock: socket.socket, listening: threading.Event) -> None:
        import uvloop

        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            assert self._server is not None
            loop.run_until_complete(self._server.serve(sockets=[sock]))
        except BaseException as exc:  # startup failures must reach start(), not vanish with the thread
            self._failure = exc
            log.exception("HTTP server stopped with an error")
        finally:
            try:
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                listening.set()

    def stop(self, timeout: float) -> None:
        """Stop accepting; requests in flight get up to ``timeout`` seconds; join the thread."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        # uvicorn annotates int, but waits with asyncio, which takes float seconds
        server.config.timeout_graceful_shutdown = max(timeout, 0.0)  # type: ignore[assignment]  # uvicorn types it int, takes float
        server.should_exit = True
        # uvicorn notices should_exit within 0.1 s; its shutdown waits at most timeout.
        thread.join(timeout + 5.0)
        if thread.is_alive():
            log.warning("the HTTP server thread did not stop within %.1f s", timeout + 5.0)
        self.json_pool.shutdown()


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

"""``fastoip.Server``: a whole fastoip (Core, gRPC, HTTP, metrics) inside the caller's process.

Rules:
- The same assembly ``fastoip serve`` runs (:class:`fastoip.server.app.ServerApp`), told it is a guest:
  it installs no signal handlers, leaves logging and the garbage collector alone, and prints nothing.
- Ports are ephemeral unless given: ``start()`` returns once every listener is bound, and the bound
  ports and the URLs tritonclient takes are read from the object.
- Each frontend runs on its own thread (the native gRPC frontend and HTTP each on an event loop of their
  own), so synchronous code, a test with ``tritonclient`` for instance, calls it like any remote server.
- ``stop()`` drains as a signal does (readiness false, listeners closed, calls in flight finished, models
  unloaded) and frees the ports; the object may be started again, and several may run at once.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from .repository.remote import parse_location
from .server.app import ServeOptions, ServerApp

#: Settings an embedded server starts with unless told otherwise: free ports, no drain delay.
#: No JSON decoding processes (issue 27, server/http/json_pool.py): ``spawn`` would import the caller's script in
#: each; ``http_json_workers=2`` turns them on where the script guards its main code.
EMBEDDED_DEFAULTS: dict[str, Any] = {"grpc_port": 0, "http_port": 0, "metrics_port": 0, "shutdown_grace": 0.0,
                                     "http_json_workers": 0}


class Server:
    """A fastoip server running in this process; a context manager, or ``start()`` / ``stop()``.

    ``model_repository``: a Triton-style repository (default: the built-in demo repository).
    ``grpc``, ``http``, ``metrics``: which listeners to open (Prometheus metrics are off unless asked for).
    ``settings``: any :class:`fastoip.server.app.ServeOptions` field, e.g. ``model_control_mode="explicit"``,
    ``load_models=["mymodel"]``, ``grpc_port=8001``, ``exit_timeout=5.0``.

    Example::

        with fastoip.Server("models") as server:
            client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    """

    def __init__(
        self,
        model_repository: str | Path | None = None,
        *,
        grpc: bool = True,
        http: bool = True,
        metrics: bool = False,
        host: str = "127.0.0.1",
        **settings: Any,
    ) -> None:
        known = {f.name for f in dataclasses.fields(ServeOptions)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(
                f"fastoip.Server got unknown setting(s) {', '.join(unknown)}; "
                f"the settings are ServeOptions' fields: {', '.join(sorted(known))}"
            )
        values = {**EMBEDDED_DEFAULTS, "host": host, **settings}
        values["grpc_enabled"] = grpc and settings.get("grpc_enabled", True)
        if not http:
            values["http_port"] = -1
        if not metrics:
            values["metrics_port"] = -1
        if not values["grpc_enabled"] and values["http_port"] < 0:
            raise ValueError("fastoip.Server with neither gRPC nor HTTP has nothing to serve")
        url = str(model_repository) if isinstance(model_repository, str) and "://" in model_repository else None
        if url is not None:
            parse_location(url)  # an unsupported scheme is refused here, naming it
        root = Path(model_repository) if model_repository is not None and url is None else None
        if root is not None and not root.is_dir():
            raise FileNotFoundError(f"model repository '{root}' is not a directory")
        self.options = ServeOptions(model_repository=root, model_repository_url=url, **values)
        self._app: ServerApp | None = None
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Server:
        """Load the models and open the listeners; returns once they listen (raises if one cannot)."""
        with self._lock:
            if self._app is not None:
                raise RuntimeError("this fastoip.Server is already running")
            app = ServerApp(dataclasses.replace(self.options), own_process=False)
            try:
                app.start()
            except BaseException:
                app.shutdown()  # whatever did start is stopped again, its ports freed
                raise
            self._app = app
        return self

    def stop(self) -> None:
        """Drain and stop: readiness false, then the listeners close, calls in flight finish
        (within ``exit_timeout``), models unload. The ports are free when it returns. Idempotent."""
        with self._lock:
            app, self._app = self._app, None
        if app is not None:
            app.shutdown()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._app is not None

    # -- where it listens ---------------------------------------------------------------------------
    @property
    def app(self) -> ServerApp:
        """The running assembly (its ``core`` is the Core the frontends call)."""
        if self._app is None:
            raise RuntimeError("this fastoip.Server is not running: start() it first")
        return self._app

    @property
    def grpc_port(self) -> int:
        """The bound gRPC port (0 when gRPC is off)."""
        return self.app.grpc_port

    @property
    def http_port(self) -> int:
        """The bound HTTP port (0 when HTTP is off)."""
        return self.app.http_port

    @property
    def metrics_port(self) -> int:
        """The bound metrics port (0 when metrics are off)."""
        return self.app.metrics_port

    @property
    def grpc_url(self) -> str:
        """``host:port`` as ``tritonclient.grpc.InferenceServerClient`` takes it."""
        return _host_port(self.options.host, self._listening("grpc", self.grpc_port))

    @property
    def http_url(self) -> str:
        """``host:port`` as ``tritonclient.http.InferenceServerClient`` takes it."""
        return _host_port(self.options.http_host or self.options.host, self._listening("http", self.http_port))

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, ``http://host:port/metrics``."""
        host = self.options.metrics_host or self.options.http_host or self.options.host
        return f"http://{_host_port(host, self._listening('metrics', self.metrics_port))}/metrics"

    def _listening(self, kind: str, port: int) -> int:
        if not port:
            raise RuntimeError(f"this fastoip.Server has no {kind} listener (it was turned off)")
        return port

    def __repr__(self) -> str:
        if self._app is None:
            return f"<fastoip.Server {self.options.model_repository or 'demo repository'} stopped>"
        app = self._app
        return f"<fastoip.Server grpc={app.grpc_port} http={app.http_port} metrics={app.metrics_port}>"


def _host_port(host: str, port: int) -> str:
    # A wildcard bind is reached through loopback; an IPv6 literal needs brackets.
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

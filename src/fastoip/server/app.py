"""One server from its options: the Core and its frontends, started and drained in stages.

:class:`ServerApp` is the one assembly both users share: ``fastoip serve`` (:func:`serve`, which adds
what only a process of its own may do: logging set-up, signal handlers, collector tuning, the listening
lines scripts read) and the embedded :class:`fastoip.Server` (``fastoip/embed.py``), which runs it
inside a user's process.

Shutdown happens in stages (SIGTERM or SIGINT, or ``shutdown()``): readiness goes false, an
optional grace delay lets load balancers notice, the listeners stop taking new
calls, calls in flight finish within the exit timeout, then models unload.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import metrics
from ..allocator import settle_python_heap
from ..core import Core
from ..errors import InferenceError
from ..options import RepositoryOptions
from ..repository import ModelState
from ..repository.remote import RemoteRepository, parse_location
from ..settings import SWITCHES, apply_switches, switches_for_level
from ..shared_memory import REGION_LIMIT, REGION_LIMIT_PER_CLIENT
from ..tracing import TraceConfig
from .grpc import INT32_MAX, create_server
from .ports import PortClaims, claim_ports

if TYPE_CHECKING:
    from .grpc.native_options import NativeGrpcOptions
    from .http.protocol import HttpLimits
    from .http.server import HttpTls
    from .restricted import RestrictedFeatures

log = logging.getLogger("fastoip")

#: Default ``--shutdown-grace``: long enough for Kubernetes to take the pod out of its endpoints.
DEFAULT_SHUTDOWN_GRACE = 5.0


@dataclass
class ServeOptions:
    """Everything ``fastoip serve`` can be told."""

    model_repository: Path | None = None
    #: Further model repositories (Triton's repeated --model-repository); a model is found in the first that has it.
    more_repositories: tuple[Path, ...] = ()
    #: A repository on object storage (s3://, gs://, as://), copied to a local cache (repository/remote.py).
    model_repository_url: str | None = None
    host: str = "127.0.0.1"
    grpc_port: int = 8001
    grpc_workers: int = 16
    #: "native" (libnghttp2 on uvloop), "grpcio", or None: native when it was built, else grpcio.
    grpc_frontend: str | None = None
    #: The native frontend's settings (keepalive, TLS, windows); None: defaults.
    grpc_native: NativeGrpcOptions | None = None
    max_message_size: int = INT32_MAX
    http_host: str | None = None
    #: -1 turns HTTP off; 0 picks a free port.
    http_port: int = 8000
    http_max_body_size: int = 64 * 1024 * 1024
    #: An infer body's binary tensor data (after Inference-Header-Content-Length's JSON part), as Triton reads it.
    http_max_binary_size: int = 2**31 - 1
    #: Bytes all HTTP bodies larger than http_max_body_size may hold at once (503 with Retry-After past it).
    http_body_bytes_in_flight: int = 2 * 1024**3
    #: OpenAI's API alone on a port of its own (as Triton's OpenAI frontend); -1: off (it is always on the HTTP
    #: port too, under /v1 and /openai/v1); 0 picks a free port.
    openai_port: int = -1
    #: Triton's OpenAI frontend's --openai-restricted-api (the OpenAI port only; None: --http-restricted-api's).
    openai_restricted: RestrictedFeatures | None = None
    #: Processes that decode large JSON requests off the loop (Triton's --http-thread-count; issue 27).
    http_json_workers: int = 2
    #: Head size and field count limits, keep-alive / header / body timeouts (None: the defaults).
    http_limits: HttpLimits | None = None
    #: HTTPS (None: plain HTTP).
    http_tls: HttpTls | None = None
    #: Triton's --http-restricted-api / --grpc-restricted-protocol (None: nothing restricted).
    http_restricted: RestrictedFeatures | None = None
    grpc_restricted: RestrictedFeatures | None = None
    #: ModelStreamInfer answers models from model-settings.json with MLServer's bare ModelInferResponse messages
    #: (``--mlserver-grpc-stream``; ``fastoip mlserver start`` turns it on): grpc/mlserver_shapes.py.
    mlserver_grpc_stream: bool = False
    #: Prometheus ``/metrics`` (Triton's port); -1 turns it off, 0 picks a free port.
    metrics_port: int = 8002
    #: Triton's ``--metrics-config``: latency summaries and histograms.
    metrics_config: metrics.MetricsConfig = field(default_factory=metrics.MetricsConfig)
    #: Triton's response cache size in bytes (``--cache-config local,size=N``); 0: no cache.
    cache_size_bytes: int = 0
    strict_readiness: bool = True
    model_control_mode: str = "none"
    load_models: list = field(default_factory=list)
    poll_interval: float = 15.0
    #: Seconds readiness is false while requests are still served (Kubernetes needs a few to stop routing).
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    exit_timeout: float = 30.0
    worker_threads: int = 16
    log_level: str = "INFO"
    # Triton's command line (fastoip.triton_flags): --allow-grpc, --metrics-address, --log-format/-file, --id.
    grpc_enabled: bool = True
    metrics_host: str | None = None
    log_format: str = "default"
    log_file: str = ""
    #: Triton's --log-info / --log-warning / --log-error / --log-verbose as given (None: those of log_level).
    log_switches: dict[str, bool | int] | None = None
    server_id: str = "fastoip"
    #: Triton's ``--trace-config`` (and its deprecated ``--trace-*`` flags).
    trace_config: TraceConfig = field(default_factory=TraceConfig)
    repository: RepositoryOptions = field(default_factory=RepositoryOptions)
    #: Triton's --exit-on-error=true: a model that fails to load at start-up stops the start.
    exit_on_error: bool = False
    #: Why the server failed to initialize ("" when it did not): with --exit-on-error=false it starts its
    #: listeners anyway, loads nothing and answers as Triton's SERVER_FAILED_TO_INITIALIZE (Core.fail_initialization).
    init_error: str = ""
    #: Triton's --pinned-memory-pool-byte-size (None: 256 MB).
    pinned_pool_bytes: int | None = None
    #: Triton's --http-header-forward-pattern.
    http_forward_pattern: str | None = None
    #: Lines the start logs for Triton flags that have no effect here.
    no_effect_flags: tuple[str, ...] = ()
    #: System and CUDA shared-memory regions registered at once, in all and per client (its address).
    shared_memory_max_regions: int = REGION_LIMIT
    shared_memory_max_regions_per_client: int = REGION_LIMIT_PER_CLIENT


class ServerApp:
    """The Core and its frontends built from :class:`ServeOptions`: start(), then wait() until stop(), or shutdown().

    ``own_process``: this server is the whole process (``fastoip serve``): the collector is tuned for it and
    the listening lines are printed. An embedded server leaves the host process's settings alone.
    """

    def __init__(self, options: ServeOptions, *, own_process: bool = False) -> None:
        self.options = options
        self.own_process = own_process
        root = options.model_repository
        self.remote: RemoteRepository | None = None
        if options.model_repository_url:
            location = parse_location(options.model_repository_url)
            assert location is not None  # checked with the flags
            self.remote = RemoteRepository(location)
            self.remote.sync()  # an unreadable repository is a start-time error, as a missing folder is
            root = self.remote.local
        if root is None:
            from ..demo import default_repository

            root = default_repository()
        self.core = Core(
            [root, *options.more_repositories] if options.more_repositories else root,
            options.repository,
            worker_threads=options.worker_threads,
            strict_readiness=options.strict_readiness,
            model_control_mode=options.model_control_mode,
            startup_models=options.load_models,
            poll_interval=options.poll_interval,
            cache_size_bytes=options.cache_size_bytes,
            trace_config=options.trace_config,
            metrics_config=options.metrics_config,
        )
        self.core.server_name = options.server_id
        self.core.data.shared_memory.limit = options.shared_memory_max_regions
        self.core.data.shared_memory.limit_per_client = options.shared_memory_max_regions_per_client
        self.core.started_logging(options.log_file, options.log_format, options.log_switches)
        if self.remote is not None:
            self.core.repository.source = self.remote  # poll mode syncs before each scan
        self._stop = threading.Event()
        self._hurry = threading.Event()  # a second signal: no more grace period
        self._interactive = False  # stopped by Ctrl-C (SIGINT): an idle server skips the grace period
        self._started = False  # every listener is up: a failed start has nobody to drain
        # the running frontends (grpc.Server or the native server; HttpServer; MetricsServer), None until started
        self.grpc_server: Any = None
        self.grpc_port = 0
        self.http_server: Any = None
        self.openai_server: Any = None
        self.openai_port = 0
        self.http_port = 0
        self.metrics_server: Any = None
        self.metrics_port = 0

    def start(self) -> None:
        # The ports first: one in use is reported now, not after every model loaded.
        claims = claim_ports(self._listeners())
        try:
            log.info("model repository: %s", ", ".join(str(r) for r in self.core.repository.roots))
            if self.options.init_error:
                log.error("failed to initialize: %s (--exit-on-error=false: serving, not live, not ready)",
                          self.options.init_error)
                self.core.fail_initialization(self.options.init_error)
            else:
                self._load_models()
            self._start_frontends(claims)
        finally:
            claims.release_all()
        self._started = True

    def _load_models(self) -> None:
        """Triton's start-up: flags without effect said once, the pinned pool sized, the models loaded
        (``--exit-on-error=true``: one that failed stops the start)."""
        options = self.options
        for line in options.no_effect_flags:
            log.info("%s", line)
        if options.pinned_pool_bytes is not None:
            from .. import cuda

            cuda.set_pinned_pool_size(options.pinned_pool_bytes)
        self.core.load_models()
        if options.exit_on_error:
            index = self.core.repository_index()
            failed = sorted(entry.name for entry in index if entry.state == "UNAVAILABLE")
            # a --load-model name the repository does not hold: Triton's words (its start-up poll fails)
            known = {entry.name for entry in index}
            missing = [name for name in options.load_models if name != "*" and name not in known]
            problems = [("Invalid model name ''" if not name else
                         f"failed to poll model '{name}': model not found in any model repository") for name in missing]
            if failed:
                problems.append(f"failed to load all models ({', '.join(failed)})")
            if problems:
                raise RuntimeError(f"{'; '.join(problems)}; --exit-on-error=true")

    def _listeners(self) -> list[tuple[str, str, int]]:
        """(flag, host, port) of each listener this server will open."""
        options = self.options
        wanted = []
        if options.grpc_enabled:
            wanted.append(("--grpc-port", options.host, options.grpc_port))
        if options.http_port >= 0:
            wanted.append(("--http-port", options.http_host or options.host, options.http_port))
        if options.openai_port >= 0:
            wanted.append(("--openai-port", options.http_host or options.host, options.openai_port))
        if options.metrics_port >= 0:
            host = options.metrics_host or options.http_host or options.host
            wanted.append(("--metrics-port", host, options.metrics_port))
        return wanted

    def _start_frontends(self, claims: PortClaims) -> None:
        options = self.options
        frontend = choose_grpc_frontend(options.grpc_frontend) if options.grpc_enabled else "off"
        claims.release("--grpc-port")
        if frontend == "native":
            from .grpc.native_options import NativeGrpcOptions
            from .grpc.native_server import create_native_server

            native = options.grpc_native or NativeGrpcOptions()
            native.max_message_size = options.max_message_size
            if options.grpc_restricted is not None:
                native.restricted_protocols = options.grpc_restricted
            native.mlserver_streams = options.mlserver_grpc_stream
            self.grpc_server, self.grpc_port = create_native_server(self.core, options.host, options.grpc_port, native)
        elif frontend == "grpcio":
            if options.grpc_native is not None and options.grpc_native.use_ssl:
                raise RuntimeError("--grpc-use-ssl needs the native gRPC frontend")
            self.grpc_server, self.grpc_port = create_server(
                self.core,
                options.host,
                options.grpc_port,
                workers=options.grpc_workers,
                max_message_size=options.max_message_size,
                restricted=options.grpc_restricted,
                mlserver_streams=options.mlserver_grpc_stream,
            )
        if self.own_process:
            settle_python_heap()
        if self.grpc_server is not None:
            self.grpc_server.start()
            # Tests and scripts read these lines to learn the bound ports.
            self._announce(f"fastoip: grpc frontend {frontend}")
            self._announce(f"fastoip: grpc listening on {options.host}:{self.grpc_port}")
        if options.http_port >= 0:
            from .http import HttpServer

            claims.release("--http-port")
            http_host = options.http_host or options.host
            self.http_server = HttpServer(
                self.core,
                http_host,
                options.http_port,
                max_body_size=options.http_max_body_size,
                max_binary_size=options.http_max_binary_size,
                body_bytes_in_flight=options.http_body_bytes_in_flight,
                limits=options.http_limits,
                tls=options.http_tls,
                restricted=options.http_restricted,
                forward_header_pattern=options.http_forward_pattern,
                json_workers=options.http_json_workers,
            )
            self.http_port = self.http_server.start()
            self._announce(f"fastoip: http listening on {http_host}:{self.http_port}")
        if options.openai_port >= 0:
            from .http import HttpServer

            claims.release("--openai-port")
            openai_host = options.http_host or options.host
            self.openai_server = HttpServer(
                self.core, openai_host, options.openai_port, max_body_size=options.http_max_body_size,
                limits=options.http_limits, tls=options.http_tls,
                restricted=options.openai_restricted or options.http_restricted,
                json_workers=options.http_json_workers, openai_only=True,  # its own pool, started on first use
            )
            self.openai_port = self.openai_server.start()
            self._announce(f"fastoip: openai listening on {openai_host}:{self.openai_port}")
        if options.metrics_port >= 0:
            from .metrics_http import MetricsServer

            metrics_host = options.metrics_host or options.http_host or options.host
            claims.release("--metrics-port")
            self.metrics_server = MetricsServer(self.core, metrics_host, options.metrics_port)
            self.metrics_port = self.metrics_server.start()
            self._announce(f"fastoip: metrics listening on {metrics_host}:{self.metrics_port}")

    def _announce(self, line: str) -> None:
        if self.own_process:
            print(line, flush=True)
        else:
            log.info("%s", line)

    def stop(self, interactive: bool = False) -> None:
        """Begin shutting down; called again (a second signal), skip what is left of the grace period.

        ``interactive``: a person pressed Ctrl-C (SIGINT); with no request in flight the grace period is
        skipped. SIGTERM (an orchestrator's signal) keeps it even when idle: new traffic may still be routed
        here until the load balancer notices.
        """
        if self._stop.is_set():
            self._hurry.set()
        self._interactive = self._interactive or interactive
        self._stop.set()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait(self) -> None:
        self._stop.wait()
        self.shutdown()

    def abandon_start(self) -> NoReturn:
        """Stop during the start: the loads in progress are abandoned, not waited for (a load cannot be cancelled
        from outside: ONNX Runtime's session creation, a Python model's ``initialize`` in its worker).  No
        listener is open yet, so no request is lost; the worker processes are killed with the server and the
        object-storage copy removed, then the process ends at once (the load threads would keep a normal exit
        waiting).  Only for a server that owns its process (``fastoip serve``)."""
        loading = sorted(record.name for record in self.core.repository.records()
                         if record.state == ModelState.LOADING)
        log.warning("stopping before the models finished loading: abandoning the load%s of %s",
                    "s" if len(loading) != 1 else "", ", ".join(f"'{name}'" for name in loading) or "the models")
        for pid in _child_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.remote is not None:
            with contextlib.suppress(Exception):
                self.remote.close()
        self._announce("fastoip: stopped")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def shutdown(self) -> None:
        """Drain without losing a request: every request a listener took is answered.

        Readiness goes false first and requests are still served for ``shutdown_grace``
        (load balancers stop routing here meanwhile); then the listeners stop taking
        new calls (clients see UNAVAILABLE / connection refused: retryable) while the
        calls they took finish, up to ``exit_timeout``.  Only then does the Core refuse.
        """
        options = self.options
        grace = options.shutdown_grace
        if not self._started or options.init_error:
            grace = 0.0  # the start (or the initialization) failed: no load balancer routes here
        elif self._interactive and self.core.requests_in_flight() == 0:
            grace = 0.0
            log.info("shutting down: Ctrl-C with no request in flight, no grace period")
        if grace > 0:
            log.info("shutting down: readiness false, serving for %.1f s more", grace)
        self.core.begin_shutdown()
        if grace > 0:
            self._hurry.wait(grace)
        stopped: list[Any] = []
        deadline = time.monotonic() + options.exit_timeout
        log.info("Waiting for in-flight requests to complete.")  # Triton's words (its qa/L0_logging greps them)
        if self.grpc_server is not None:
            # Refuses new calls at once; calls in flight get up to exit_timeout.
            stopped.append(self.grpc_server.stop(grace=options.exit_timeout))
        if self.http_server is not None:
            self.http_server.stop(options.exit_timeout)
        if self.openai_server is not None:
            self.openai_server.stop(options.exit_timeout)
        for event in stopped:
            event.wait()
        # Not before: a call a listener took but whose request the Core has not seen yet must still run.
        self.core.stop_accepting()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self._close_core(deadline)
        if self.remote is not None:
            self.remote.close()  # the local copy of an object-storage repository
        self._announce("fastoip: stopped")


    def _close_core(self, deadline: float) -> None:
        """Close the Core (models unload, their ``finalize`` runs) within ``--exit-timeout`` of the drain's start,
        whatever the models do: past it, their worker processes are killed (Triton's exit timeout bounds the
        whole shutdown too)."""
        closing = threading.Thread(target=self.core.close, name="fastoip-close", daemon=True)
        closing.start()
        closing.join(max(deadline - time.monotonic(), MIN_CLOSE_S))
        if not closing.is_alive():
            return
        ended = self.core.server_link.end_backends()
        log.warning("shutting down: models still busy past --exit-timeout (%.0f s): ended %d Python worker "
                    "process(es)", self.options.exit_timeout, ended)
        closing.join(AFTER_KILL_S)
        if closing.is_alive():
            log.error("shutting down: models did not unload within %.0f s more; exiting without them", AFTER_KILL_S)


#: The least time the models get to unload at shutdown, even when the drain used up --exit-timeout.
MIN_CLOSE_S = 1.0
#: How long the unloading may take once busy models' worker processes were killed.
AFTER_KILL_S = 10.0


def choose_grpc_frontend(requested: str | None) -> str:
    """The gRPC frontend to run: the one asked for, else native when its extension was built (else grpcio)."""
    if requested == "grpcio":
        return "grpcio"
    try:
        from .grpc import _http2  # noqa: F401
    except ImportError as exc:
        if requested == "native":
            raise RuntimeError(f"--grpc-frontend native: the native extension is not built ({exc})") from None
        # a WARNING at every start: the slower frontend is otherwise found only in a benchmark
        log.warning("gRPC frontend: grpcio, several times slower than the native one, which was not built (%s): "
                    "install libnghttp2's headers (Debian: apt-get install libnghttp2-dev) and reinstall fastoip",
                    exc)
        return "grpcio"
    return "native"


def serve(options: ServeOptions) -> int:
    logging.basicConfig(
        level=getattr(logging, options.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        # Triton's --log-format ISO8601: an ISO 8601 UTC timestamp on every line.
        datefmt="%Y-%m-%dT%H:%M:%SZ" if options.log_format == "ISO8601" else None,
        **({"filename": options.log_file} if options.log_file else {"stream": sys.stderr}),
    )
    if options.log_format == "ISO8601":
        logging.Formatter.converter = time.gmtime
    for handler in logging.getLogger().handlers:
        handler.addFilter(SWITCHES)  # Triton's independent info / warning / error / verbose switches
    # before the first line (the Core's settings report them again); without Triton's flags, --log-level's
    apply_switches(options.log_switches or switches_for_level(logging.getLogger().getEffectiveLevel()))
    try:
        server = ServerApp(options, own_process=True)
    except (InferenceError, OSError) as exc:  # a repository it cannot read: a missing extra, storage refusing
        print(f"fastoip: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal %s received", signal.Signals(signum).name)
        server.stop(interactive=signum == signal.SIGINT)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The start (the model loads) runs on a thread of its own and this one waits: a signal is handled at once,
    # even while a load runs in C (ONNX Runtime) or in a worker process for 30 s.
    failure: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:
            failure.append(exc)

    starter = threading.Thread(target=start, name="fastoip-start", daemon=True)
    starter.start()
    while starter.is_alive():
        starter.join(0.1)
        if server.stop_requested() and starter.is_alive():
            server.abandon_start()
    if failure:
        if not isinstance(failure[0], (OSError, RuntimeError)):
            raise failure[0]
        # a port in use, an address that does not exist, a model that failed with --exit-on-error
        print(f"fastoip: cannot start: {failure[0]}", file=sys.stderr, flush=True)
        server.stop()
        server.shutdown()
        return 1
    server.wait()
    return 0


def _child_pids() -> list[int]:
    """This process's child processes (Python models' workers), from /proc (Linux)."""
    me = os.getpid()
    children: list[int] = []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:  # no /proc: the workers end when they find their channel closed
        return children
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            children.append(int(entry.name))
    return children

"""The Core: the one object every frontend calls; it owns the data plane and model control.

Rules:
- Frontends translate wire formats to :mod:`fastoip.types` and call the Core;
  they hold no model logic and never reach past it (not into the repository,
  the shared-memory registry or the settings).  The Core never knows which
  frontend called.
- The data plane (:mod:`.dataplane`: health, metadata, infer, statistics,
  shared memory, settings) is apart from model control (:mod:`.control`:
  index, load, unload, polling, extensions), as MLServer keeps its
  ``dataplane.py`` beside ``model_repository.py``; this class delegates.
- What needs both lives here: the server's "not ready" reason (from the index),
  the Prometheus text, the shutdown stages.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._proto import model_config_pb2 as mc
from ..core_link import CoreLink
from ..errors import InferenceError
from ..metrics import MetricsConfig, exposition_text, prometheus_text
from ..metrics.gateway import gateway_families
from ..options import RepositoryOptions
from ..repository import ModelRepository
from ..shared_memory import SYSTEM
from ..tracing import TraceConfig
from ..types import InferRequest, InferResponse
from .answers import ModelMetadata, ModelStatistics, RegionStatus, RepositoryIndexEntry, ServerMetadata
from .call import CallContext, OnDone, OnResponse, Ticket
from .control import ModelControl
from .dataplane import DataPlane
from .readiness_pool import ReadinessPool


class Core:
    """Owns the repository, the worker threads, the data plane and model control."""

    def __init__(
        self,
        repository_root: Path | Sequence[Path],
        options: RepositoryOptions | None = None,
        *,
        worker_threads: int = 16,
        strict_readiness: bool = True,
        model_control_mode: str = "none",
        startup_models: list[str] | None = None,
        poll_interval: float = 15.0,
        cache_size_bytes: int = 0,
        trace_config: TraceConfig | None = None,
        metrics_config: MetricsConfig | None = None,
    ) -> None:
        self.executor = ThreadPoolExecutor(max_workers=worker_threads, thread_name_prefix="fastoip-worker")
        # What the backends reach in this Core (a Triton Python model's BLS calls) and leave with it (their worker
        # processes, which shutdown may end; their models' metric families): its own link, in its own options copy.
        link = CoreLink()
        self.server_link = link
        options = dataclasses.replace(options or RepositoryOptions(), server_link=link)
        try:
            #: This server's ``--metrics-config`` (its own: two servers in one process keep theirs).
            self.metrics_config = metrics_config or MetricsConfig()
            self.repository = ModelRepository(repository_root, self.executor, options, self.metrics_config)
            self.control = ModelControl(
                self.repository,
                model_control_mode=model_control_mode,
                startup_models=startup_models,
                poll_interval=poll_interval,
            )
        except BaseException:
            self.executor.shutdown(wait=False)
            raise
        #: Where the frontends ask a readiness that may wait on model code (:meth:`readiness_waits`): its own
        #: few threads, bounded, never the workers, the loads, or an event loop.
        self.readiness_pool = ReadinessPool()
        self.data = DataPlane(
            self.repository, self.control.extensions, strict_readiness=strict_readiness,
            cache_size_bytes=cache_size_bytes, trace_config=trace_config,
        )
        link.attach(self, CallContext)

    @property
    def repository_root(self) -> Path:
        return self.repository.root

    @property
    def extensions(self) -> tuple[str, ...]:
        return self.control.extensions

    @property
    def server_name(self) -> str:
        """The server metadata name (Triton's --id); the app sets it from its options."""
        return self.data.server_name

    @server_name.setter
    def server_name(self, name: str) -> None:
        self.data.server_name = name

    def started_logging(
        self, log_file: str, log_format: str, switches: dict[str, bool | int] | None = None
    ) -> None:
        """The process's --log-file and --log-format, which the log settings report (as Triton's), and
        Triton's --log-info / --log-warning / --log-error / --log-verbose switches it started with."""
        self.data.log_settings_store.started_with(log_file, log_format, switches)

    def fail_initialization(self, reason: str) -> None:
        """Triton's SERVER_FAILED_TO_INITIALIZE (a --model-repository that does not exist, with
        --exit-on-error=false): the server stays up, not live and not ready, no model is loaded; server
        metadata, shared memory, trace and log settings and metrics still answer; every model, repository and
        inference request is answered Unavailable "Server not ready"."""
        self.data.init_error = reason
        self.data.shutting_down = True  # the inference path's one refusal check (it reads init_error)

    # -- model control --------------------------------------------------------------
    def load_models(self) -> None:
        self.control.load_models()

    def repository_index(self, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        self.data.check_initialized()
        return self.control.repository_index(ready_only)

    def load_model(
        self, name: str, parameters: dict[str, Any] | None = None, client_gone: threading.Event | None = None
    ) -> None:
        """``client_gone``: the frontend sets it when the load's client disconnects or cancels; the load stops."""
        self.data.check_initialized()
        self.control.load_model(name, parameters, client_gone)

    def check_model_control(self, action: str) -> None:
        """The refusal a load or unload would get for the server's mode, before its request is read (issue 37)."""
        self.data.check_initialized()
        self.control.check_explicit(action)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.data.check_initialized()
        self.control.unload_model(name, unload_dependents)

    @property
    def model_control_mode(self) -> str:
        """``none``, ``poll`` or ``explicit`` (Triton's --model-control-mode)."""
        return self.control.model_control_mode

    # -- health -----------------------------------------------------------------------
    def server_live(self) -> bool:
        return self.data.server_live()

    def server_ready(self) -> bool:
        return self.data.server_ready()

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.data.model_ready(name, version)

    def readiness_waits(self, name: str | None = None, version: str = "") -> bool:
        """Whether the readiness of model ``name`` (None: the server's) may wait on model code: a frontend then
        asks it on :attr:`readiness_pool`, never on its event loop (the common case stays on the loop)."""
        return self.data.readiness_waits(name, version)

    def model_known(self, name: str) -> bool:
        return self.data.model_known(name)

    def not_ready_reason(self) -> str:
        """Why the server is not ready ("" when it is), the same for every frontend."""
        if self.data.server_ready():
            return ""
        if self.data.init_error:
            return f"the server is not ready: it failed to initialize ({self.data.init_error})"
        if self.data.draining or self.data.shutting_down:
            return "the server is not ready: it is shutting down"
        failed = [
            f"'{entry.name}' is {entry.state or 'not loaded'}" + (f" ({entry.reason})" if entry.reason else "")
            for entry in self.control.repository_index()
            if entry.state != "READY"
        ]
        return "the server is not ready: " + ("; ".join(failed) if failed else "not every model is ready")

    def model_not_ready_reason(self, name: str, version: str = "") -> str:
        """Why model ``name`` is not ready ("" when it is): the lookup's error, or the shutdown."""
        self.data.check_initialized()
        if self.data.model_ready(name, version):
            return ""
        try:
            self.data.model_metadata(name, version)
        except InferenceError as exc:
            return exc.message
        if not (self.data.draining or self.data.shutting_down):
            for entry in self.control.repository_index():
                if entry.name == name and entry.reason and entry.state != "READY":
                    return f"model '{name}' is not ready: {entry.reason}"
            return f"model '{name}' is not ready"
        return f"model '{name}' is not ready: the server is shutting down"

    # -- metadata -----------------------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return self.data.server_metadata()

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self.data.model_metadata(name, version)

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.data.model_config(name, version)

    def model_directory(self, name: str, version: str = "") -> Path:
        """The loaded model's folder: where a frontend finds the files that describe its wire form (a chat
        template); NotFound / Unavailable as ``model_config``."""
        return self.data.model_directory(name, version)

    # -- inference: one verb ------------------------------------------------------------
    def start(
        self,
        request: InferRequest,
        call: CallContext | None,
        on_done: OnDone,
        on_response: OnResponse | None = None,
    ) -> Ticket:
        """Start ``request`` without blocking; ``on_done(call)`` on the finishing thread (see ``DataPlane.start``)."""
        return self.data.start(request, call, on_done, on_response)

    def infer(self, request: InferRequest, call: CallContext | None = None) -> InferResponse:
        """``start`` and wait, on the calling thread (which runs a queue-less model itself)."""
        return self.data.infer(request, call)

    async def infer_async(self, request: InferRequest, call: CallContext | None = None) -> InferResponse:
        """``start`` and await, on the running event loop."""
        return await self.data.infer_async(request, call)

    @property
    def tracing(self) -> bool:
        """Whether any request may be traced now (frontends take their timestamps only then)."""
        return self.data.tracer.active

    # -- statistics -----------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        return self.data.statistics(name, version)

    def prometheus_metrics(self) -> str:
        """Every loaded version's statistics as Prometheus text, under Triton's metric names."""
        models = [model for record in self.repository.records() for model in record.versions.values()]
        pending = {(m.name, m.version_str): m.scheduler.pending() for m in models}
        cached = frozenset(
            (m.name, m.version_str) for m in models if m.uses_response_cache and self.data.response_cache is not None
        )
        text = prometheus_text(
            self.data.statistics_snapshots(), pending, {(m.name, m.version_str): m.stats for m in models}, cached,
            self.metrics_config,
        )
        in_flight = {(m.name, m.version_str): m.in_flight for m in models}
        text += exposition_text(gateway_families(pending, in_flight))  # the inference gateway's names
        return text + self.server_link.custom_metrics.text()  # the models' own families (pb_utils.MetricFamily)

    # -- shared memory and settings ---------------------------------------------------------
    def shared_memory_status(self, name: str = "", kind: str = SYSTEM) -> list[RegionStatus]:
        return self.data.shared_memory_status(name, kind)

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int, client: str = ""
    ) -> None:
        """``client``: the caller's address (registrations are bounded per client); "" for callers in process."""
        self.data.register_system_shared_memory(name, key, offset, byte_size, client)

    def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, client: str = ""
    ) -> None:
        self.data.register_cuda_shared_memory(name, raw_handle, device_id, byte_size, client)

    def unregister_shared_memory(self, name: str = "", kind: str = SYSTEM) -> None:
        self.data.unregister_shared_memory(name, kind)

    def trace_settings(self, model: str = "") -> dict[str, list[str]]:
        return self.data.trace_settings(model)

    def update_trace_settings(self, changes: dict[str, list[str] | None], model: str = "") -> dict[str, list[str]]:
        return self.data.update_trace_settings(changes, model)

    def log_settings(self) -> dict[str, Any]:
        return self.data.log_settings()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.data.update_log_settings(changes)

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.data.draining

    def requests_in_flight(self) -> int:
        """Requests the models hold now (queued or running), all versions together."""
        return sum(model.in_flight for record in self.repository.records() for model in record.versions.values())

    def begin_shutdown(self) -> None:
        """First shutdown stage: readiness goes false so load balancers stop routing here,
        but requests that still arrive are served (no 'unknown model' while traffic drains)."""
        self.data.draining = True
        self.repository.stopping.set()  # issue 37: a load's warmup in progress stops, so the shutdown goes on

    def stop_accepting(self) -> None:
        """Second stage: the listeners are closing; anything new is refused."""
        self.data.draining = True
        self.data.shutting_down = True

    def close(self) -> None:
        self.control.stop_polling()
        self.repository.close()
        self.executor.shutdown(wait=True, cancel_futures=False)
        self.readiness_pool.shutdown(wait=False, cancel_futures=True)
        self.data.tracer.close()  # after the workers: the last traces are written, queued spans exported

"""The Core: the one API every frontend calls (health, metadata, infer, repository, statistics).

Rules:
- Frontends translate wire formats to the types in ``types.py`` and call the
  Core; they hold no model logic.  The Core never knows which frontend called.
- ``infer`` blocks the calling thread (for thread-based frontends such as the
  sync gRPC server); ``submit`` and ``infer_async`` never block (for event-loop
  frontends).  Both go through the same prepare -> scheduler -> statistics path.
- Errors are :mod:`fastoip.errors` values; the frontends map them to statuses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from . import __version__, cuda
from ._proto import model_config_pb2 as mc
from .errors import InferenceError, InvalidArgument, NotFound, Unavailable
from .metrics import prometheus_text
from .repository import ModelRepository, ModelState, RepositoryOptions
from .repository.config import config_from_json
from .repository.loaded import LoadedModel
from .response_outputs import finish_outputs
from .scheduling.job import Job
from .settings import LogSettings, TraceSettings
from .shared_memory import SharedMemoryRegistry, check_intact, uses_region, write_output
from .types import InferRequest, InferResponse

log = logging.getLogger("fastoip.core")

SERVER_NAME = "fastoip"

#: Server-metadata extensions: exactly what this server implements.
EXTENSIONS = (
    "classification",
    "model_configuration",
    "statistics",
    "parameters",
    "model_repository",
    "schedule_policy",
    "system_shared_memory",
    "trace",
    "logging",
)


class Core:
    """Owns the repository and the worker threads; serves every frontend."""

    def __init__(
        self,
        repository_root: Path,
        options: Optional[RepositoryOptions] = None,
        *,
        worker_threads: int = 16,
        strict_readiness: bool = True,
        model_control_mode: str = "none",
        startup_models: Optional[list[str]] = None,
        poll_interval: float = 15.0,
    ) -> None:
        if model_control_mode not in ("none", "poll", "explicit"):
            raise ValueError(f"model control mode must be none, poll or explicit, not '{model_control_mode}'")
        self.executor = ThreadPoolExecutor(max_workers=worker_threads, thread_name_prefix="fastoip-worker")
        self.repository = ModelRepository(repository_root, self.executor, options)
        self.strict_readiness = strict_readiness
        self.model_control_mode = model_control_mode
        self.startup_models = list(startup_models or [])
        self.poll_interval = poll_interval
        self.poller = None
        #: Readiness is false from the first shutdown stage; requests are still served.
        self.draining = False
        #: New requests are refused (the listeners are closing).
        self.shutting_down = False
        self.extensions = list(EXTENSIONS)
        if cuda.runtime() is not None:
            self.extensions.append("cuda_shared_memory")
        self.shared_memory = SharedMemoryRegistry()
        #: The server metadata name (Triton's --id).
        self.server_name = SERVER_NAME
        self.log_settings = LogSettings()
        self.trace_settings = TraceSettings()

    def load_models(self) -> None:
        """Load what the model control mode says to load at start-up."""
        if self.model_control_mode == "explicit":
            if "*" in self.startup_models:
                self.repository.load_all()
            else:
                for name in self.startup_models:
                    try:
                        self.repository.load(name)
                    except InferenceError as exc:
                        log.error("model '%s' failed to load: %s", name, exc)
            return
        if self.startup_models:
            raise ValueError("--load-model is only valid with --model-control-mode explicit")
        self.repository.load_all()
        if self.model_control_mode == "poll":
            from .repository.poller import RepositoryPoller

            self.poller = RepositoryPoller(self.repository, self.poll_interval)
            self.poller.remember_current()
            self.poller.start()

    # -- health -----------------------------------------------------------
    def server_live(self) -> bool:
        return self.repository.all_alive()

    def server_ready(self) -> bool:
        if self.draining or self.shutting_down:
            return False
        if self.strict_readiness:
            return self.repository.all_ready()
        return True

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            model = self.repository.get(name, version)
        except InferenceError:
            return False
        return not (self.draining or self.shutting_down) and model.is_ready()

    # -- metadata -----------------------------------------------------------
    def server_metadata(self) -> dict:
        return {"name": self.server_name, "version": __version__, "extensions": list(self.extensions)}

    def model_metadata(self, name: str, version: str = "") -> dict:
        model = self.repository.get(name, version)
        record = self.repository.record(name)
        assert record is not None
        inputs, outputs = model.tensor_metadata()
        return {
            "name": name,
            "versions": [str(v) for v in sorted(record.versions)],
            "platform": model.config.platform or model.config.backend,
            "inputs": inputs,
            "outputs": outputs,
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.repository.get(name, version).config

    # -- inference -------------------------------------------------------------
    def prepare(self, request: InferRequest, deadline_ns: int = 0) -> tuple[LoadedModel, Job]:
        """Find the model and validate the request: the part of infer that can fail fast."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and accepts no new requests")
        model = self.repository.get(request.model_name, request.model_version)
        regions: list = []  # system shared-memory regions used: checked again when the job is done
        for tensor in request.inputs:
            if tensor.data is None and uses_region(tensor.parameters):
                tensor.data = self.shared_memory.input_view(
                    tensor.name, tensor.datatype, tuple(tensor.shape), tensor.parameters, regions
                )
        job = model.prepare(request)
        if request.outputs:
            job.destinations = self._output_destinations(request, regions)
        job.regions = regions or None
        job.deadline_ns = deadline_ns
        model.enter()
        return model, job

    def infer(
        self,
        request: InferRequest,
        deadline_ns: int = 0,
        watch: Optional[Callable[[Job], None]] = None,
    ) -> InferResponse:
        """Run ``request`` and block until its response (or raise its error).

        ``watch(job)`` is called for a request that will wait in a queue, before it is
        queued: the frontend sets its client deadline and cancels it when the call ends.
        """
        model, job = self.prepare(request, deadline_ns)
        if model.scheduler.queues:
            job.arm()  # it will wait in a queue: other threads may finish or cancel it
            if watch is not None:
                watch(job)
        try:
            model.scheduler.run(job)
            response = job.wait()
            if request.outputs or model.spec.reshaped:  # reshape back, classification; before shared memory
                finish_outputs(model.spec, request, response)
            if job.destinations:
                self._write_shared_memory_outputs(job.destinations, response)
            if job.regions:
                check_intact(job.regions)
        except InferenceError as exc:
            model.stats.record_request(False, time.monotonic_ns() - job.arrival_ns, error=exc)
            raise
        finally:
            model.leave()
        model.stats.record_request(True, time.monotonic_ns() - job.arrival_ns, job.queue_ns)
        if self.trace_settings.active:
            self._trace(model, job)
        return response

    def _trace(self, model: LoadedModel, job: Job) -> None:
        self.trace_settings.record(
            model.name,
            model.version_str,
            job.request.id,
            [
                ("REQUEST_START", job.arrival_ns),
                ("QUEUE_START", job.arrival_ns),
                ("COMPUTE_START", job.compute_start_ns),
                ("COMPUTE_END", job.compute_end_ns),
                ("REQUEST_END", time.monotonic_ns()),
            ],
        )

    def submit(
        self,
        request: InferRequest,
        on_done: Callable[[Job], None],
        deadline_ns: int = 0,
        run_here: bool = False,
    ) -> Job:
        """Start ``request`` without blocking; ``on_done(job)`` runs on the thread that finished it.

        ``run_here``: when the model has no queue (direct scheduler), execute on
        the calling thread instead of handing off to a worker (for callers that
        are a dedicated reader thread, like a gRPC stream).
        """
        model, job = self.prepare(request, deadline_ns)
        stats = model.stats

        def done(finished: Job) -> None:
            if finished.error is None and (
                finished.destinations or finished.regions or request.outputs or model.spec.reshaped
            ):
                try:
                    finish_outputs(model.spec, request, finished.response)  # type: ignore[arg-type]
                    if finished.destinations:
                        self._write_shared_memory_outputs(finished.destinations, finished.response)  # type: ignore[arg-type]
                    if finished.regions:
                        check_intact(finished.regions)
                except InferenceError as exc:
                    finished.error, finished.response = exc, None
            model.leave()
            stats.record_request(
                finished.error is None, time.monotonic_ns() - finished.arrival_ns, finished.queue_ns, finished.error
            )
            if finished.error is None and self.trace_settings.active:
                self._trace(model, finished)
            on_done(finished)

        job.on_done(done)
        job.arm()  # the stream or event loop that called may cancel it from another thread
        if run_here and not model.scheduler.queues:
            model.scheduler.run(job)
        else:
            model.scheduler.submit(job)
        return job

    def _output_destinations(
        self, request: InferRequest, regions: list
    ) -> "Optional[dict[str, np.ndarray | cuda.DeviceBytes]]":
        """Region bytes for the outputs the client wants in shared memory, or None."""
        wanted = {
            o.name: self.shared_memory.output_view(o.name, o.parameters, regions)
            for o in request.outputs
            if uses_region(o.parameters)
        }
        return wanted or None

    @staticmethod
    def _write_shared_memory_outputs(destinations: dict, response: InferResponse) -> None:
        """Put outputs into their regions; the response keeps an empty entry for each, as Triton sends."""
        for output in response.outputs:
            destination = destinations.get(output.name)
            if destination is not None and output.data is not None:
                write_output(output.name, output.data, output.datatype, destination)
                output.data = None

    async def infer_async(self, request: InferRequest, deadline_ns: int = 0) -> InferResponse:
        """``infer`` for asyncio frontends: the event loop never blocks."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def resolve(job: Job) -> None:
            if not future.done():
                if job.error is not None:
                    future.set_exception(job.error)
                else:
                    future.set_result(job.response)

        job = self.submit(request, lambda j: loop.call_soon_threadsafe(resolve, j), deadline_ns)
        try:
            return await future
        except asyncio.CancelledError:
            job.cancel()
            raise

    # -- statistics and repository ---------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[dict]:
        if name:
            record = self.repository.record(name)
            if record is None:
                raise NotFound(f"requested model '{name}' is not found")
            if version:
                return [self.repository.get(name, version).stats.snapshot()]
            return [m.stats.snapshot() for _, m in sorted(record.versions.items())]
        return [
            model.stats.snapshot()
            for record in self.repository.records()
            for _, model in sorted(record.versions.items())
        ]

    def prometheus_metrics(self) -> str:
        """Every loaded version's statistics as Prometheus text, under Triton's metric names."""
        models = [model for record in self.repository.records() for model in record.versions.values()]
        pending = {(m.name, m.version_str): m.scheduler.pending() if m.scheduler.queues else 0 for m in models}
        return prometheus_text(self.statistics(), pending, {(m.name, m.version_str): m.stats for m in models})

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        known = {r.name: r for r in self.repository.records()}
        index = []
        for name in sorted(set(self.repository.model_names()) | set(known)):
            record = known.get(name)
            if record is None:
                if not ready_only:
                    index.append({"name": name, "version": "", "state": "", "reason": ""})
                continue
            if record.versions:
                # reason: why the latest load failed, while older versions keep serving
                for version in sorted(record.versions):
                    index.append(
                        {"name": name, "version": str(version), "state": record.state.value, "reason": record.reason}
                    )
            elif not ready_only:
                index.append({"name": name, "version": "", "state": record.state.value, "reason": record.reason})
        if ready_only:
            index = [entry for entry in index if entry["state"] == ModelState.READY.value]
        return index

    def load_model(self, name: str, parameters: Optional[dict] = None) -> None:
        """Load or reload ``name`` (explicit mode); the old versions serve until the new ones are ready.

        ``parameters`` are the load request's, as Triton reads them: ``config`` (a
        ModelConfig as JSON) overrides config.pbtxt; ``file:<path>`` (bytes) are the
        files of a model directory to load instead of the repository's, and need a ``config``.
        """
        self._check_explicit("load")
        override = None
        files: dict[str, bytes] = {}
        for key, value in (parameters or {}).items():
            if key.startswith("file:"):
                if not isinstance(value, bytes):
                    raise InvalidArgument(f"load '{name}': '{key}' must carry the file's bytes")
                files[key[len("file:") :]] = value
            elif key == "config":
                override = config_from_json(name, value)
        if files and override is None:
            raise InvalidArgument(f"load '{name}': model files in the request need a 'config' parameter too")
        self.repository.load(name, override, files or None, from_client=True)

    def unload_model(self, name: str) -> None:
        """Stop serving ``name`` (explicit mode); requests in flight finish first."""
        self._check_explicit("unload")
        self.repository.unload(name)

    def _check_explicit(self, action: str) -> None:
        if self.model_control_mode == "poll":
            raise Unavailable(f"explicit model {action} is not allowed if polling is enabled")
        if self.model_control_mode == "none":
            raise Unavailable(
                f"explicit model {action} is not allowed in model control mode 'none' "
                "(start the server with --model-control-mode explicit)"
            )

    # -- lifecycle -----------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """First shutdown stage: readiness goes false so load balancers stop routing here,
        but requests that still arrive are served (no 'unknown model' while traffic drains)."""
        self.draining = True

    def stop_accepting(self) -> None:
        """Second stage: the listeners are closing; anything new is refused."""
        self.draining = True
        self.shutting_down = True

    def close(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        self.repository.close()
        self.executor.shutdown(wait=True, cancel_futures=False)

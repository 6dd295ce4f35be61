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

from . import __version__
from ._proto import model_config_pb2 as mc
from .errors import InferenceError, NotFound, Unavailable
from .repository import ModelRepository, ModelState, RepositoryOptions
from .repository.loaded import LoadedModel
from .scheduling.job import Job
from .types import InferRequest, InferResponse

log = logging.getLogger("fastoip.core")

SERVER_NAME = "fastoip"

#: Server-metadata extensions: exactly what this server implements.
EXTENSIONS = (
    "model_configuration",
    "statistics",
    "parameters",
    "model_repository",
    "schedule_policy",
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
    ) -> None:
        self.executor = ThreadPoolExecutor(max_workers=worker_threads, thread_name_prefix="fastoip-worker")
        self.repository = ModelRepository(repository_root, self.executor, options)
        self.strict_readiness = strict_readiness
        self.shutting_down = False
        self.extensions = list(EXTENSIONS)

    def load_models(self) -> None:
        self.repository.load_all()

    # -- health -----------------------------------------------------------
    def server_live(self) -> bool:
        return self.repository.all_alive()

    def server_ready(self) -> bool:
        if self.shutting_down:
            return False
        if self.strict_readiness:
            return self.repository.all_ready()
        return True

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            model = self.repository.get(name, version)
        except InferenceError:
            return False
        return not self.shutting_down and model.is_ready()

    # -- metadata -----------------------------------------------------------
    def server_metadata(self) -> dict:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(self.extensions)}

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
        job = model.prepare(request)
        job.deadline_ns = deadline_ns
        return model, job

    def infer(
        self,
        request: InferRequest,
        deadline_ns: int = 0,
        watch: Optional[Callable[[Job], None]] = None,
    ) -> InferResponse:
        """Run ``request`` and block until its response (or raise its error)."""
        model, job = self.prepare(request, deadline_ns)
        if watch is not None and model.scheduler.queues:
            watch(job)
        try:
            model.scheduler.run(job)
            response = job.wait()
        except InferenceError:
            model.stats.record_request(False, time.monotonic_ns() - job.arrival_ns)
            raise
        model.stats.record_request(True, time.monotonic_ns() - job.arrival_ns, job.queue_ns)
        return response

    def submit(self, request: InferRequest, on_done: Callable[[Job], None], deadline_ns: int = 0) -> Job:
        """Start ``request`` without blocking; ``on_done(job)`` runs on a worker thread."""
        model, job = self.prepare(request, deadline_ns)
        stats = model.stats

        def done(finished: Job) -> None:
            stats.record_request(
                finished.error is None, time.monotonic_ns() - finished.arrival_ns, finished.queue_ns
            )
            on_done(finished)

        job.on_done(done)
        model.scheduler.submit(job)
        return job

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
                for version in sorted(record.versions):
                    index.append({"name": name, "version": str(version), "state": record.state.value, "reason": ""})
            elif not ready_only:
                index.append({"name": name, "version": "", "state": record.state.value, "reason": record.reason})
        if ready_only:
            index = [entry for entry in index if entry["state"] == ModelState.READY.value]
        return index

    def load_model(self, name: str, config_override: Optional[mc.ModelConfig] = None) -> None:
        self.repository.load(name, config_override)

    def unload_model(self, name: str) -> None:
        self.repository.unload(name)

    # -- lifecycle -----------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Readiness goes false; new requests are refused."""
        self.shutting_down = True

    def close(self) -> None:
        self.repository.close()
        self.executor.shutdown(wait=True, cancel_futures=False)

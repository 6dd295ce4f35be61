"""MLServer runtimes in worker processes: ``parallel_workers`` processes, each loading the runtime.

Rules:
- Chosen per model with model-settings.json ``"parameters": {"fastoip_hosting": "process"}``; ``"in_process"``
  (the default, :data:`HOSTING_DEFAULT`, measured faster: benchmarks/RESULTS.md, mlserver3) keeps the runtime in
  the server process (:mod:`.runtime`).
- Each worker is a :class:`~..triton.instances.ProcessInstance` (the hosting Triton's Python models use) whose start
  message is ``LoadMLServer(spec, memory_mb)``: the worker imports the runtime's module and loads it
  (:class:`fastoip.pyworker.mlserver_runner.MLServerRunner`).  A worker that dies fails what it was running with
  INTERNAL naming the model, the instance and the cause, and is started again (up to the crash limit), as
  for Triton's Python models.
- Requests cross as MLServer sees them: each input's shape and parameters (``content_type``) and the requested
  outputs' parameters go with the tensors; each output's parameters come back (see the runner's docstring).
- ``mlserver.register`` / ``mlserver.log`` in a worker reach ``/metrics``: every worker writes
  prometheus_client's multiprocess files into one directory of this server process (:func:`metrics_dir`),
  exported through a ``MultiProcessCollector`` (what MLServer's own parallel workers do); the files of a
  worker that died stay (its counts are kept); the directory is removed when the server process exits.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .... import metrics
from ...._proto import model_config_pb2 as mc
from ....errors import InferenceError, InvalidArgument
from ....model_config import MODEL_SETTINGS, MODEL_SETTINGS_PARAMETER, version_name
from ....pyworker.channel import LoadMLServer, RequestData
from ....pyworker.mlserver_runner import give_request_id
from ....types import InferOutput, InferResponse, text_inputs
from ..hosting.worker_process import WorkerDied, WorkerError
from ..triton import server_bridge as bridge
from ..triton.instances import ProcessInstance

if TYPE_CHECKING:
    from ....scheduling.job import Job

#: model-settings.json ``parameters`` key choosing where the runtime runs.
HOSTING_PARAMETER = "fastoip_hosting"
HOSTINGS = ("in_process", "process")
#: In the server process unless the model says otherwise (measured: benchmarks/RESULTS.md, mlserver3).
HOSTING_DEFAULT = "in_process"

_lock = threading.Lock()
_metrics_dir: str | None = None


def hosting_of(document: dict[str, Any], model_name: str) -> str:
    """Where the model's runtime runs: ``parameters.fastoip_hosting`` of its model-settings.json."""
    hosting = (document.get("parameters") or {}).get(HOSTING_PARAMETER, HOSTING_DEFAULT)
    if hosting not in HOSTINGS:
        raise InvalidArgument(
            f"model '{model_name}': parameters.{HOSTING_PARAMETER} must be \"in_process\" or \"process\", "
            f"got {hosting!r}"
        )
    return str(hosting)


def metrics_dir() -> str:
    """The directory the runtimes' workers write their metrics into (made and exported on first use)."""
    global _metrics_dir
    with _lock:
        if _metrics_dir is None:
            from prometheus_client import CollectorRegistry
            from prometheus_client.multiprocess import MultiProcessCollector

            path = tempfile.mkdtemp(prefix="fastoip-mlserver-metrics-")
            atexit.register(shutil.rmtree, path, True)
            registry = CollectorRegistry(auto_describe=True)
            MultiProcessCollector(registry, path=path)
            metrics.add_registry(registry)
            _metrics_dir = path
        return _metrics_dir


def settings_source(folder: Path) -> str:
    """The model-settings.json a runtime's relative ``parameters.uri`` resolve beside (MLServer's ``_source``)."""
    for candidate in (folder, folder.parent):
        if (candidate / MODEL_SETTINGS).is_file():
            return str(candidate / MODEL_SETTINGS)
    return str(folder / MODEL_SETTINGS)


def runtime_spec(runtime_class: type, model_name: str, version: int, path: Path, document: dict[str, Any],
                 streams_only: bool) -> dict[str, Any]:
    """What a worker needs to import and load the runtime (see ``MLServerRunner``)."""
    module = sys.modules.get(runtime_class.__module__)
    return {
        "name": model_name,
        "version": version,
        "module": runtime_class.__module__,
        "module_file": getattr(module, "__file__", None),
        "folder": str(path.parent),
        "qualname": runtime_class.__qualname__,
        "document": document,
        "source": settings_source(path.parent),
        "metrics_dir": metrics_dir(),
        "streams_only": streams_only,
    }


def respond(job: Job, version_str: str, data: Any) -> InferResponse | InferenceError:
    """The runner's plain response as ``job``'s response: the outputs it asked for, with their parameters."""
    outputs, error, described = data
    if error is not None:
        return bridge.error_of(error[0], error[1])
    wanted = job.output_names
    output_parameters = described.get("outputs", {})
    produced = [
        InferOutput(name, datatype, tuple(array.shape), array, output_parameters.get(name))
        for name, datatype, array in outputs
        if not wanted or name in wanted
    ]
    request = job.request
    return InferResponse(request.model_name, version_str, request.id, described.get("parameters") or {}, produced)


def request_data(job: Job) -> RequestData:
    """``job`` as the plain data the worker's runner takes (each input's shape and parameters with it)."""
    request = job.request
    give_request_id(request)  # MLServer's data plane names every request; the response carries the id
    described = {
        "parameters": dict(request.parameters),
        "inputs": {t.name: (list(t.shape), dict(t.parameters)) for t in request.inputs},
        "text": sorted(text_inputs(request)),  # BYTES that came as JSON strings: str for the runtime, as MLServer
    }
    inputs = [(t.name, t.datatype, job.feeds[t.name]) for t in request.inputs]
    requested = [(o.name, dict(o.parameters)) for o in request.outputs]
    return RequestData(request.id, 0, 0, described, inputs, requested, None)


def start_workers(
    runtime_class: type, model_name: str, version: int, path: Path, config: mc.ModelConfig, options: Any,
    streams_only: bool,
) -> list[Any]:
    """The model's workers, one per instance (``parallel_workers``), each with the runtime loaded."""
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    document = json.loads(parameters.get(MODEL_SETTINGS_PARAMETER) or "{}")
    try:
        memory_mb = int(parameters.get("worker_memory_limit_mb") or 0)
    except ValueError:
        raise InvalidArgument(f"model '{model_name}': parameter 'worker_memory_limit_mb' must be an integer") from None
    spec = runtime_spec(runtime_class, model_name, version, path, document, streams_only)
    count = sum(group.count for group in config.instance_group) or 1
    workers: list[Any] = []
    try:
        for index in range(count):
            # one worker process hosting the runtime per instance (``parallel_workers`` of them)
            workers.append(ProcessInstance(
                model_name, version_name(config, version), index, streams_only, [LoadMLServer(spec, memory_mb)],
                bridge.link_of(options), respond, request_data=request_data,
            ))
    except (WorkerDied, WorkerError) as exc:
        for worker in workers:
            worker.close()
        text = f"its Python worker process {exc.cause} while loading" if isinstance(exc, WorkerDied) else str(exc)
        raise InvalidArgument(f"model '{model_name}': {text}") from None
    except BaseException:
        for worker in workers:
            worker.close()
        raise
    return workers

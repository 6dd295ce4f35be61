"""Python backend: custom models written as ``fastoip.Model`` subclasses.

Layout: ``<repository>/<model>/<version>/model.py`` plus either Triton's
``<model>/config.pbtxt`` (``backend: "python"``) or MLServer's
``<model>/model-settings.json`` (converted by :func:`read_model_settings`).

Rules:
- ``model.py`` is imported once per file version (re-imported when the file
  changes and the model is loaded again), with its version directory on
  ``sys.path`` while it imports.  The class is the one named by the config
  parameter ``implementation`` (a class name in model.py, or
  ``module.Class``), else the only ``fastoip.Model`` subclass model.py defines
  that no other class there derives from.
- ``@on_deployment`` hooks run once per server process, before any instance
  of any model is built: ``prepare`` (called by the repository for every
  model before the first load) runs them; ``load`` runs those not run yet.
- Per instance (``instance_group { count }``): ``__init__``, ``load()``, the
  ``@on_startup`` hooks; at unload or server stop, after the requests in
  flight on it have finished: the ``@on_shutdown`` hooks (reverse order),
  then ``unload()``.  Anything raising during a load fails the whole load
  (instances already started are shut down again); the repository then
  marks the model UNAVAILABLE with the reason.
- Sync methods run on the thread that executes the request (a scheduler or
  gRPC worker thread); ``async def`` methods run on ONE event loop thread
  shared by every Python model, and the calling thread waits for them.
- Schedulers see each instance as ``max_concurrency`` lanes (config
  parameter, default 1): the number of requests that may run on one model
  object at a time (more than 1 is for async models).
- Requests reach the model whole (a ``Backend`` of its own, ``scheduling/contract.py``): the content types of
  the request and of each input decide what ``predict`` gets, and outputs
  carry their content type back (see :mod:`fastoip.content_types`).  When
  the model is batchable, jobs merged by the dynamic batcher that agree on
  parameters and content types go to one ``predict`` call; others run one
  by one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .._proto import model_config_pb2 as mc
from ..content_types import (
    ModelContentTypes,
    Tensor,
    decode_request,
    encode_output,
    split_response,
)
from ..datatypes import CONFIG_TO_V2, NUMPY_DTYPES, bf16_bits_from_float32
from ..errors import InferenceError, InternalError, InvalidArgument, Unavailable
from ..lifecycle import DEPLOYMENT, SHUTDOWN, STARTUP, hook_names, is_batchable
from ..model import Model
from ..repository.config import MODEL_SETTINGS, DiscoveredTensor, TensorSpec, complete_config, model_spec, parameter
from ..scheduling.contract import Execution, Results
from ..scheduling.execute import check_rows, merge_inputs, row_slices
from ..types import InferOutput, InferResponse

if TYPE_CHECKING:
    from ..scheduling.job import Job

log = logging.getLogger("fastoip.python")

#: Request parameters that only steer the scheduler: requests that differ only in these batch together.
SCHEDULER_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end"})
#: How long an unload waits for requests in flight on an instance before running its shutdown hooks.
DRAIN_TIMEOUT_S = 60.0
#: How long a health check waits for an async ``is_ready`` / ``is_alive``.
HEALTH_TIMEOUT_S = 5.0


# -- the event loop all async model code runs on -------------------------------------------
class _EventLoop:
    """One asyncio loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="fastoip-python-loop", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def run(self, awaitable: Any, timeout: float | None = None) -> Any:
        """Run ``awaitable`` on the loop and wait for its result (from any other thread)."""
        loop = self.loop()
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking call into the Python backend's event loop from the loop itself")

        async def wrapper() -> Any:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wrapper(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


EVENT_LOOP = _EventLoop()


def call(function: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """Call a sync or async function; an awaitable result is run on the backend's loop."""
    result = function(*args)
    if inspect.isawaitable(result):
        return EVENT_LOOP.run(result, timeout)
    return result


# -- importing model.py and finding the class -----------------------------------------------
_import_lock = threading.RLock()
_modules: dict[str, tuple[tuple[int, int], ModuleType]] = {}
_generation = itertools.count(1)


def _import_model_file(path: Path, model_name: str, version: int) -> ModuleType:
    key = str(path.resolve())
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _import_lock:
        cached = _modules.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        safe = re.sub(r"\W", "_", model_name)
        module_name = f"_fastoip_model_{safe}_v{version}_{next(_generation)}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"model '{model_name}': cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        folder = str(path.parent)
        sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            raise InvalidArgument(f"model '{model_name}': importing {path} failed: {_describe(exc)}") from exc
        finally:
            try:
                sys.path.remove(folder)
            except ValueError:
                pass
        _modules[key] = (stamp, module)
        return module


def _model_class(module: ModuleType, path: Path, config: mc.ModelConfig, model_name: str) -> type[Model]:
    implementation = parameter(config, "implementation")
    if implementation:
        module_part, _, class_part = implementation.rpartition(".")
        if module_part and module_part != path.stem:
            sys.path.insert(0, str(path.parent))
            try:
                source = importlib.import_module(module_part)
            except Exception as exc:
                raise InvalidArgument(
                    f"model '{model_name}': implementation '{implementation}': cannot import "
                    f"'{module_part}': {_describe(exc)}"
                ) from exc
            finally:
                try:
                    sys.path.remove(str(path.parent))
                except ValueError:
                    pass
        else:
            source = module
        cls = getattr(source, class_part, None)
        if not (isinstance(cls, type) and issubclass(cls, Model)):
            raise InvalidArgument(
                f"model '{model_name}': implementation '{implementation}' is not a fastoip.Model subclass"
            )
        return cls
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Model) and value is not Model
        and value.__module__ == module.__name__
    ]
    # A base class defined next to its subclass is not a candidate: the most derived class wins.
    found = [c for c in found if not any(other is not c and issubclass(other, c) for other in found)]
    if len(found) == 1:
        return found[0]
    if not found:
        hint = ""
        if "TritonPythonModel" in vars(module):
            hint = " (Triton's TritonPythonModel is not supported: subclass fastoip.Model instead)"
        raise InvalidArgument(f"model '{model_name}': {path} defines no fastoip.Model subclass{hint}")
    names = ", ".join(sorted(c.__name__ for c in found))
    raise InvalidArgument(
        f"model '{model_name}': {path} defines several fastoip.Model subclasses ({names}); "
        'say which with parameters { key: "implementation" value { string_value: "ClassName" } }'
    )


# -- deployment hooks: once per server ---------------------------------------------------------
_deploy_lock = threading.Lock()
#: (file, class) -> None once the hooks ran, or the failure message not reported by a load yet.
_deployments: dict[tuple[str, str], str | None] = {}


def _deployment_key(cls: type, path: Path) -> tuple[str, str]:
    source = str(path.resolve()) if cls.__module__.startswith("_fastoip_model_") else cls.__module__
    return source, cls.__qualname__


def _run_deployment_hooks(cls: type, path: Path, model_name: str, *, from_load: bool) -> None:
    key = _deployment_key(cls, path)
    with _deploy_lock:
        if key in _deployments:
            failure = _deployments[key]
            if failure is None:
                return
            if from_load:
                # Report the failure the pre-load pass saw once; a later load tries again.
                del _deployments[key]
                raise InvalidArgument(failure)
            return
        try:
            for name in hook_names(cls, DEPLOYMENT):
                log.info("model '%s': on_deployment hook %s", model_name, name)
                call(getattr(cls, name))
        except Exception as exc:
            message = f"model '{model_name}': on_deployment hook failed: {_describe(exc)}"
            if from_load:
                raise InvalidArgument(message) from exc
            _deployments[key] = message
            raise InvalidArgument(message) from exc
        _deployments[key] = None


# -- the backend kind -------------------------------------------------------------------------------
def _declared(entries: Sequence[Any], batch: bool, model_name: str, kind: str) -> list[DiscoveredTensor]:
    out = []
    for entry in entries:
        if entry.data_type == mc.TYPE_INVALID:
            raise InvalidArgument(f"model '{model_name}': {kind} '{entry.name}' needs a data_type")
        dims = tuple(None if d < 0 else int(d) for d in entry.dims)
        out.append(DiscoveredTensor(entry.name, CONFIG_TO_V2[mc.DataType.Name(entry.data_type)],
                                    ((None,) if batch else ()) + dims))
    return out


def _truthy(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    return None


class PythonKind:
    """The ``python`` backend kind: ``model.py`` holding a ``fastoip.Model`` subclass."""

    name = "python"
    platforms: tuple[str, ...] = ()
    default_filename = "model.py"

    def prepare(self, model_name: str, paths: Sequence[Path], base: mc.ModelConfig, options: Any) -> None:
        """Before any model loads: import model.py and run its ``@on_deployment`` hooks."""
        for path in paths:
            version = int(path.parent.name) if path.parent.name.isdigit() else 0
            module = _import_model_file(path, model_name, version)
            cls = _model_class(module, path, base, model_name)
            _run_deployment_hooks(cls, path, model_name, from_load=False)

    def load(
        self, model_name: str, version: int, path: Path, base: mc.ModelConfig, options: Any
    ) -> tuple[mc.ModelConfig, list[PythonInstance]]:
        module = _import_model_file(path, model_name, version)
        cls = _model_class(module, path, base, model_name)
        _run_deployment_hooks(cls, path, model_name, from_load=True)

        if not base.input and not base.output:
            raise InvalidArgument(
                f"model '{model_name}': a Python model declares its inputs and outputs "
                f"in config.pbtxt or {MODEL_SETTINGS}"
            )
        batch = base.max_batch_size > 0
        config = complete_config(
            base,
            model_name,
            _declared(base.input, batch, model_name, "input"),
            _declared(base.output, batch, model_name, "output"),
            options.default_max_batch_size,
            platform="",
        )
        if not config.backend:
            config.backend = "python"
        spec = model_spec(config)
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        defaults = ModelContentTypes.from_parameters(
            parameters, [t.name for t in spec.inputs], [t.name for t in spec.outputs]
        )
        defaults.check(model_name)
        extra: dict = {}
        if parameters.get("extra"):
            try:
                extra = json.loads(parameters["extra"])
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"model '{model_name}': parameter 'extra' is not JSON: {exc}") from None

        said = _truthy(parameters.get("batchable", ""))
        marked = is_batchable(getattr(cls, "predict", None))
        batchable = config.max_batch_size > 0 and (
            said if said is not None else marked if marked is not None else config.HasField("dynamic_batching")
        )
        try:
            concurrency = max(1, int(parameters.get("max_concurrency") or 1))
        except ValueError:
            raise InvalidArgument(f"model '{model_name}': parameter 'max_concurrency' must be an integer") from None

        count = sum(group.count for group in config.instance_group) or 1
        hosts: list[_Host] = []
        try:
            for index in range(count):
                host = _Host(cls, model_name, version, path.parent, config, spec, parameters, extra, index,
                             defaults, batchable)
                hosts.append(host)
                host.start()
        except BaseException:
            for host in reversed(hosts):
                host.stop(drain=False)
            raise
        log.info(
            "model '%s' version %d: %s x%d%s", model_name, version, cls.__qualname__, count,
            " (batchable)" if batchable else "",
        )
        return config, [PythonInstance(host) for host in hosts for _ in range(concurrency)]


KIND = PythonKind()


# -- one model object and the lanes the schedulers use ---------------------------------------------
class _Host:
    """One instance of the user's class: lifecycle, health, in-flight tracking."""

    def __init__(
        self,
        cls: type[Model],
        name: str,
        version: int,
        folder: Path,
        config: mc.ModelConfig,
        spec: Any,
        parameters: dict[str, str],
        extra: dict,
        index: int,
        defaults: ModelContentTypes,
        batchable: bool,
    ) -> None:
        self.name = name
        self.version_str = str(version)
        self.spec = spec
        self.defaults = defaults
        self.batchable = batchable
        self.lanes = 0
        self._state = threading.Condition()
        self._in_flight = 0
        self._started = False
        self._stopped = False
        # Built in two steps: the attributes below exist before the user's __init__ runs.
        model: Any = cls.__new__(cls)
        model.name = name
        model.version = version
        model.path = folder
        model.config = config
        model.parameters = dict(parameters)
        model.extra = extra
        model.instance = index
        self.model = model
        try:
            model.__init__()
        except Exception as exc:
            raise InvalidArgument(f"model '{name}': {cls.__qualname__}() failed: {_describe(exc)}") from exc
        self._wants_parameters = _takes_parameters(model.predict)

    def start(self) -> None:
        model = self.model
        try:
            call(model.load)
        except Exception as exc:
            raise InvalidArgument(f"model '{self.name}': load() failed: {_describe(exc)}") from exc
        self._started = True
        for hook in hook_names(type(model), STARTUP):
            try:
                call(getattr(model, hook))
            except Exception as exc:
                raise InvalidArgument(
                    f"model '{self.name}': on_startup hook {hook} failed: {_describe(exc)}"
                ) from exc

    def stop(self, drain: bool = True) -> None:
        """Wait for requests in flight, then the shutdown hooks (reverse order) and ``unload()``."""
        with self._state:
            if self._stopped:
                return
            self._stopped = True
            if drain and not self._state.wait_for(lambda: self._in_flight == 0, DRAIN_TIMEOUT_S):
                log.warning("model '%s': %d requests still running at unload", self.name, self._in_flight)
        if not self._started:
            return
        model = self.model
        for hook in hook_names(type(model), SHUTDOWN):
            try:
                call(getattr(model, hook))
            except Exception:
                log.exception("model '%s': on_shutdown hook %s failed", self.name, hook)
        unload = getattr(model, "unload", None)
        if callable(unload):
            try:
                call(unload)
            except Exception:
                log.exception("model '%s': unload() failed", self.name)

    # -- health -------------------------------------------------------------------------
    def healthy(self, method: str) -> bool:
        if self._stopped:
            return False
        try:
            return bool(call(getattr(self.model, method), timeout=HEALTH_TIMEOUT_S))
        except Exception as exc:
            log.warning("model '%s': %s() failed: %s", self.name, method, _describe(exc))
            return False

    # -- requests ------------------------------------------------------------------------------
    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        """Run ``jobs``: per job an InferResponse or its error, and per predict call
        ``(batch_size, job_count, decode_ns, predict_ns, encode_ns)`` for the statistics."""
        with self._state:
            if self._stopped:
                error = Unavailable(f"model '{self.name}' is unloaded")
                return [error for _ in jobs], []
            self._in_flight += 1
        try:
            return self._execute(jobs)
        finally:
            with self._state:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._state.notify_all()

    def _execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        results: Results = [InternalError("not run") for _ in jobs]  # each replaced below
        executions: list[Execution] = []
        for indices in self._groups(jobs):
            group = [jobs[i] for i in indices]
            try:
                t0 = time.monotonic_ns()
                payload, parameters = self._decode(group)
                t1 = time.monotonic_ns()
                value = self._predict(payload, parameters)
                t2 = time.monotonic_ns()
                responses = self._encode(value, group)
                t3 = time.monotonic_ns()
                executions.append((sum(job.batch_size for job in group), len(group), t1 - t0, t2 - t1, t3 - t2))
                for index, response in zip(indices, responses, strict=True):
                    results[index] = response
            except InferenceError as exc:
                for index in indices:
                    results[index] = exc
            except Exception as exc:  # a bug in the backend itself: still answer every job
                log.exception("model '%s': request failed", self.name)
                error = InternalError(f"model '{self.name}': {_describe(exc)}")
                for index in indices:
                    results[index] = error
        return results, executions

    def _groups(self, jobs: Sequence[Job]) -> list[list[int]]:
        if not self.batchable or len(jobs) == 1:
            return [[i] for i in range(len(jobs))]
        groups: dict[tuple, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(_batch_key(job), []).append(index)
        return list(groups.values())

    def _decode(self, group: list[Job]) -> tuple[Any, dict]:
        request = group[0].request
        # Several requests: their rows in one array (new arrays, not pooled: the model may keep them).
        feeds = group[0].feeds if len(group) == 1 else merge_inputs(group)[0]
        tensors = []
        for tensor in request.inputs:
            data = feeds[tensor.name]
            tensors.append(Tensor(tensor.name, tensor.datatype, tuple(data.shape), data, tensor.parameters))
        content_type = request.parameters.get("content_type")
        payload = decode_request(tensors, content_type if isinstance(content_type, str) else None, self.defaults)
        return payload, dict(request.parameters)

    def _predict(self, payload: Any, parameters: dict) -> Any:
        predict = self.model.predict
        try:
            if self._wants_parameters:
                return call(predict, payload, parameters)
            return call(predict, payload)
        except InferenceError:
            raise
        except Exception as exc:
            log.exception("model '%s': predict failed", self.name)
            raise InternalError(f"model '{self.name}': predict failed: {_describe(exc)}") from None

    def _encode(self, value: Any, group: list[Job]) -> list[InferResponse]:
        first = group[0]
        spec = self.spec
        declared = [t.name for t in spec.outputs]
        response_parameters: dict[str, Any] = {}
        split = split_response(value)
        if split is not None:
            parts, content_type = split
            response_parameters["content_type"] = content_type
        elif isinstance(value, dict):
            parts = value
        elif isinstance(value, tuple):
            if len(value) != len(declared):
                raise InternalError(
                    f"model '{self.name}': predict returned {len(value)} values but the model has "
                    f"{len(declared)} outputs ({', '.join(declared)})"
                )
            parts = dict(zip(declared, value, strict=True))
        elif len(declared) == 1:
            parts = {declared[0]: value}
        elif not declared:
            parts = {"output-1": value}
        else:
            raise InternalError(
                f"model '{self.name}': predict returned one {type(value).__name__} but the model has outputs "
                f"{', '.join(declared)}: return a dict {{output name: value}}"
            )
        if declared:
            for name in parts:
                if name not in spec.output_by_name:
                    raise InternalError(
                        f"model '{self.name}': predict returned output '{name}', which the model does not "
                        f"declare (outputs: {', '.join(declared)})"
                    )
        wanted = first.output_names or list(parts)
        requested: dict[str, str] = {
            o.name: asked
            for o in first.request.outputs
            if isinstance(asked := o.parameters.get("content_type"), str) and asked
        }
        encoded = []
        for name in wanted:
            if name not in parts:
                raise InternalError(f"model '{self.name}': predict did not return output '{name}'")
            output_type = requested.get(name) or self.defaults.outputs.get(name)
            tensor = encode_output(name, parts[name], output_type, from_request=name in requested)
            datatype, data = self._conform(tensor, spec.output_by_name.get(name))
            encoded.append((name, datatype, data, tensor.parameters))

        if len(group) == 1:
            return [self._response(first, encoded, response_parameters)]
        total = sum(job.batch_size for job in group)
        for name, _, data, _ in encoded:
            check_rows(self.name, name, data, total)
        return [
            self._response(job, [(name, datatype, data[rows], params) for name, datatype, data, params in encoded],
                           response_parameters)
            for job, rows in zip(group, row_slices(group), strict=True)
        ]

    def _response(self, job: Job, outputs: list, parameters: dict) -> InferResponse:
        request = job.request
        return InferResponse(
            request.model_name,
            self.version_str,
            request.id,
            dict(parameters),
            [InferOutput(name, datatype, data.shape, data, dict(params)) for name, datatype, data, params in outputs],
        )

    def _conform(self, tensor: Tensor, spec: TensorSpec | None) -> tuple[str, np.ndarray]:
        """The output as the config declares it: datatype cast within its kind, rank fitted."""
        data, datatype = tensor.data, tensor.datatype
        if spec is not None:
            if datatype != spec.datatype:
                if "BYTES" in (datatype, spec.datatype):
                    raise InternalError(
                        f"model '{self.name}': output '{tensor.name}' is {datatype} data but the model "
                        f"declares {spec.datatype}"
                    )
                if spec.datatype == "BF16":
                    data = bf16_bits_from_float32(data.astype(np.float32))
                else:
                    target = NUMPY_DTYPES[spec.datatype]
                    if not np.can_cast(data.dtype, target, "same_kind"):
                        raise InternalError(
                            f"model '{self.name}': output '{tensor.name}' is {datatype} data, which does not "
                            f"cast to the declared {spec.datatype}"
                        )
                    data = data.astype(target)
                datatype = spec.datatype
            data = _fit_rank(data, spec.shape)
        if data.dtype != object:
            data = np.ascontiguousarray(data)
        return datatype, data


def _fit_rank(data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Add or drop one trailing dimension of 1 when that is all that separates ``data`` from ``shape``."""
    if data.ndim == len(shape):
        return data
    if data.ndim + 1 == len(shape) and shape[-1] in (1, -1):
        return data.reshape(data.shape + (1,))
    if data.ndim == len(shape) + 1 and data.shape[-1] == 1:
        return data.reshape(data.shape[:-1])
    return data


def _batch_key(job: Job) -> tuple:
    request = job.request
    return (
        tuple(sorted((k, v) for k, v in request.parameters.items() if k not in SCHEDULER_PARAMETERS)),
        tuple((t.name, t.parameters.get("content_type")) for t in request.inputs),
        tuple((o.name, o.parameters.get("content_type")) for o in request.outputs),
    )


def _takes_parameters(method: Callable[..., Any]) -> bool:
    """Whether ``predict`` accepts a second positional argument (the request parameters)."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    positional = 0
    for param in signature.parameters.values():
        if param.kind == param.VAR_POSITIONAL:
            return True
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PythonInstance:
    """What a scheduler holds: one lane into one model object."""

    # A Backend (scheduling/contract.py) of its own: its model reads whole requests (parameters, content types).

    def __init__(self, host: _Host) -> None:
        self.host = host
        host.lanes += 1

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        return self.host.execute(jobs)

    def is_ready(self) -> bool:
        return self.host.healthy("is_ready")

    def is_alive(self) -> bool:
        return self.host.healthy("is_alive")

    def close(self) -> None:
        host = self.host
        host.lanes -= 1
        if host.lanes <= 0:
            host.stop()

"""An MLServer runtime (``mlserver.MLModel`` subclass) where it runs, and the edge conversions both hostings share.

Rules:
- :class:`MLServerRunner` is one runtime object in a worker process (the ``load_mlserver`` message of
  :mod:`.worker`): it imports the runtime's module, builds MLServer's ``ModelSettings`` from the model's
  model-settings.json document, awaits ``load()`` and ``unload()`` and serves ``execute`` with the worker's
  plain data, as :class:`.runner.TritonRunner` does for Triton's models.  The runtime's coroutines run on an
  event loop of its own, driven by the worker's main thread (``run_until_complete``): one request at a time,
  no hop to another thread.
- A request crosses as :data:`.runner.RequestData` whose slots carry MLServer's view of it: ``parameters``
  is ``{"parameters": request parameters, "inputs": {name: (shape, parameters)}, "text": [names of the BYTES
  inputs that came as JSON strings]}``, ``inputs`` the flat
  tensors (numeric: through shared memory; BYTES: its elements), ``requested`` ``[(name, parameters)]``.
  A response crosses as :data:`.runner.ResponseData` whose ``parameters`` is ``{"parameters": ...,
  "outputs": {name: parameters}}`` (the output's own parameters, e.g. ``content_type``, kept).
- Each request of a batch runs its own ``predict`` (no merge in a worker: the dynamic batcher's jobs run one
  after another); an exception fails its own request with INTERNAL naming the model, as in-process hosting
  fails it; a runtime that only streams (``predict_stream``) emits each response as it comes.
- ``mlserver.register`` / ``mlserver.log`` write to prometheus_client's multiprocess files in the directory the
  server names (``PROMETHEUS_MULTIPROC_DIR``, set before mlserver is imported, as MLServer's own workers do);
  the server exports that directory on ``/metrics``.
- :func:`inference_request` and :func:`output_array` are the edge conversions, used on both sides of the
  process boundary (in-process hosting calls them from ``backends.python.mlserver.runtime``).

Standard library and numpy at import; mlserver only when a runtime loads.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import numpy as np

from .runner import Emit, RequestData, ResponseData
from .source_import import import_source
from .utils import TRITON_STRING_TO_NUMPY, TritonError

#: prometheus_client's multiprocess directory variable (read when prometheus_client is first imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: V2 datatype -> numpy dtype for a runtime's numeric outputs (Triton's table, without its ``TYPE_`` prefix).
V2_DTYPES: dict[str, Any] = {
    name[len("TYPE_"):]: np.dtype(dtype) for name, dtype in TRITON_STRING_TO_NUMPY.items() if name != "TYPE_STRING"
}
_DONE = object()


def stream_predictions(
    runtime: Any, payload: Any, run: Callable[[Awaitable[Any]], Any], enter: Callable[[], None]
) -> Iterator[Any]:
    """Each response of ``runtime.predict_stream`` for the one request ``payload``, as it comes: every step is
    run to completion by ``run`` in a fresh task context that ``enter`` prepares (MLServer's context variables);
    the stream is closed however the caller stops."""

    async def requests() -> AsyncIterator[Any]:
        yield payload

    produced = runtime.predict_stream(requests())

    async def step() -> Any:
        enter()
        try:
            return await produced.__anext__()
        except StopAsyncIteration:
            return _DONE

    try:
        while (value := run(step())) is not _DONE:
            yield value
    finally:
        run(produced.aclose())


def runtime_settings(document: dict[str, Any], name: str, cls: type, source: str) -> Any:
    """MLServer's ``ModelSettings`` for runtime ``cls`` from its model-settings.json ``document`` found at
    ``source``, with the defaults MLServer's loader fills (``mlserver/repository/load.py``): the model's name,
    and ``parameters.uri`` the file's own folder when it names none; ``_source`` is the file, so that a relative
    ``uri`` resolves beside it."""
    from mlserver.settings import ModelParameters, ModelSettings

    document = dict(document)
    document["name"] = name
    document["implementation"] = cls
    settings = ModelSettings(**document)
    if settings.parameters is None:
        settings.parameters = ModelParameters()
    if not settings.parameters.uri:
        settings.parameters.uri = os.path.dirname(os.path.abspath(source))
    settings._source = source
    return settings


class OutputError(Exception):
    """A runtime's output that fastoip cannot send (its message names the model and the output)."""


def inference_request(
    types: Any,
    request_id: str | None,
    parameters: dict[str, Any],
    inputs: list[tuple[str, str, list[int], Any, dict[str, Any]]],
    outputs: list[tuple[str, dict[str, Any]]],
) -> Any:
    """MLServer's ``InferenceRequest``, built as MLServer's gRPC converters build it (``model_construct``: no
    validation, the datatype as its string).  ``inputs``: ``(name, datatype, shape, values, parameters)``,
    values a flat list (:func:`tensor_values`)."""

    def params(values: dict[str, Any]) -> Any:
        return types.Parameters(**values) if values else None

    return types.InferenceRequest.model_construct(
        id=request_id or None,
        parameters=params(parameters),
        inputs=[
            types.RequestInput.model_construct(
                name=name,
                shape=shape,
                datatype=datatype,
                parameters=params(tensor_parameters),
                data=types.TensorData.model_construct(root=values),
            )
            for name, datatype, shape, values, tensor_parameters in inputs
        ],
        outputs=[types.RequestOutput.model_construct(name=name, parameters=params(p)) for name, p in outputs] or None,
    )


def give_request_id(request: Any) -> None:
    """A request without an ``id`` gets one (a UUID), as MLServer's data plane gives it; its response carries it."""
    if not request.id:
        request.id = str(uuid.uuid4())


def tensor_values(array: np.ndarray, as_text: bool = False) -> list[Any]:
    """A tensor's elements as ``RequestInput.data`` holds them in MLServer: a flat Python list, BYTES as ``bytes``
    (gRPC) or, ``as_text``, as ``str`` (REST: the JSON strings they came as), so a runtime may serialise
    ``request_input.dict()`` as MLServer's own examples do."""
    values = array.reshape(-1).tolist()
    if as_text and array.dtype == object:
        return [value.decode("utf-8", "surrogateescape") if type(value) is bytes else value for value in values]
    return values


def plain_parameters(parameters: Any) -> dict[str, Any]:
    """An mlserver ``Parameters`` as a dict without the unset (None) ones."""
    if parameters is None:
        return {}
    values = {**parameters.__dict__, **(parameters.__pydantic_extra__ or {})}
    return {key: item for key, item in values.items() if item is not None}


def output_array(model: str, output: Any, dtypes: dict[str, Any]) -> tuple[str, np.ndarray]:
    """An MLServer ``ResponseOutput`` as ``(datatype, array)`` for fastoip's encoders (OutputError if it cannot
    be sent).  BYTES: an object array of ``bytes``; MLServer lets a BYTES output's shape count characters
    (``[len(s)]`` for one string): then the array is flat, its elements as they are."""
    datatype = getattr(output.datatype, "value", output.datatype)
    shape = tuple(int(d) for d in output.shape)
    data = getattr(output.data, "root", output.data)
    if datatype == "BYTES":
        elements = data.reshape(-1).tolist() if isinstance(data, np.ndarray) else list(data)
        flat = np.empty(len(elements), dtype=object)
        flat[:] = [e.encode() if isinstance(e, str) else bytes(e) for e in elements]
        return datatype, flat.reshape(shape) if flat.size == int(np.prod(shape)) else flat
    dtype = dtypes.get(datatype)
    if dtype is None:
        raise OutputError(
            f"model '{model}': output '{output.name}' has datatype '{datatype}', which fastoip does not know"
        )
    array = np.asarray(data, dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise OutputError(f"model '{model}': output '{output.name}' has shape {list(shape)} but {array.size} elements")
    return datatype, array.reshape(shape)


def import_runtime_class(module_name: str, module_file: str | None, folder: str, qualname: str) -> type:
    """The runtime class in this process: a module fastoip imported from a file (``_fastoip_model_*``) is
    imported from that file under the same name; any other the way MLServer imports it, with the
    settings' folder first on ``sys.path``."""
    module = sys.modules.get(module_name)
    if module is None:
        sys.path.insert(0, folder)
        try:
            if module_file is not None and module_name.startswith("_fastoip_model_"):
                module = import_source(module_file, module_name)
            else:
                module = importlib.import_module(module_name)
        finally:
            try:
                sys.path.remove(folder)
            except ValueError:
                pass
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type):
        raise TypeError(f"{module_name}.{qualname} is not a class")
    return found


class MLServerRunner:
    """One MLServer runtime object in a worker process (see the module docstring).

    ``spec``: ``name``, ``version`` (its version directory's number), ``module``, ``module_file``, ``folder``,
    ``qualname`` (where the class is), ``document`` (model-settings.json as a dict), ``source`` (its path, for
    relative ``parameters.uri``), ``metrics_dir`` (or None), ``streams_only``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec.get("metrics_dir"):
            os.environ[MULTIPROC_ENV] = spec["metrics_dir"]  # before prometheus_client is imported (by mlserver)
        from mlserver import types
        from mlserver.context import model_name_var, model_version_var

        self._types = types
        self._context = (model_name_var, model_version_var)
        self.name: str = spec["name"]
        self.decoupled = bool(spec.get("streams_only"))
        cls = import_runtime_class(spec["module"], spec.get("module_file"), spec["folder"], spec["qualname"])
        settings = runtime_settings(spec["document"], self.name, cls, spec["source"])
        self._loop = asyncio.new_event_loop()
        self.model: Any = None
        runtime = cls(settings)
        self._run(self._load(runtime))
        self.model = runtime

    def _run(self, awaitable: Awaitable[Any]) -> Any:
        return self._loop.run_until_complete(awaitable)

    def _enter(self, runtime: Any) -> None:
        """MLServer's context variables for ``mlserver.log`` (each call runs in a fresh task context)."""
        name_var, version_var = self._context
        name_var.set(runtime.settings.name)
        version_var.set(runtime.settings.version or "")

    async def _load(self, runtime: Any) -> None:
        self._enter(runtime)
        ready = await runtime.load()
        runtime.ready = True if ready is None else bool(ready)
        if not runtime.ready:
            raise RuntimeError(f"model '{self.name}': load() returned False")

    async def _predict(self, payload: Any) -> Any:
        self._enter(self.model)
        return await self.model.predict(payload)

    def payload(self, data: RequestData) -> Any:
        """The request's data as MLServer's ``InferenceRequest``."""
        request_id, _, _, described, inputs, requested, _ = data
        shapes = described["inputs"]
        text = described.get("text") or ()
        tensors = []
        for name, datatype, array in inputs:
            shape, parameters = shapes[name]
            tensors.append((name, datatype, shape, tensor_values(array, name in text), parameters))
        return inference_request(self._types, request_id, described["parameters"], tensors, requested)

    def response_data(self, value: Any) -> ResponseData:
        """The runtime's ``InferenceResponse`` as plain data (output parameters kept)."""
        if not isinstance(value, self._types.InferenceResponse):
            raise OutputError(
                f"model '{self.name}': predict returned {type(value).__name__}, not an mlserver InferenceResponse"
            )
        outputs = []
        output_parameters = {}
        for out in value.outputs:
            datatype, array = output_array(self.name, out, V2_DTYPES)
            outputs.append((out.name, datatype, array))
            output_parameters[out.name] = plain_parameters(out.parameters)
        return outputs, None, {"parameters": plain_parameters(value.parameters), "outputs": output_parameters}

    def _failed(self, exc: BaseException) -> ResponseData:
        message = str(exc) if isinstance(exc, OutputError) else (
            f"model '{self.name}': predict failed: {type(exc).__name__}: {exc}"
        )
        return [], (TritonError.INTERNAL, message), {}

    def execute(
        self, requests: list[RequestData], emit: Emit | None, cancelled: Callable[[int], bool] | None = None
    ) -> list[ResponseData] | None:
        if self.decoupled:
            for index, data in enumerate(requests):
                self._stream(index, data, emit)
            return None
        responses = []
        for data in requests:
            try:
                responses.append(self.response_data(self._run(self._predict(self.payload(data)))))
            except Exception as exc:  # the runtime's error fails its own request
                responses.append(self._failed(exc))
        return responses

    def _stream(self, index: int, data: RequestData, emit: Emit | None) -> None:
        assert emit is not None
        try:
            model = self.model
            for value in stream_predictions(model, self.payload(data), self._run, lambda: self._enter(model)):
                emit(index, self.response_data(value), False)
        except Exception as exc:
            emit(index, self._failed(exc), True)
            return
        emit(index, None, True)

    def finalize(self) -> None:
        async def unload() -> None:
            self._enter(self.model)
            await self.model.unload()
            self.model.ready = False

        try:
            self._run(unload())
        finally:
            self._loop.close()

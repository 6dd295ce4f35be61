"""MLServer runtimes (``mlserver.MLModel`` subclasses) hosted unchanged as fastoip Python models.

Rules:
- A Python model whose class (``implementation``, or the class model.py defines) derives from
  ``mlserver.MLModel`` is wrapped by :func:`adapter`: a ``fastoip.Model`` subclass that builds the runtime
  with MLServer's ``ModelSettings`` (from the model's model-settings.json: its ``name``, ``parameters``
  (``uri``, ``version``, ``extra``...), ``inputs``/``outputs``, with ``_source`` set so that relative
  ``parameters.uri`` resolve beside the file, as MLServer resolves them), awaits its ``load()`` (its
  result is the model's readiness), and calls ``predict(InferenceRequest) -> InferenceResponse``
  and ``unload()``.  The runtime's own ``decode_request``/``encode_response``/``self.settings`` work as
  in MLServer because the runtime is MLServer's own class; nothing is re-implemented.
- The wrapper lives in fastoip's Python-model hosting (``host.py``), so instances, async methods on the
  backend's event loop, health, draining and statistics are the same as for any Python model;
  ``parallel_workers`` is the instance count.  Each request runs alone (MLServer's adaptive batching
  merges requests inside MLServer; here ``max_batch_size`` gives the model a batch dimension only).
- Streaming: a runtime that overrides ``predict_stream`` and not ``predict`` is decoupled (each response
  it yields is sent as it comes, over gRPC ModelStreamInfer and HTTP generate_stream); one that overrides
  both serves ``predict`` (a streaming call gets its one response).
- Requests cross at the edge with the fewest copies: a numeric input reaches the runtime as a flat numpy
  view on the received bytes (MLServer's codecs make their one copy with ``np.array``), BYTES as a list of
  ``bytes`` (as MLServer's gRPC path gives them); outputs are read back with one ``np.asarray``.
- ``mlserver.register`` / ``mlserver.log`` work: the model name and version are set in MLServer's
  context variables around every call, and MLServer's metrics registry is exported on fastoip's
  ``/metrics`` (:func:`fastoip.metrics.add_registry`).
- Without mlserver installed, importing a runtime fails with the extra to install (:func:`missing_extra_hint`).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import metrics
from ...content_types import ModelContentTypes
from ...datatypes import NUMPY_DTYPES
from ...errors import InternalError
from ...model import Model
from ...model_config import MODEL_SETTINGS, MODEL_SETTINGS_PARAMETER, ModelSpec
from ...types import InferOutput, InferResponse
from .payloads import PayloadCodec

if TYPE_CHECKING:
    from ...scheduling.job import Job

#: What to install for MLServer runtimes.
EXTRA = "pip install 'fastoip[mlserver]'"

_lock = threading.Lock()
_adapters: dict[type, type[Model]] = {}
_registry_added = False


def missing_extra_hint(exc: BaseException) -> str:
    """A hint naming the extra to install when ``exc`` is mlserver missing, else ""."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "mlserver":
        return f" (MLServer runtimes need MLServer: {EXTRA})"
    return ""


def is_mlmodel(cls: type) -> bool:
    """Whether ``cls`` derives from ``mlserver.MLModel`` (False when mlserver was never imported)."""
    mlserver = sys.modules.get("mlserver")
    base = getattr(mlserver, "MLModel", None)
    return isinstance(base, type) and issubclass(cls, base)


def adapter(cls: type) -> type[Model]:
    """The ``fastoip.Model`` subclass that hosts MLServer runtime ``cls`` (one per class)."""
    with _lock:
        found = _adapters.get(cls)
        if found is not None:
            return found
        from mlserver import MLModel

        streams_only = (
            getattr(cls, "predict_stream", None) is not MLModel.predict_stream
            and getattr(cls, "predict", None) is MLModel.predict
        )
        base = MLServerStreamRuntime if streams_only else MLServerRuntime
        made = type(cls.__name__, (base,), {
            "runtime_class": cls,
            "streams_only": streams_only,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": f"MLServer runtime {cls.__module__}.{cls.__qualname__} hosted by fastoip.",
        })
        _adapters[cls] = made
        return made


def _export_metrics() -> None:
    global _registry_added
    with _lock:
        if _registry_added:
            return
        from mlserver.metrics import REGISTRY

        metrics.add_registry(REGISTRY)
        _registry_added = True


class MLServerRuntime(Model):
    """Hosts one instance of an MLServer runtime (``runtime_class``)."""

    runtime_class: type
    streams_only = False
    #: MLServer runtimes take whole requests: one request per predict call, through this codec.
    one_request_per_call = True
    runtime: Any

    @classmethod
    def payload_codec(cls, name: str, version_str: str, spec: ModelSpec, defaults: ModelContentTypes) -> PayloadCodec:
        return MLServerPayloads(name, version_str, spec, defaults)

    def _settings(self) -> Any:
        from mlserver.settings import ModelSettings

        doc = json.loads(self.parameters.get(MODEL_SETTINGS_PARAMETER) or "{}")
        doc["name"] = self.name
        doc["implementation"] = self.runtime_class
        settings = ModelSettings(**doc)
        for folder in (self.path, self.path.parent):
            if (folder / MODEL_SETTINGS).is_file():
                settings._source = str(folder / MODEL_SETTINGS)
                break
        else:
            settings._source = str(Path(self.path) / MODEL_SETTINGS)
        return settings

    def _enter(self) -> None:
        """MLServer's context variables for ``mlserver.log`` (a fresh task context per call: no reset)."""
        from mlserver.context import model_name_var, model_version_var

        settings = self.runtime.settings
        model_name_var.set(settings.name)
        model_version_var.set(settings.version or "")

    async def load(self) -> None:
        _export_metrics()
        self.runtime = self.runtime_class(self._settings())
        self._enter()
        ready = await self.runtime.load()
        self.runtime.ready = True if ready is None else bool(ready)

    async def unload(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            self._enter()
            await runtime.unload()
            runtime.ready = False

    def is_ready(self) -> bool:
        runtime = getattr(self, "runtime", None)
        return bool(runtime is not None and runtime.ready)

    async def predict(self, inputs: Any, parameters: dict) -> Any:
        self._enter()
        return await self.runtime.predict(inputs)


class MLServerStreamRuntime(MLServerRuntime):
    """A runtime that only streams: ``predict_stream`` with the one request, each response sent as it comes."""

    async def predict(self, inputs: Any, parameters: dict) -> Any:  # an async generator
        async def requests() -> AsyncIterator[Any]:
            yield inputs

        produced = self.runtime.predict_stream(requests())
        try:
            while True:
                self._enter()  # each step runs in its own task context
                try:
                    response = await produced.__anext__()
                except StopAsyncIteration:
                    return
                yield response
        finally:
            await produced.aclose()


class MLServerPayloads(PayloadCodec):
    """fastoip requests <-> MLServer's ``InferenceRequest`` / ``InferenceResponse`` (pydantic models)."""

    def decode(self, group: list[Job]) -> tuple[Any, dict]:
        from mlserver.types import Datatype, InferenceRequest, Parameters, RequestInput, RequestOutput, TensorData

        job = group[0]  # one request per call (one_request_per_call)
        request = job.request
        inputs = []
        for tensor in request.inputs:
            data = job.feeds[tensor.name]
            if tensor.datatype == "BYTES":
                values: Any = data.reshape(-1).tolist()  # MLServer's gRPC path gives BYTES as a list of bytes
            else:
                values = data.reshape(-1)  # a view: MLServer's codecs copy once (np.array)
            inputs.append(RequestInput.model_construct(
                name=tensor.name,
                shape=list(tensor.shape),
                datatype=Datatype(tensor.datatype),
                parameters=Parameters(**tensor.parameters) if tensor.parameters else None,
                data=TensorData.model_construct(root=values),
            ))
        outputs = [
            RequestOutput.model_construct(name=o.name, parameters=Parameters(**o.parameters) if o.parameters else None)
            for o in request.outputs
        ]
        payload = InferenceRequest.model_construct(
            id=request.id or None,
            parameters=Parameters(**request.parameters) if request.parameters else None,
            inputs=inputs,
            outputs=outputs or None,
        )
        return payload, dict(request.parameters)

    def encode(self, value: Any, group: list[Job]) -> list[InferResponse]:
        from mlserver.types import InferenceResponse

        job = group[0]
        if not isinstance(value, InferenceResponse):
            raise InternalError(
                f"model '{self.name}': predict returned {type(value).__name__}, not an mlserver InferenceResponse"
            )
        wanted = {o.name for o in job.request.outputs}
        outputs = []
        for out in value.outputs:
            if wanted and out.name not in wanted:
                continue
            datatype = getattr(out.datatype, "value", out.datatype)
            shape = tuple(int(d) for d in out.shape)
            data = _array(self.name, out.name, datatype, getattr(out.data, "root", out.data), shape)
            if data.shape != shape:
                shape = data.shape  # MLServer's BYTES [len(s)] for one string: sent as the elements there are
            parameters = out.parameters.model_dump(exclude_none=True) if out.parameters else {}
            outputs.append(InferOutput(out.name, datatype, shape, data, parameters))
        parameters = value.parameters.model_dump(exclude_none=True) if value.parameters else {}
        return [InferResponse(job.request.model_name, self.version_str, job.request.id, parameters, outputs)]


def _array(model: str, name: str, datatype: str, data: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An MLServer output's data as the numpy array fastoip's encoders write."""
    if datatype == "BYTES":
        elements = data.reshape(-1).tolist() if isinstance(data, np.ndarray) else list(data)
        flat = np.empty(len(elements), dtype=object)
        flat[:] = [e.encode() if isinstance(e, str) else bytes(e) for e in elements]
        # MLServer lets a BYTES output's shape count characters ([len(s)] for one string): the elements win
        return flat.reshape(shape) if flat.size == int(np.prod(shape)) else flat
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise InternalError(f"model '{model}': output '{name}' has datatype '{datatype}', which fastoip does not know")
    array = np.asarray(data, dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise InternalError(
            f"model '{model}': output '{name}' has shape {list(shape)} but {array.size} elements"
        )
    return array.reshape(shape)

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
- The wrapper lives in fastoip's Python-model hosting (``host.py``), so instances, health, draining and
  statistics are the same as for any Python model; ``parallel_workers`` is the instance count.  The
  runtime's coroutines run on an event loop of the instance's own, driven by the thread that runs the
  instance (no hop to another thread per request), or on the backend's shared loop with model-settings
  ``parameters.fastoip_event_loop: "shared"`` (see :class:`MLServerRuntime`).
- This is the in-process hosting (the default); model-settings ``parameters.fastoip_hosting: "process"`` runs the
  runtime in worker processes instead (:mod:`.process`).  Both build MLServer's request and read its
  response with the same functions (:mod:`fastoip.pyworker.mlserver_runner`).
- Adaptive batching (MLServer's ``max_batch_size`` > 1 with ``max_batch_time`` > 0) is fastoip's dynamic
  batcher (``max_batch_size``, ``max_queue_delay`` = ``max_batch_time``): the jobs it gathers reach
  ``predict`` as one merged ``InferenceRequest`` and its response is split back per job, as MLServer's
  ``BatchedRequests`` merges and splits (:class:`MLServerPayloads`).  Unlike MLServer, the batch bound counts
  rows (Triton's meaning; the same with one row per request), and only requests whose request-level
  parameters agree are merged.
- Streaming: a runtime that overrides ``predict_stream`` and not ``predict`` is decoupled (each response
  it yields is sent as it comes, over gRPC ModelStreamInfer and HTTP generate_stream); one that overrides
  both serves ``predict`` (a streaming call gets its one response).
- A request's tensors reach the runtime as MLServer gives them: ``data`` a flat Python list (BYTES as
  ``str`` when they came as JSON strings over REST, else ``bytes``, as MLServer), so runtimes that serialise
  ``request_input.dict()`` work unchanged; outputs are read back with one ``np.asarray``.
- ``mlserver.register`` / ``mlserver.log`` work: the model name and version are set in MLServer's
  context variables around every call, and MLServer's metrics registry is exported on fastoip's
  ``/metrics`` (:func:`fastoip.metrics.add_registry`).
- Without mlserver installed, importing a runtime fails with the extra to install (:func:`missing_extra_hint`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .... import metrics
from ....content_types import ModelContentTypes
from ....datatypes import NUMPY_DTYPES
from ....errors import InternalError, InvalidArgument
from ....model import Model
from ....model_config import MODEL_SETTINGS, MODEL_SETTINGS_PARAMETER, ModelSpec
from ....pyworker.loop import EVENT_LOOP
from ....pyworker.mlserver_runner import (
    OutputError,
    give_request_id,
    inference_request,
    output_array,
    plain_parameters,
    runtime_settings,
    stream_predictions,
    tensor_values,
)
from ....scheduling.execute import check_rows, merge_inputs, row_slices
from ....types import InferOutput, InferResponse, text_inputs
from ..native.payloads import PayloadCodec

if TYPE_CHECKING:
    from ....scheduling.job import Job

#: What to install for MLServer runtimes.
EXTRA = "pip install 'fastoip[mlserver]'"

#: model-settings.json ``parameters`` key: "own" (default) or "shared" event loop (see MLServerRuntime).
LOOP_PARAMETER = "fastoip_event_loop"

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
    """Hosts one instance of an MLServer runtime (``runtime_class``).

    Event loop: by default each instance owns an asyncio loop that the thread running the instance drives
    (``run_until_complete``; an instance runs one call at a time), so a request costs no hop to another
    thread; model-settings ``parameters.fastoip_event_loop: "shared"`` runs the runtime on the Python
    backend's one shared loop instead (tasks a runtime starts in the background then keep running between
    requests; with an own loop they progress only while the runtime is called).
    """

    runtime_class: type
    streams_only = False
    #: Jobs reach predict merged only with adaptive batching (model-settings max_batch_size/max_batch_time).
    one_request_per_call = False
    runtime: Any

    @classmethod
    def payload_codec(cls, name: str, version_str: str, spec: ModelSpec, defaults: ModelContentTypes) -> PayloadCodec:
        return MLServerPayloads(name, version_str, spec, defaults)

    def _document(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.parameters.get(MODEL_SETTINGS_PARAMETER) or "{}")
        return doc

    def _settings(self) -> Any:
        for folder in (self.path, self.path.parent):
            if (folder / MODEL_SETTINGS).is_file():
                source = str(folder / MODEL_SETTINGS)
                break
        else:
            source = str(Path(self.path) / MODEL_SETTINGS)
        return runtime_settings(self._document(), self.name, self.runtime_class, source)

    def _enter(self) -> None:
        """MLServer's context variables for ``mlserver.log`` (a fresh task context per call: no reset)."""
        from mlserver.context import model_name_var, model_version_var

        settings = self.runtime.settings
        model_name_var.set(settings.name)
        model_version_var.set(settings.version or "")

    def _run(self, awaitable: Awaitable[Any]) -> Any:
        """``awaitable`` on this instance's loop (own: on the calling thread; shared: on the backend's loop)."""
        loop = self._own_loop
        if loop is None:
            return EVENT_LOOP.run(awaitable)
        with self._loop_lock:  # the scheduler gives an instance to one thread at a time; this makes sure
            return loop.run_until_complete(awaitable)

    _own_loop: asyncio.AbstractEventLoop | None = None
    _loop_lock = threading.Lock()

    def load(self) -> None:
        _export_metrics()
        parameters = self._document().get("parameters") or {}
        mode = parameters.get(LOOP_PARAMETER, "own")
        if mode not in ("own", "shared"):
            raise InvalidArgument(
                f"model '{self.name}': parameters.{LOOP_PARAMETER} must be \"own\" or \"shared\", got {mode!r}"
            )
        if mode == "own":
            self._own_loop = asyncio.new_event_loop()
            self._loop_lock = threading.Lock()
        try:
            self.runtime = self.runtime_class(self._settings())
            self._run(self._load())
        except BaseException:
            if self._own_loop is not None:
                self._own_loop.close()
            raise

    async def _load(self) -> None:
        self._enter()
        ready = await self.runtime.load()
        self.runtime.ready = True if ready is None else bool(ready)

    def unload(self) -> None:
        runtime = getattr(self, "runtime", None)
        try:
            if runtime is not None:
                self._run(self._unload(runtime))
        finally:
            if self._own_loop is not None:
                self._own_loop.close()

    async def _unload(self, runtime: Any) -> None:
        self._enter()
        await runtime.unload()
        runtime.ready = False

    def is_ready(self) -> bool:
        runtime = getattr(self, "runtime", None)
        return bool(runtime is not None and runtime.ready)

    def predict(self, inputs: Any, parameters: dict) -> Any:
        return self._run(self._predict(inputs))

    async def _predict(self, inputs: Any) -> Any:
        self._enter()
        return await self.runtime.predict(inputs)


class MLServerStreamRuntime(MLServerRuntime):
    """A runtime that only streams: ``predict_stream`` with the one request, each response sent as it comes."""

    one_request_per_call = True

    def predict(self, inputs: Any, parameters: dict) -> Any:  # a generator: each response as it comes
        yield from stream_predictions(self.runtime, inputs, self._run, self._enter)


class MLServerPayloads(PayloadCodec):
    """fastoip requests <-> MLServer's ``InferenceRequest`` / ``InferenceResponse`` (pydantic models).

    Built as MLServer's own gRPC converters build them (``model_construct``: no validation, the datatype as
    its string); several jobs (adaptive batching) become one request as MLServer merges them: inputs
    concatenated along the first axis, input parameters that several requests carry listed per request,
    requested outputs united; the response is split back by each job's rows.
    """

    def __init__(self, name: str, version_str: str, spec: ModelSpec, defaults: ModelContentTypes) -> None:
        super().__init__(name, version_str, spec, defaults)
        from mlserver import types

        self._types = types

    def decode(self, group: list[Job]) -> tuple[Any, dict]:
        job = group[0]
        request = job.request
        for member in group:
            give_request_id(member.request)  # MLServer's data plane names every request
        feeds = job.feeds if len(group) == 1 else merge_inputs(group)[0]
        # BYTES that came as JSON strings reach the runtime as str, as MLServer gives them over REST
        text = text_inputs(request)
        for member in group[1:]:
            text = text & text_inputs(member.request)
        inputs: list[tuple[str, str, list[int], Any, dict[str, Any]]] = []
        for tensor in request.inputs:
            data = feeds[tensor.name]
            values = tensor_values(data, tensor.name in text)
            if len(group) == 1:
                shape, parameters = list(tensor.shape), tensor.parameters
            else:
                shape = [int(data.shape[0]), *tensor.shape[1:]]
                parameters = _merged_input_parameters([_input(j, tensor.name) for j in group])
            inputs.append((tensor.name, tensor.datatype, shape, values, parameters))
        wanted: dict[str, dict[str, Any]] = {}
        for member in group:
            for output in member.request.outputs:
                wanted[output.name] = {**wanted.get(output.name, {}), **output.parameters}
        payload = inference_request(
            self._types,
            request.id if len(group) == 1 else None,  # a merged request has no id of its own
            request.parameters,  # jobs batch together only when these agree
            inputs,
            list(wanted.items()),
        )
        return payload, dict(request.parameters)

    def encode(self, value: Any, group: list[Job]) -> list[InferResponse]:
        if not isinstance(value, self._types.InferenceResponse):
            raise InternalError(
                f"model '{self.name}': predict returned {type(value).__name__}, not an mlserver InferenceResponse"
            )
        parameters = _plain(value.parameters)
        if len(group) == 1:
            job = group[0]
            wanted = {o.name for o in job.request.outputs}
            outputs = []
            for out in value.outputs:
                if wanted and out.name not in wanted:
                    continue
                datatype, data = _array(self.name, out)
                outputs.append(InferOutput(out.name, datatype, data.shape, data, _plain(out.parameters)))
            return [InferResponse(job.request.model_name, self.version_str, job.request.id, parameters, outputs)]
        return self._split(value, group, parameters)

    def _split(self, value: Any, group: list[Job], parameters: dict[str, Any]) -> list[InferResponse]:
        """A merged request's response, each job's rows of every output (MLServer's split)."""
        rows = row_slices(group)
        total = sum(job.batch_size for job in group)
        per_job: list[list[InferOutput]] = [[] for _ in group]
        for out in value.outputs:
            datatype, data = _array(self.name, out)
            check_rows(self.name, out.name, data, total)
            out_parameters = _plain(out.parameters)
            for index, (job, part) in enumerate(zip(group, rows, strict=True)):
                wanted = {o.name for o in job.request.outputs}
                if wanted and out.name not in wanted:
                    continue
                mine = {
                    key: (str(item[part.start]) if isinstance(item, list) and len(item) == total else item)
                    for key, item in out_parameters.items()
                }
                per_job[index].append(InferOutput(out.name, datatype, data[part].shape, data[part], mine))
        return [
            InferResponse(job.request.model_name, self.version_str, job.request.id, parameters, outputs)
            for job, outputs in zip(group, per_job, strict=True)
        ]


def _input(job: Job, name: str) -> Any:
    return next((tensor for tensor in job.request.inputs if tensor.name == name), None)


_plain = plain_parameters


def _merged_input_parameters(tensors: list[Any]) -> dict[str, Any]:
    """One input's parameters over merged requests: a key several requests give becomes the list of their
    values (``content_type`` and ``headers`` keep one value), as MLServer merges them."""
    merged: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for tensor in tensors:
        for key, item in (tensor.parameters if tensor is not None else {}).items():
            counts[key] = counts.get(key, 0) + 1
            if key in ("content_type", "headers") or counts[key] == 1:
                merged[key] = item
            elif counts[key] == 2:
                merged[key] = [merged[key], item]
            else:
                merged[key].append(item)
    return merged


def _array(model: str, output: Any) -> tuple[str, np.ndarray]:
    """An MLServer output as ``(datatype, array)`` for fastoip's encoders (INTERNAL when it cannot be sent)."""
    try:
        return output_array(model, output, NUMPY_DTYPES)
    except OutputError as exc:
        raise InternalError(str(exc)) from None

"""A ``TritonPythonModel`` where it runs (its worker process, or the server for in-process hosting).

Rules:
- Plain data in and out, so the same code runs on both sides of a process
  boundary: a request is :data:`RequestData`, a response :data:`ResponseData`.
- ``execute`` gets the whole batch as a list (Triton's semantics) and must
  return one response per request; a decoupled model returns None and answers
  through each request's sender, from ``execute`` or from its own threads
  (``emit(index, response, final)`` is called for each ``send``).  A
  non-decoupled model's request may answer through its sender too (its one
  response, emitted at once): execute returns None for it (or None for all).
- An exception from ``execute`` fails every request of the call with it.
- ``async def execute`` of a decoupled model runs in the background on the
  backend's event loop (pb_stub.cc's ``RunCoroutine(in_background)``): the call
  returns at once, so the next batch can start while this one awaits; an
  exception it raises is logged with its traceback, as the stub logs it.  A
  non-decoupled model's coroutine is run to its end, as Triton runs it.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import utils as pb
from .channel import RequestData
from .loop import EVENT_LOOP, call
from .source_import import import_source

#: (outputs [(name, datatype, array)], error (code, message) or None, parameters)
ResponseData = tuple[list, "tuple[int, str] | None", dict]
#: Where a decoupled response goes: ``emit(request index, response or None, final)``.
Emit = Callable[[int, "ResponseData | None", bool], None]

UTILS_MODULE = "triton_python_backend_utils"
_generation = itertools.count(1)


def register_utils() -> None:
    """Make ``import triton_python_backend_utils`` give this server's implementation."""
    sys.modules.setdefault(UTILS_MODULE, pb)


def defines_triton_model(module: Any) -> bool:
    return isinstance(getattr(module, "TritonPythonModel", None), type)


def response_data(response: Any) -> ResponseData:
    """A model's ``InferenceResponse`` as plain data (checked: the model may return anything)."""
    if not isinstance(response, pb.InferenceResponse):
        raise pb.TritonModelException(
            f"execute() must return InferenceResponse objects, not {type(response).__name__}"
        )
    error = response.error()
    outputs = []
    for tensor in response.output_tensors():
        if not isinstance(tensor, pb.Tensor):
            raise pb.TritonModelException(f"an output tensor is a {type(tensor).__name__}, not a pb_utils.Tensor")
        outputs.append((tensor.name(), tensor._datatype, tensor.as_numpy()))
    err = None
    if error is not None:
        err = (int(error.code()), str(error.message()))
    return outputs, err, dict(response._parameters)


def response_of(data: ResponseData) -> pb.InferenceResponse:
    """Plain data back into an ``InferenceResponse`` (BLS results)."""
    outputs, error, parameters = data
    tensors = [pb.Tensor._of(name, datatype, array) for name, datatype, array in outputs]
    err = pb.TritonError(error[1], error[0]) if error is not None else None
    response = pb.InferenceResponse(tensors, err)
    response._parameters = dict(parameters or {})  # (as the called model or server gave them: not a model's own)
    return response


def request_data(request: pb.InferenceRequest) -> RequestData:
    """A BLS request as plain data."""
    inputs = []
    for tensor in request.inputs():
        if not isinstance(tensor, pb.Tensor):
            raise pb.TritonModelException(f"a BLS input is a {type(tensor).__name__}, not a pb_utils.Tensor")
        inputs.append((tensor.name(), tensor._datatype, tensor.as_numpy()))
    return RequestData(
        request.request_id(),
        request.correlation_id(),
        request.flags(),
        dict(request._parameters),
        inputs,
        list(request.requested_output_names()),
        request._trace_data(),
    )


class TritonRunner:
    """One ``TritonPythonModel`` object and its lifecycle."""

    def __init__(self, module: Any, model_name: str, own_process: bool = False) -> None:
        self.model_name = model_name
        self.cls = module.TritonPythonModel
        self.model: Any = None
        self.decoupled = False
        self.instance_name = model_name
        #: The process hosts only this model: BLS is refused in initialize and finalize, as the stub refuses it.
        self.own_process = own_process
        #: The requests of the last ``execute`` the model released with RESCHEDULE (their indices).
        self.rescheduled: list[int] = []

    def auto_complete(self, config: dict) -> dict:
        method = getattr(self.cls, "auto_complete_config", None)
        if method is None:
            return config
        result = method(pb.ModelConfig(config))
        if not isinstance(result, pb.ModelConfig):
            raise pb.TritonModelException(  # python_backend's words
                f"auto_complete_config function in model '{self.model_name}' must return a valid pb.ModelConfig "
                "object."
            )
        return result.as_dict()

    def initialize(self, args: dict[str, str], decoupled: bool) -> None:
        self.decoupled = decoupled
        self.instance_name = str(args.get("model_instance_name") or self.model_name)  # the stub's name in its words
        if self.own_process:
            pb.BLS_PHASE.allowed = False
        self.model = self.cls()
        init = getattr(self.model, "initialize", None)
        if init is not None:
            call(init, args)
        pb.BLS_PHASE.allowed = True

    def execute(
        self, requests: list[RequestData], emit: Emit | None, cancelled: Callable[[int], bool] | None = None
    ) -> list[ResponseData | None] | None:
        self.rescheduled = []
        built = []
        tensor = pb.Tensor._of
        for index, (request_id, correlation_id, flags, parameters, inputs, requested, trace) in enumerate(requests):
            request = pb.InferenceRequest._received(
                [tensor(name, datatype, array) for name, datatype, array in inputs],
                requested,  # (fresh lists and dicts: decoded from the channel, or built by job_data in-process)
                correlation_id,
                request_id,
                flags,
                parameters,
                pb.InferenceTrace(trace),
            )
            if cancelled is not None:
                request._cancelled = functools.partial(cancelled, index)
            if emit is not None:
                request._sender = pb.InferenceResponseSender(
                    _emitter(emit, index), self.decoupled, request._cancelled
                )
            built.append(request)
        if self.decoupled:
            returned = self.model.execute(built)
            if inspect.isawaitable(returned):
                EVENT_LOOP.submit(returned, _log_background_failure)
                return None
            if returned is not None:  # python_backend's words
                raise pb.TritonModelException(
                    f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must "
                    "return None."
                )
            self.rescheduled = _rescheduled(built)
            return None
        responses = call(self.model.execute, built)
        self.rescheduled = _rescheduled(built)
        if responses is None:  # every request answers through its response sender
            return [None] * len(built)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(built):
            got = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            raise pb.TritonModelException(
                f"execute() returned {got} responses for {len(built)} requests: it must return one per request"
            )
        results: list[ResponseData | None] = []
        for request, response in zip(built, responses, strict=True):
            if response is None:
                results.append(None)  # answered through its response sender (now or later), or rescheduled
                continue
            if request._rescheduled():  # the stub's words (its spelling)
                raise pb.TritonModelException(
                    "Expected a None object in the execute function return list for reschduled request, found "
                    f"type '{type(response)}'."
                )
            data = response_data(response)
            if request._sender is not None:
                request._sender._returned()  # refused if its sender answered it already
            results.append(data)
        return results

    def user_readiness(self) -> tuple[bool, bool, str | None]:
        """The model's own ``is_ready()`` (python_backend newer than 2.51, pb_stub.cc's readiness request):
        ``(defined, ready, error)``.  No such method: ready.  A coroutine is run to its end; an answer that is
        not a bool, or an exception, is an error (not ready)."""
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return False, True, None
        try:
            answer = call(check)
            if not isinstance(answer, bool):
                raise pb.TritonModelException("is_ready() must return a boolean value")  # the stub's words
            return True, answer, None
        except BaseException as exc:
            return True, False, exc.message() if isinstance(exc, pb.TritonModelException) else \
                f"{type(exc).__name__}: {exc}"

    def finalize(self) -> None:
        if self.own_process:
            pb.BLS_PHASE.allowed = False
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            call(finalize)


def _rescheduled(requests: list[pb.InferenceRequest]) -> list[int]:
    """The indices of the requests the model released with RESCHEDULE."""
    return [index for index, request in enumerate(requests) if request._rescheduled()]


def _log_background_failure(exc: BaseException | None) -> None:
    if exc is not None:
        pb.Logger.log_error("".join(traceback.TracebackException.from_exception(exc).format()))


def _emitter(emit: Emit, index: int) -> Callable[[Any, bool], None]:
    lock = threading.Lock()

    def send(response: Any, final: bool) -> None:
        data = response_data(response) if response is not None else None
        with lock:
            emit(index, data, final)

    return send


def import_runner(path: Path, model_name: str, version: int, own_process: bool = False) -> TritonRunner:
    """Import model.py (``triton_python_backend_utils`` registered first) and wrap its model class.

    Each call imports the file afresh under a module name of its own, in a package of its folder, with its
    folder on ``sys.path`` while it imports (so model.py may import files beside it, absolutely or relatively).
    ``own_process``: the process hosts only this model, so its folders stay on ``sys.path`` as Triton's stub
    leaves them (``import model`` at execute time)."""
    register_utils()
    safe = re.sub(r"\W", "_", model_name)
    module_name = f"_fastoip_triton_{safe}_v{version}_{next(_generation)}"
    try:
        module = import_source(path, module_name, in_package=True, keep_on_path=own_process)
    except BaseException as exc:
        raise pb.TritonModelException(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    if not defines_triton_model(module):
        raise pb.TritonModelException(f"{path} defines no TritonPythonModel class")
    return TritonRunner(module, model_name, own_process)

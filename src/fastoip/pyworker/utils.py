"""``triton_python_backend_utils``: the module Triton's Python-backend models import (``as pb_utils``).

Registered under that name in ``sys.modules`` before a ``TritonPythonModel``'s
model.py is imported (in its worker process, or in the server for in-process
hosting).  Names and semantics follow Triton's python_backend; the objects are
plain Python (numpy arrays inside), and what reaches outside the model (BLS
calls, model control, logs, custom metrics) goes through :data:`BRIDGE`, which
the host sets: a channel back to the server from a worker process, or the Core
itself in-process.

Not built (refused with a clear message where they are reached): GPU tensors
(``is_cpu()`` is always True; ``preferred_memory`` is accepted and ignored),
``Tensor.from_dlpack`` of a CUDA capsule, BF16 tensors from numpy, ``trace``
objects (accepted, not propagated).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..metric_names import histogram_buckets_error, label_names_error, metric_name_error

# -- flags (Triton's TRITONSERVER_* values) ----------------------------------------------------------------
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

#: ``PreferredMemory`` kinds (host memory is what this server gives; the preference is accepted and ignored).
TRITONSERVER_MEMORY_GPU = 2
TRITONSERVER_MEMORY_CPU = 0


class PreferredMemory:
    """Where a BLS request would like its outputs (accepted; outputs are in host memory here)."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

#: Triton's TRITONSERVER_DataType numbers <-> numpy (``triton_to_numpy_type`` / ``numpy_to_triton_type``).
_TRITON_NUMBER_TO_NUMPY: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
#: V2 datatype name <-> Triton number.
V2_TO_NUMBER = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
    "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
NUMBER_TO_V2 = {number: name for name, number in V2_TO_NUMBER.items()}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type for a config data type (``"TYPE_FP32"`` -> ``np.float32``)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_NUMBER_TO_NUMPY.get(data_type)


#: numpy dtype -> Triton number (one look-up per output tensor a model builds, not a scan of the table).
_NUMPY_TO_TRITON_NUMBER: dict[np.dtype, int] = {
    np.dtype(np_type): number for number, np_type in _TRITON_NUMBER_TO_NUMPY.items() if number != 13
}


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = data_type if isinstance(data_type, np.dtype) else np.dtype(data_type)
    if dtype.kind in ("O", "S"):
        return 13
    return _NUMPY_TO_TRITON_NUMBER.get(dtype)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Length-prefixed (4-byte little-endian) elements in C order, as one uint8 array."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.uint8)
    parts = []
    for item in input_tensor.flat:
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(len(data).to_bytes(4, "little"))
        parts.append(data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of ``bytes``."""
    raw = bytes(encoded_tensor)
    items = []
    offset = 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        items.append(raw[offset : offset + size])
        offset += size
    return np.array(items, dtype=np.object_)


# -- errors ---------------------------------------------------------------------------------------------------
class TritonError:
    """An error a model returns in a response (``InferenceResponse(error=...)``) or a BLS response carries."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail (a BLS error when raised, bad arguments)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


# -- tensors ---------------------------------------------------------------------------------------------------
class Tensor:
    """A named tensor in host memory (numpy inside; BYTES as an object array of ``bytes``)."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        # (the argument types python_backend's binding refuses with TypeError, as its QA checks)
        if not isinstance(name, str):
            raise TypeError(f"Tensor(): name must be a str, not {type(name).__name__}")
        if numpy_array is None:
            raise TypeError("Tensor(): numpy_array must be an array, not None")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind in ("U", "V"):
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by the Python backend: use np.object_ instead"
            )
        if triton_dtype is not None:
            target = triton_to_numpy_type(triton_dtype)
            if target is None:
                raise TritonModelException(f"triton_dtype {triton_dtype} is not supported")
            if array.dtype != np.dtype(target):
                array = array.view(target)
            self._datatype = NUMBER_TO_V2[triton_dtype]
        else:
            self._datatype = v2_name(array)
        self._name = name
        self._array = array

    @classmethod
    def _of(cls, name: str, datatype: str, array: np.ndarray) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return V2_TO_NUMBER[self._datatype]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    def to_dlpack(self) -> Any:
        if self._array.dtype == object:
            raise TritonModelException("to_dlpack: BYTES tensors cannot be shared through DLPack")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        holder = dlpack_tensor
        device = getattr(holder, "__dlpack_device__", None)
        if device is not None and device()[0] != 1:  # kDLCPU
            raise TritonModelException(
                f"from_dlpack: tensor '{name}' is on a GPU; this server hosts Python models on the CPU only"
            )
        try:
            array = np.from_dlpack(holder)
        except Exception as exc:
            raise TritonModelException(f"from_dlpack: tensor '{name}': {exc}") from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, {list(self._array.shape)})"


def v2_name(array: np.ndarray) -> str:
    """The V2 datatype of a numpy array (object/bytes arrays are BYTES)."""
    number = numpy_to_triton_type(array.dtype)
    if number is None:
        raise TritonModelException(f"numpy dtype {array.dtype} is not supported by the Python backend")
    return NUMBER_TO_V2[number]


# -- the channel to the server ------------------------------------------------------------------------------
class Bridge(Protocol):
    """What model code reaches outside its own object through (set by the host)."""

    def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def infer_stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]: ...

    def model_ready(self, name: str, version: str) -> bool: ...

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def unload_model(self, name: str, unload_dependents: bool) -> None: ...

    def log(self, level: int, message: str) -> None: ...

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float: ...


class _NoBridge:
    def _refuse(self) -> Any:
        raise TritonModelException("this call needs the server (it is only available while a model is served)")

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        return self._refuse()

    def infer_stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        return self._refuse()

    def model_ready(self, name: str, version: str) -> bool:
        return self._refuse()

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._refuse()

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._refuse()

    def log(self, level: int, message: str) -> None:
        logging.getLogger("fastoip.python.model").log(level, message)

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        return self._refuse()


class _BridgeSlot:
    """Where the host puts its bridge: one per process (a worker serves one model), and, for models hosted in
    the server process, the running model's own on the thread that runs it (:meth:`using`)."""

    def __init__(self) -> None:
        self._default: Bridge = _NoBridge()
        self._local = threading.local()

    @property
    def current(self) -> Bridge:
        bridge = getattr(self._local, "bridge", None)
        return bridge if bridge is not None else self._default

    @current.setter
    def current(self, bridge: Bridge) -> None:
        self._default = bridge

    @contextlib.contextmanager
    def using(self, bridge: Bridge) -> Iterator[None]:
        """``bridge`` on this thread while the block runs."""
        previous = getattr(self._local, "bridge", None)
        self._local.bridge = bridge
        try:
            yield
        finally:
            self._local.bridge = previous


BRIDGE = _BridgeSlot()


class _BlsPhase:
    """Whether this worker's model may make BLS calls now: python_backend's stub refuses them until
    ``initialize`` returned and once ``finalize`` started.  Set by the runner of a worker that hosts one model;
    an in-process model shares the server's process with others and is not restricted."""

    def __init__(self) -> None:
        self.allowed = True


BLS_PHASE = _BlsPhase()


# -- requests and responses --------------------------------------------------------------------------------
#: An argument not given (python_backend's binding tells it from an explicit None, which it refuses).
_NOT_GIVEN: Any = object()


def checked_parameters(parameters: object) -> dict[str, Any]:
    """A model's request or response parameters, by python_backend's rules (``PyParametersToJSON``): a dict of str
    keys and bool, int or str values; anything else raises with Triton's words. (fastoip also takes the dict as a
    JSON string, as ``parameters()`` returns it.)"""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        parameters = json.loads(parameters) if parameters else {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


class InferenceResponse:
    """One response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Any = _NOT_GIVEN,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is _NOT_GIVEN:
            output_tensors = []
        elif output_tensors is None:
            raise TypeError("InferenceResponse(): output_tensors must be a list of Tensors, not None")
        if not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list.')
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"an output tensor is a {type(tensor).__name__}, not a pb_utils.Tensor")
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters: dict[str, Any] = checked_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class InferenceResponseSender:
    """A request's way to answer outside ``execute``'s return, with python_backend's rules (response_sender.cc).

    A decoupled model sends any number of responses, the last with the final flag.  A non-decoupled model sends
    one response (it answers the request at once, as Triton's does) and may then send the final flag; a second
    response, or the final flag before any response, is refused.  ``execute`` returning a response for a request
    counts as its one response (:meth:`_returned`)."""

    def __init__(self, emit: Any, decoupled: bool, cancelled: Any = None) -> None:
        self._emit = emit
        self._decoupled = decoupled
        self._cancelled = cancelled
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and final and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending "
                        "a response."
                    )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if response is None and not final:
                raise TritonModelException("Response must be set unless the flags include the final flag")
            if final:
                self._closed = True
            if response is not None:
                self._sent += 1
        if self._decoupled:
            self._emit(response, final)
        elif response is not None:
            self._emit(response, True)  # the one response answers the request; its final flag adds nothing

    def _returned(self) -> None:
        """``execute`` returned a response for this (non-decoupled) request: that is its one response."""
        with self._lock:
            if self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._sent = 1
            self._closed = True

    def _answered(self) -> bool:
        with self._lock:
            return self._sent > 0

    def is_cancelled(self) -> bool:
        """True once the client cancelled the request (asks the server: a model loop may poll it)."""
        check = self._cancelled
        return bool(check()) if check is not None else False


class ResponseIterator:
    """The responses of ``exec(decoupled=True)``, in order, until the final one."""

    def __init__(self, responses: Iterator[InferenceResponse], cancel: Any = None) -> None:
        self._responses = responses
        self._cancel = cancel

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def cancel(self) -> None:
        """Cancel the request in the server: the model it went to sees ``is_cancelled()``; the responses
        still on their way arrive, the last with a CANCELLED error."""
        if self._cancel is not None:
            self._cancel()


class InferenceTrace:
    """The trace of a request the model received (``request.trace()``): passed as a BLS request's ``trace``, the
    BLS request is traced as its child, as Triton's."""

    def __init__(self, data: Any = None) -> None:
        #: (trace id, W3C context dict) in the server, or None (not traced).
        self._data = data

    def get_context(self) -> str | None:
        """The trace's W3C context (OpenTelemetry mode) as JSON, or None."""
        if self._data is None or not self._data[1]:
            return None
        return json.dumps(self._data[1])


class InferenceRequest:
    """A request the model received (in ``execute``), or one it builds to call another model (BLS)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: Any = _NOT_GIVEN,
        requested_output_names: Any = _NOT_GIVEN,
        correlation_id: int | str = 0,
        request_id: str = "",
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # The argument types python_backend's binding refuses (TypeError; a non-Tensor input is its model error).
        if inputs is None or requested_output_names is None:
            raise TypeError("InferenceRequest(): inputs and requested_output_names must be lists, not None")
        inputs = [] if inputs is _NOT_GIVEN else inputs
        requested_output_names = [] if requested_output_names is _NOT_GIVEN else requested_output_names
        if not isinstance(model_name, (str, bytes)):
            raise TypeError(f"InferenceRequest(): model_name must be a str, not {type(model_name).__name__}")
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"a BLS input is a {type(tensor).__name__}, not a pb_utils.Tensor")
        for output_name in requested_output_names:
            if not isinstance(output_name, str):
                raise TypeError(f"InferenceRequest(): an output name is a {type(output_name).__name__}, not a str")
        for label, value, kinds in (("correlation_id", correlation_id, (int, str)), ("request_id", request_id, str),
                                    ("model_version", model_version, int), ("flags", flags, int)):
            if value is None or not isinstance(value, kinds):
                raise TypeError(f"InferenceRequest(): {label} must not be {type(value).__name__}")
        # Triton's binding takes bytes as well (models pass a BYTES input's element straight in).
        self.model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self.model_version = model_version
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._correlation_id = correlation_id
        self._request_id = request_id
        self._flags = flags
        self._timeout = timeout
        self._parameters: dict[str, Any] = checked_parameters(parameters)
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Any = None
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _received(
        cls, inputs: list[Tensor], requested: list[str], correlation_id: int | str, request_id: str, flags: int,
        parameters: dict[str, Any], trace: InferenceTrace,
    ) -> InferenceRequest:
        """A request as the host hands it to ``execute``: its parts are already checked and its own (no copies,
        no conversions; the same fields as ``__init__`` sets)."""
        request = cls.__new__(cls)
        request.model_name = ""
        request.model_version = -1
        request._inputs = inputs
        request._requested = requested
        request._correlation_id = correlation_id
        request._request_id = request_id
        request._flags = flags
        request._timeout = 0
        request._parameters = parameters
        request._sender = None
        request._cancelled = None
        request._trace = trace
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """True once the client cancelled the request (gone away, deadline passed)."""
        check = self._cancelled
        return bool(check()) if check is not None else False

    def trace(self) -> InferenceTrace:
        return self._trace

    def _trace_data(self) -> Any:
        return self._trace._data

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("get_response_sender() is only available to the requests a model receives")
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when ``execute`` returns: ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``
        sends it back to its scheduler to run again (a model with ``sequence_batching { iterative_sequence:
        true }``; elsewhere the request fails, saying why); ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the default)
        ends it."""
        if not isinstance(flags, int) or isinstance(flags, bool):
            raise TypeError(f"set_release_flags(): flags must be an int, not {type(flags).__name__}")
        self._release_flags = flags

    def _rescheduled(self) -> bool:
        return self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

    # -- BLS ----------------------------------------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` through the server; a response (errors inside it), or with
        ``decoupled=True`` an iterator of the responses a decoupled model sends."""
        if not BLS_PHASE.allowed:
            raise TritonModelException("BLS is only supported during the 'execute' function.")  # the stub's words
        if not self.model_name:
            raise TritonModelException("exec(): the request needs a model_name")
        if decoupled:
            responses = BRIDGE.current.infer_stream(self)
            return responses if isinstance(responses, ResponseIterator) else ResponseIterator(responses)
        return BRIDGE.current.infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` without blocking the model's event loop.  With ``decoupled=True`` the awaitable resolves
        at the first response (as Triton's does) and the iterator gives the rest as they come."""
        import asyncio

        loop = asyncio.get_running_loop()
        if decoupled:

            def start() -> tuple[ResponseIterator, list[InferenceResponse]]:
                responses = self.exec(decoupled=True)
                try:
                    return responses, [next(responses)]
                except StopIteration:
                    return responses, []

            responses, head = await loop.run_in_executor(None, start)
            return ResponseIterator(itertools.chain(head, responses), responses.cancel)
        return await loop.run_in_executor(None, self.exec)


# -- helpers ------------------------------------------------------------------------------------------------------
def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in model_config.get("input", []):
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in model_config.get("output", []):
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    """Whether the model's config says ``model_transaction_policy { decoupled: true }``."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return BRIDGE.current.model_ready(model_name, str(model_version))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    BRIDGE.current.load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    BRIDGE.current.unload_model(model_name, unload_dependents)


# -- logging --------------------------------------------------------------------------------------------------
class LogLevel:  # also Logger.LogLevel, as Triton nests it
    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


_LOG_LEVELS = (LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE)


class Logger:
    """Triton's model logger: lines go to the server's log."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        if not isinstance(message, str):
            raise TypeError(f"Logger.log(): message must be a str, not {type(message).__name__}")
        if type(level) is not int or level not in _LOG_LEVELS:
            raise TypeError(f"Logger.log(): level must be a pb_utils.LogLevel, not {level!r}")
        BRIDGE.current.log(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)


# -- custom metrics ---------------------------------------------------------------------------------------------
#: Triton's words for a metric whose family object is gone (python_backend's metric.cc).
FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object "
    "should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class Metric:
    """One labelled series of a :class:`MetricFamily` (kept and exported by the server). As Triton's, it lives
    only as long as its family object: once that is deleted, every operation raises (it holds no reference that
    would keep the family alive)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        self._cleared = False
        self._kind = family.kind
        problem = label_names_error(labels or {}, family.kind == MetricFamily.HISTOGRAM)
        if problem is not None:  # (the server checks again, and escapes what it writes)
            raise TritonModelException(f"metric family '{family.name}': {problem}")
        self._labels = {str(k): str(v) for k, v in (labels or {}).items()}
        spec = family._spec()
        if family.kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            problem = histogram_buckets_error(buckets)
            if problem is not None:
                raise TritonModelException(f"Failed to create metric. {problem}")
            spec["buckets"] = [float(b) for b in buckets]
        elif buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        self._spec = spec
        BRIDGE.current.metric(spec, self._labels, "create", 0.0)
        family._metrics.add(self)

    def _check(self, what: str) -> None:
        if self._cleared:
            raise TritonModelException(f"Failed to {what}: {FAMILY_DELETED}")

    def increment(self, value: float) -> None:
        self._check("increment metric value")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment() is not for histograms: use observe()")
        BRIDGE.current.metric(self._spec, self._labels, "increment", float(value))

    def set(self, value: float) -> None:
        self._check("set metric value")
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("set() is only for gauges")
        BRIDGE.current.metric(self._spec, self._labels, "set", float(value))

    def observe(self, value: float) -> None:
        self._check("observe metric value")
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe() is only for histograms")
        BRIDGE.current.metric(self._spec, self._labels, "observe", float(value))

    def value(self) -> float:
        self._check("get metric value")
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("value() is not for histograms (read them on /metrics)")
        return BRIDGE.current.metric(self._spec, self._labels, "value", 0.0)


class MetricFamily:
    """A custom metric family exported on ``/metrics`` beside the server's own. Made at once in the server (as
    Triton's): a second family of the same name shares the first one's series and description, and one of another
    kind is refused. Deleting the object ends its :class:`Metric` objects (Triton's lifetime rule)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"unknown metric kind {kind}")
        problem = metric_name_error(name)
        if problem is not None:
            raise TritonModelException(problem)
        self.name = name
        self.description = description
        self.kind = kind
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        BRIDGE.current.metric(self._spec(), {}, "family", 0.0)

    def __del__(self) -> None:
        for metric in list(getattr(self, "_metrics", ())):
            metric._cleared = True

    def _spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "kind": self.kind}

    def Metric(self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:  # noqa: N802
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        return Metric(self, labels or {}, buckets)


# -- auto-complete --------------------------------------------------------------------------------------------
class ModelConfig:
    """What ``auto_complete_config`` receives and returns: the model's config as a dict, with setters."""

    def __init__(self, model_config: dict | str) -> None:
        self._config: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config.get("max_batch_size", 0))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._config.get("max_batch_size", 0))
        if current and current != max_batch_size:
            raise TritonModelException(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._config.get('name', '')}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def _model(self) -> str:
        return str(self._config.get("name", ""))

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(  # python_backend's words
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config function "
                    f"for model '{self._model()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                f"model transaction property in auto-complete-config function for model '{self._model()}' contains "
                "property other than 'decoupled'."
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._model()}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002  (Triton's name)
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, entry: dict[str, Any], allowed: tuple[str, ...]) -> None:
        """python_backend's rules and words: known properties only, name/data_type/dims given, and an entry the
        configuration already has must agree with it (its data type and dims are then filled in)."""
        if not isinstance(entry, dict):
            raise ValueError(f"{kind} must be a dict")
        model = self._model()
        label = f"{kind} '{entry.get('name', '')}' in auto-complete-config function for model '{model}'"
        if any(key not in allowed for key in entry):
            listed = ", ".join(f"'{key}'" for key in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(f"{label} contains property other than {listed}.")
        if "name" not in entry:
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in entry:
                raise ValueError(f"{label} is missing '{key}' property.")
        entries = self._config.setdefault(kind, [])
        for existing in entries:
            if existing.get("name") != entry["name"]:
                continue
            known_type = existing.get("data_type", "TYPE_INVALID")
            known_dims = [int(d) for d in existing.get("dims", [])]
            dims = [int(d) for d in entry["dims"]]
            if known_type not in ("", "TYPE_INVALID") and known_type != entry["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {known_type} for {kind} "
                    f"'{entry['name']}', model provides {entry['data_type']}"
                )
            if known_dims and known_dims != dims:
                raise ValueError(
                    f"model '{model}', tensor '{entry['name']}': the model expects dims {dims} but the model "
                    f"configuration specifies dims {known_dims}"
                )
            if "optional" in existing and "optional" in entry and existing["optional"] != entry["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{entry['name']}': the model expects optional {entry['optional']} but "
                    f"the model configuration specifies optional {existing['optional']}"
                )
            existing["data_type"] = entry["data_type"]
            existing["dims"] = dims
            if "optional" in entry:
                existing["optional"] = entry["optional"]
            return
        entries.append(dict(entry))

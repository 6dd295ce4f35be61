"""The core's vocabulary: requests and responses as plain slotted objects.

Rules:
- Nothing here knows about gRPC, HTTP or protobuf.  Frontends and the codec
  build these objects; the core, schedulers and backends only read them.
- Tensor data is always a numpy array.  For requests decoded from the wire it is
  a read-only *view* on the received bytes (no copy); BYTES tensors are object
  arrays of ``bytes``; BF16 tensors are ``uint16`` arrays of raw bits.  One
  exception: an input read from a CUDA shared-memory region, for a model whose
  instances bind inputs on that GPU, is a ``cuda.DeviceArray`` (``LoadedModel.device_inputs``).
- Parameters are ``dict[str, bool | int | float | str]``.  A value that travels
  as protobuf ``uint64_param`` is a :class:`UInt64` so it is written back the
  same way (Triton's ``priority`` is one).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class UInt64(int):
    """An int that is encoded as ``uint64_param`` on the wire."""

    __slots__ = ()


ParameterValue = bool | int | float | str
Parameters = dict[str, ParameterValue]


class TensorFields(Protocol):
    """What :class:`InferInput` and :class:`InferOutput` both carry, for code that reads either.

    The two are distinct classes, not one class under two names: an input's
    ``data`` is None while it still lives in a shared-memory region the Core
    has to map, an output's when it was already written into one; an input's
    ``parameters`` are what the client sent with it, an output's what goes back
    (e.g. ``binary_data_size``).  They share no base class on purpose: the
    codec fills their slots in place and takes that fast path only for plain
    ``object`` subclasses with exactly these slots (``wire/codec/objects.pxi``, ``_init_layout``).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: Parameters


class InferInput:
    """One input tensor of a request, as the client sent it."""

    __slots__ = ("name", "datatype", "shape", "data", "parameters")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        data: np.ndarray | None,
        parameters: Parameters | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        #: None only while the data still lives in a shared-memory region (the Core maps it before prepare).
        self.data = data
        self.parameters = parameters if parameters is not None else {}

    def __repr__(self) -> str:
        return f"InferInput({self.name!r}, {self.datatype}, {list(self.shape)})"


class RequestedOutput:
    """An output the client asked for by name, with its parameters."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: Parameters | None = None) -> None:
        self.name = name
        self.parameters = parameters if parameters is not None else {}

    def __repr__(self) -> str:
        return f"RequestedOutput({self.name!r})"


class InferRequest:
    """An inference request as every frontend hands it to the core."""

    __slots__ = ("model_name", "model_version", "id", "parameters", "inputs", "outputs")

    def __init__(
        self,
        model_name: str,
        model_version: str = "",
        id: str = "",
        parameters: Parameters | None = None,
        inputs: list[InferInput] | None = None,
        outputs: list[RequestedOutput] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = parameters if parameters is not None else {}
        self.inputs = inputs if inputs is not None else []
        #: Empty means "every output of the model".
        self.outputs = outputs if outputs is not None else []

    def __repr__(self) -> str:
        return (
            f"InferRequest({self.model_name!r}, version={self.model_version!r}, id={self.id!r}, "
            f"inputs={self.inputs!r}, outputs={self.outputs!r})"
        )


class JsonInferRequest(InferRequest):
    """An InferRequest from a V2 JSON body, naming its BYTES inputs whose elements came as JSON strings.

    Only MLServer runtimes read it: MLServer gives such elements to its runtimes as ``str`` over REST (and as
    ``bytes`` over gRPC); every other model sees the same ``bytes`` whatever the protocol.
    """

    __slots__ = ("text_inputs",)

    def __init__(self, *args: Any, text_inputs: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text_inputs = text_inputs


def text_inputs(request: InferRequest) -> frozenset[str]:
    """The BYTES inputs of ``request`` whose elements came as JSON strings (see :class:`JsonInferRequest`)."""
    return request.text_inputs if isinstance(request, JsonInferRequest) else frozenset()


class InferOutput:
    """One output tensor of a response, as it goes back to the client."""

    __slots__ = ("name", "datatype", "shape", "data", "parameters")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        data: np.ndarray | None,
        parameters: Parameters | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        #: None when the output was already written into a shared-memory region (nothing to send).
        self.data = data
        self.parameters = parameters if parameters is not None else {}

    def __repr__(self) -> str:
        return f"InferOutput({self.name!r}, {self.datatype}, {list(self.shape)})"


class InferResponse:
    """The result of one request."""

    __slots__ = ("model_name", "model_version", "id", "parameters", "outputs")

    def __init__(
        self,
        model_name: str,
        model_version: str = "",
        id: str = "",
        parameters: Parameters | None = None,
        outputs: list[InferOutput] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = parameters if parameters is not None else {}
        self.outputs = outputs if outputs is not None else []

    def output(self, name: str) -> InferOutput:
        """The output called ``name``; KeyError if absent."""
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"InferResponse({self.model_name!r}, id={self.id!r}, outputs={self.outputs!r})"


def as_dict(obj: Any) -> dict[str, Any]:
    """The slots of a request/response object as a dict (for logs and tests)."""
    return {name: getattr(obj, name) for name in obj.__slots__}

"""MLServer's gRPC conventions, for models from model-settings.json only: BYTES shapes, and stream messages.

MLServer's clients (``ModelInferRequestConverter``) send one string as BYTES with ``shape: [len(s)]`` and the
string as the only element of ``contents.bytes_contents``; the native codec keeps Triton's rule (one element
per shape position) and refuses it.  On exactly that refusal, and only for a model whose config came from a
model-settings.json (:func:`fastoip.model_config.is_model_settings_config`), the request is read again
here with protobuf, its elements taken as sent.  Nothing of this runs for a request the codec accepts.

ModelStreamInfer (``--mlserver-grpc-stream``, which ``fastoip mlserver start`` turns on): MLServer's
``dataplane.proto`` streams bare ``ModelInferResponse`` messages where Triton's streams
``ModelStreamInferResponse`` (``error_message``, ``infer_response``) on the same method path, so one stub
cannot read the other's.  With the switch on, a stream request to such a model (:func:`answers_as_mlserver`) is
answered MLServer's way: each response a bare ``ModelInferResponse``, and an error ends the stream with its
gRPC status (MLServer's servicer aborts); every other model keeps Triton's messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._proto import grpc_service_pb2 as pb
from ...core import Core
from ...datatypes import NUMPY_DTYPES
from ...errors import InferenceError
from ...model_config import is_model_settings_config
from ...types import InferInput, InferRequest, RequestedOutput, UInt64

#: The codec's words for a BYTES tensor whose element count differs from its shape.
BYTES_COUNT_MISMATCH = "bytes_contents has"
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents"}


def mlserver_request(core: Core, message: str, data: bytes | None) -> InferRequest | None:
    """The request read with MLServer's BYTES shapes when its model is an MLServer-settings model, else None."""
    if data is None or BYTES_COUNT_MISMATCH not in message:
        return None
    try:
        request = _decode(data)
        if request is None:
            return None
        config = core.model_config(request.model_name, request.model_version)
    except (InferenceError, ValueError, TypeError):
        return None
    return request if is_model_settings_config(config) else None


def answers_as_mlserver(core: Core, request: InferRequest) -> bool:
    """Whether ``request``'s model is from a model-settings.json (its stream answers are MLServer's messages)."""
    try:
        return is_model_settings_config(core.model_config(request.model_name, request.model_version))
    except InferenceError:
        return False


def _decode(data: bytes) -> InferRequest | None:
    message = pb.ModelInferRequest.FromString(data)
    raw = list(message.raw_input_contents)
    inputs = []
    for index, tensor in enumerate(message.inputs):
        shape = tuple(int(d) for d in tensor.shape)
        datatype = tensor.datatype
        array: np.ndarray
        if datatype == "BYTES":
            if raw:
                return None  # only the contents form is MLServer's
            elements = list(tensor.contents.bytes_contents)
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
        elif datatype in NUMPY_DTYPES and raw and index < len(raw):
            array = np.frombuffer(raw[index], dtype=NUMPY_DTYPES[datatype]).reshape(shape)
        elif datatype in _CONTENTS:
            array = np.asarray(getattr(tensor.contents, _CONTENTS[datatype]), dtype=NUMPY_DTYPES[datatype])
            array = array.reshape(shape)
        else:
            return None
        inputs.append(InferInput(tensor.name, datatype, shape, array, _parameters(tensor.parameters)))
    outputs = [RequestedOutput(o.name, _parameters(o.parameters)) for o in message.outputs]
    return InferRequest(message.model_name, message.model_version, message.id, _parameters(message.parameters),
                        inputs, outputs)


def _parameters(entries: Any) -> dict:
    out: dict = {}
    for key, value in entries.items():
        which = value.WhichOneof("parameter_choice")
        if which == "uint64_param":
            out[key] = UInt64(value.uint64_param)
        elif which is not None:
            out[key] = getattr(value, which)
    return out

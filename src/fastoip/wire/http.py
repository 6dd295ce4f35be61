"""HTTP/REST inference bodies: V2 JSON and Triton's binary tensor extension <-> core types.

Rules:
- Sans-I/O: bytes in, an InferRequest out; an InferResponse in, bytes out.
  No sockets and no asyncio here; the frontend (``server/http/``) does the I/O.
- Body layout (Triton's ``binary_tensor_data`` extension): with the header
  ``Inference-Header-Content-Length: N`` the first N bytes are the JSON
  request and the rest holds, in input order, the tensors of the inputs whose
  parameters carry ``binary_data_size``.  Without the header the whole body is
  JSON.  ``Inference-Header-Content-Length: 0`` is a raw request: the body is
  the one input tensor and nothing else (:func:`decode_raw_request`).
- Zero copy in: numeric binary inputs are ``np.frombuffer`` views on the body.
  One copy out: each output's bytes are copied once, when the response body is
  joined (BYTES outputs are framed first, which is their one re-encoding).
- Numeric JSON data goes through numpy in bulk (``np.asarray`` then one
  ``astype``), never an element loop; numeric JSON outputs are written by
  orjson straight from the array.  BYTES elements are strings in JSON, so they
  are encoded and decoded one by one (UTF-8): there is no bulk form of that.
- FP16 and BF16 have no JSON form (as in Triton): binary only, both ways.
  A JSON number beyond FP32's range for an FP32 input is refused (400 naming
  the input), never turned into inf.
- A BYTES output asked for as JSON whose bytes are not UTF-8 is an error (400,
  naming the output and the element), not a silent switch to binary: a
  JSON-only client could not read a binary body.  Ask for it with
  ``binary_data: true``.
- Which outputs are binary: an output's own ``binary_data`` parameter, else the
  request's ``binary_data_output``, else JSON.  Raw requests get binary outputs.
- System shared memory (Triton's ``shared_memory_region``,
  ``shared_memory_offset``, ``shared_memory_byte_size`` parameters): an input
  in a region becomes an ``InferInput`` with ``data=None`` and those
  parameters, which the Core resolves into a zero-copy view of the region; it
  has no ``data`` and no binary part.  An output asked for in a region is
  written there by the Core and comes back as Triton sends it: name, datatype
  and shape, no ``data``, no ``binary_data_size``, no binary part.  Only the
  parameters' types are checked here; the Core checks them against the region.
- Every error is an :class:`InvalidArgument` that names the input or output,
  what was expected and what came.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from .. import _codec
from ..datatypes import NUMPY_DTYPES
from ..errors import CodecError, InvalidArgument
from ..shared_memory import BYTE_SIZE, OFFSET, REGION
from ..types import InferInput, InferRequest, InferResponse, JsonInferRequest, RequestedOutput


class TensorDescription(Protocol):
    """A model input as metadata states it (the Core's ``TensorMetadata`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> Sequence[int]: ...


JSON_CONTENT_TYPE = b"application/json"
BINARY_CONTENT_TYPE = b"application/octet-stream"

#: Datatypes that only travel as binary data.
BINARY_ONLY = frozenset(("FP16", "BF16"))

#: numpy kinds (of the array numpy infers from JSON values) each datatype accepts.
_JSON_KINDS = {"BOOL": "b", "FP32": "iuf", "FP64": "iuf"}
_JSON_KIND_WORDS = {"b": "true/false", "iu": "integers", "iuf": "numbers"}
_VALUE_WORDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers", "U": "strings"}


class OutputFormat:
    """Which outputs of one request go back as binary data."""

    __slots__ = ("default_binary", "per_output")

    def __init__(self, default_binary: bool = False, per_output: dict[str, bool] | None = None) -> None:
        self.default_binary = default_binary
        self.per_output = per_output or {}

    def is_binary(self, name: str) -> bool:
        return self.per_output.get(name, self.default_binary)


# --------------------------------------------------------------------------- #
# Requests                                                                    #
# --------------------------------------------------------------------------- #


def decode_infer_request(
    model_name: str, model_version: str, body: bytes | bytearray, header_length: int | None,
    loose_bytes: bool = False
) -> tuple[InferRequest, OutputFormat]:
    """A JSON (+ binary tensors) request body as an InferRequest and its output format.

    ``header_length`` is the parsed ``Inference-Header-Content-Length`` (None:
    the whole body is JSON); the caller has checked ``0 < header_length <= len(body)``.
    ``loose_bytes``: a BYTES input's JSON ``data`` is taken as its elements whatever its shape says, and a bare
    string as one element (MLServer's ``shape: [len(s)]`` for one string, and its TensorData; models from
    model-settings.json only).
    """
    json_end = len(body) if header_length is None else header_length
    doc = _parse_json(body if header_length is None else memoryview(body)[:json_end])
    request_id = doc.get("id") or ""  # null is absent (MLServer's client sends ``InferenceRequest.dict()``)
    if type(request_id) is not str:
        raise InvalidArgument(f"'id' must be a string, got {_json_type(request_id)}")
    parameters = _parameters(doc.get("parameters"), "the request")
    default_binary = _bool_parameter(parameters.pop("binary_data_output", False), "binary_data_output")
    text: list[str] = []
    inputs = _decode_inputs(doc.get("inputs"), body, json_end, header_length is not None, loose_bytes,
                            model_name=model_name, text=text)
    outputs, per_output = _decode_outputs(doc.get("outputs"))
    if text:  # BYTES as JSON strings: MLServer runtimes see them as str (types.JsonInferRequest)
        request: InferRequest = JsonInferRequest(
            model_name, model_version, request_id, parameters, inputs, outputs, text_inputs=frozenset(text)
        )
    else:
        request = InferRequest(model_name, model_version, request_id, parameters, inputs, outputs)
    return request, OutputFormat(default_binary, per_output)


def decode_raw_request(
    model_name: str, model_version: str, body: bytes | bytearray, specs: Sequence[TensorDescription],
    batching: bool
) -> tuple[InferRequest, OutputFormat]:
    """A raw binary request (``Inference-Header-Content-Length: 0``): the body is the model's one input.

    Name, datatype and dims come from the model metadata's inputs; a batching model gets
    a batch of one.  One variable (-1) dim is derived from the byte count;
    more than one, or a variable BYTES tensor, cannot be and is an error.
    """
    if len(specs) != 1:
        raise InvalidArgument(
            # Triton's words (the request has one input, the body), then fastoip's detail.
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(specs)} inputs in "
            f"'{model_name}' model configuration (a raw binary request, Inference-Header-Content-Length: 0, "
            f"needs a model with exactly one input; this one has {', '.join(s.name for s in specs)})"
        )
    spec = specs[0]
    name, datatype = spec.name, spec.datatype
    dims = list(spec.shape[1:] if batching else spec.shape)
    where = f"raw binary request for model '{model_name}': input '{name}' ({datatype} {dims})"
    variable = [index for index, dim in enumerate(dims) if dim < 0]
    if datatype == "BYTES":
        if variable or math.prod(dims) != 1:
            raise InvalidArgument(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1] ({where}; "
                "send a JSON header with the shape instead)"
            )
        # The body is the one element itself; Triton adds the 4-byte length prefix (core infer_request.cc).
        array = np.array([bytes(body)], dtype=object)
    else:
        dtype = NUMPY_DTYPES[datatype]
        fixed_bytes = math.prod(dim for dim in dims if dim >= 0) * dtype.itemsize
        if len(variable) > 1:
            raise InvalidArgument(
                f"The shape of the raw input '{name}' can not be deduced because there are more than one "
                f"variable-sized dimension ({where}; send a JSON header with the shape)"
            )
        if variable:
            if fixed_bytes == 0 or len(body) % fixed_bytes:
                raise InvalidArgument(f"{where}: {len(body)} bytes is not a whole number of {fixed_bytes}-byte rows")
            dims[variable[0]] = len(body) // fixed_bytes
        elif len(body) != fixed_bytes:
            raise InvalidArgument(f"{where} needs {fixed_bytes} bytes, the body has {len(body)}")
        array = np.frombuffer(body, dtype)
    shape = [1, *dims] if batching else dims
    tensor = InferInput(name, datatype, tuple(shape), array.reshape(shape))
    return InferRequest(model_name, model_version, "", {}, [tensor], []), OutputFormat(default_binary=True)


def parse_json_object(data: Any, what: str) -> dict:
    """A JSON object from a request body; InvalidArgument naming ``what`` otherwise."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # Triton's words for too deep a document (orjson's limit is 1024)
            raise InvalidArgument(f"JSON nesting depth exceeds maximum allowed limit in the {what}: {exc}") from None
        raise InvalidArgument(f"malformed JSON in the {what}: {exc}") from None
    if type(doc) is not dict:
        raise InvalidArgument(f"the {what} must be a JSON object, got {_json_type(doc)}")
    return doc


def _parse_json(data: Any) -> dict:
    if not len(data):
        raise InvalidArgument("the inference request has an empty JSON header")
    return parse_json_object(data, "inference request")


def _decode_inputs(
    items: Any, body: bytes | bytearray, offset: int, has_binary: bool, loose_bytes: bool = False, model_name: str = "",
    text: list[str] | None = None,
) -> list[InferInput]:
    """The request's inputs; binary ones are taken from ``body`` in order, starting at ``offset``.  ``text``
    gets the names of the BYTES inputs whose elements are JSON strings."""
    if type(items) is not list:
        raise InvalidArgument(f"'inputs' must be a list of input objects, got {_json_type(items)}")
    inputs = []
    bytes_elements = 0  # BYTES elements of the request so far: capped before any is decoded
    for index, item in enumerate(items):
        if type(item) is not dict:
            raise InvalidArgument(f"input #{index} must be an object, got {_json_type(item)}")
        name = item.get("name")
        if type(name) is not str:
            raise InvalidArgument(f"input #{index}: 'name' must be a string, got {_json_type(name)}")
        datatype = item.get("datatype")
        if datatype not in NUMPY_DTYPES:
            raise InvalidArgument(
                f"input '{name}': unknown datatype {orjson.dumps(datatype).decode()}; "
                f"expected one of {', '.join(NUMPY_DTYPES)}"
            )
        shape = _shape(item.get("shape"), name)
        parameters = _parameters(item.get("parameters"), f"input '{name}'")
        if REGION in parameters:
            if "data" in item or "binary_data_size" in parameters:
                raise InvalidArgument(
                    f"input '{name}' has a '{REGION}' parameter and also "
                    f"{'data' if 'data' in item else 'a binary_data_size parameter'}; "
                    "its data comes from one place only"
                )
            _check_shared_memory(parameters, f"input '{name}'")
            inputs.append(InferInput(name, datatype, tuple(shape), None, parameters))  # the Core maps the region
            continue
        if datatype == "BYTES":
            bytes_elements += math.prod(shape)
            if bytes_elements > _codec.max_bytes_elements():
                raise InvalidArgument(
                    f"input '{name}': too many elements for BYTES tensors in one request: {bytes_elements}, more "
                    f"than this server's limit of {_codec.max_bytes_elements()} (--max-bytes-elements)"
                )
        size = parameters.pop("binary_data_size", None)
        if size is not None:
            if "data" in item:
                raise InvalidArgument(f"input '{name}' has both 'data' and a 'binary_data_size' parameter")
            if type(size) is not int or size < 0:
                raise InvalidArgument(
                    f"input '{name}': 'binary_data_size' must be a non-negative integer, got {json_excerpt(size)}"
                )
            if size and not has_binary:
                raise InvalidArgument(
                    f"input '{name}' has binary_data_size {size}, but the request has no "
                    "Inference-Header-Content-Length header saying where the JSON ends and binary data begins"
                )
            if offset + size > len(body):
                raise InvalidArgument(
                    f"input '{name}': binary_data_size is {size} but only {len(body) - offset} bytes "
                    "of binary data remain in the request body"
                )
            array = _binary_tensor(body, offset, size, datatype, shape, name, model_name)
            offset += size
        elif "data" in item:
            _check_element_count(name, datatype, shape)
            if loose_bytes and datatype == "BYTES" and type(item["data"]) in (list, str):
                # MLServer's TensorData: a bare string is one element (its content-type example sends one)
                flat = np.asarray(item["data"] if type(item["data"]) is list else [item["data"]], dtype=object)
                flat = flat.reshape(-1)
                array = _json_bytes(flat.tolist(), flat.size, name)
            else:
                array = _json_tensor(item["data"], datatype, shape, name)
            if datatype == "BYTES" and text is not None:
                text.append(name)
        else:
            raise InvalidArgument(f"input '{name}' has neither 'data' nor a 'binary_data_size' parameter")
        inputs.append(InferInput(name, datatype, tuple(shape), array, parameters))
    if offset != len(body):
        raise InvalidArgument(
            f"{len(body) - offset} bytes of binary data follow the JSON header that no input claims "
            "(the inputs' binary_data_size values add up to less than the body)"
        )
    return inputs


def _shape(value: Any, name: str) -> list[int]:
    if type(value) is not list or any(type(dim) is not int or dim < 0 for dim in value):
        # Triton's words first where it has them (its JSON reader's, answered 500 there; 400 here: COMPATIBILITY.md)
        triton = ("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer: "
                  if type(value) is list else "")
        raise InvalidArgument(
            f"{triton}input '{name}': 'shape' must be a list of non-negative integers, got {json_excerpt(value)}"
        )
    return value


INT64_MAX = 2**63 - 1
#: Triton's HTTP_MAX_JSON_NESTING_DEPTH: how deep a JSON 'data' array may nest.
MAX_JSON_DATA_DEPTH = 100


def _check_element_count(name: str, datatype: str, shape: list[int]) -> None:
    """Triton's checks on a JSON input's shape: its element count and byte size must fit an int64."""
    count = math.prod(shape)
    if count > INT64_MAX:
        raise InvalidArgument(
            f"invalid shape for input '{name}': shape {shape_text(shape)} causes total element count to exceed "
            f"maximum size of {INT64_MAX}"
        )
    item_size = NUMPY_DTYPES[datatype].itemsize if datatype != "BYTES" else 1
    if item_size > 1 and count > INT64_MAX // item_size:
        raise InvalidArgument(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({item_size}) exceeds "
            f"maximum allowed size ({INT64_MAX})"
        )


def shape_text(shape: list[int]) -> str:
    """A shape as Triton prints it: ``[2,3]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def _check_json_depth(data: list) -> None:
    """Triton's nesting bound on 'data' (its parser recurses once per level); the first path is the depth."""
    depth = 0
    while type(data) is list:
        depth += 1
        if depth >= MAX_JSON_DATA_DEPTH:
            raise InvalidArgument(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DATA_DEPTH})")
        if not data:
            return
        data = data[0]


def _binary_tensor(
    body: bytes | bytearray, offset: int, size: int, datatype: str, shape: list[int], name: str, model_name: str = ""
) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_tensor(body, offset, size, count, f"input '{name}':").reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    expected = count * dtype.itemsize
    if size != expected:
        raise InvalidArgument(
            # Triton's words first, then the detail.
            f"input byte size mismatch for input '{name}' for model '{model_name}'. Expected {expected}, got {size} "
            f"(input '{name}': {datatype} {shape} needs {expected} bytes of binary data, "
            f"but its binary_data_size is {size})"
        )
    # A read-only view on the request body: no copy.
    return np.frombuffer(body, dtype, count, offset).reshape(shape)


def _bytes_tensor(body: bytes | bytearray, offset: int, size: int, count: int, where: str) -> np.ndarray:
    try:
        return _codec.deserialize_bytes_tensor(memoryview(body)[offset : offset + size], count)
    except CodecError as exc:
        raise CodecError(f"{where} {exc} (BYTES binary data is a 4-byte little-endian length per element)") from None


#: Triton's words for JSON 'data' whose element count does not match the shape (clients match on them).
SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
#: The start of the refusal of JSON 'data' that is not a list.
NOT_A_LIST = "'data' must be a list, got"


def loose_bytes_may_accept(message: str) -> bool:
    """Whether a refusal is one that ``loose_bytes`` decoding (MLServer's BYTES rules) may accept: a BYTES shape
    that does not count the elements, or a bare string as ``data``."""
    return message.startswith(SHAPE_MISMATCH) or (NOT_A_LIST + " a string") in message


def _json_tensor(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise InvalidArgument(
            f"input '{name}': {datatype} data cannot travel as JSON; send it as binary data "
            "(parameters.binary_data_size and Inference-Header-Content-Length)"
        )
    if type(data) is not list:
        raise InvalidArgument(f"input '{name}': {NOT_A_LIST} {_json_type(data)}")
    _check_json_depth(data)
    count = math.prod(shape)
    if datatype == "BYTES":
        return _json_bytes(data, count, name).reshape(shape)
    try:
        values = np.asarray(data)  # numpy infers int64 / uint64 / float64 / bool / str from the JSON values
    except ValueError:
        # Nested lists of uneven lengths ([[1, 2, 3], [4, ...16]] for [1, 16]): Triton walks the nesting and
        # counts elements only, whatever the nesting; so does this, flat in row-major order.
        data = _flatten(data)
        try:
            values = np.asarray(data)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"input '{name}': 'data' holds values that are not {datatype}: {exc}") from None
    except TypeError as exc:
        raise InvalidArgument(f"input '{name}': 'data' holds values that are not {datatype}: {exc}") from None
    if values.size != count:
        raise InvalidArgument(
            f"{SHAPE_MISMATCH}: input '{name}': shape {shape} needs {count} elements, but 'data' has {values.size}"
        )
    dtype = NUMPY_DTYPES[datatype]
    if count and dtype.kind in "iu" and values.dtype.kind == "f":
        # numpy reads a mix of int64-only and uint64-only integers as float64: read the data
        # again as the target type (exact, and numpy raises on out-of-range integers), then
        # make sure no value was a fraction.
        try:
            exact = np.asarray(data, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            info = np.iinfo(dtype)
            raise InvalidArgument(f"input '{name}': {datatype} values must lie in [{info.min}, {info.max}]") from None
        if not np.array_equal(exact.astype(np.float64), values):
            raise InvalidArgument(f"input '{name}': {datatype} data must be integers, got non-integer numbers")
        return exact.reshape(shape)
    if count:
        allowed = _JSON_KINDS.get(datatype, "iu")
        if values.dtype.kind not in allowed:
            got = _VALUE_WORDS.get(values.dtype.kind, "mixed or non-numeric values")
            raise InvalidArgument(f"input '{name}': {datatype} data must be {_JSON_KIND_WORDS[allowed]}, got {got}")
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = values.min(), values.max()
            if low < info.min or high > info.max:
                raise InvalidArgument(
                    f"input '{name}': {datatype} values must lie in [{info.min}, {info.max}], got a value of "
                    f"{low if low < info.min else high}"
                )
    if dtype.kind != "f":
        return values.astype(dtype, copy=False).reshape(shape)
    with np.errstate(over="ignore"):  # an overflow is reported below, naming the input
        result = values.astype(dtype, copy=False)
    if count and not np.isfinite(result).all():
        # JSON has no inf or NaN (the parser refuses both), so a non-finite value here overflowed the type.
        info = np.finfo(dtype)
        raise InvalidArgument(
            f"input '{name}': {datatype} values must lie in [{-info.max:g}, {info.max:g}], got a value of "
            f"{values.reshape(-1)[~np.isfinite(result.reshape(-1))][0]:g}"
        )
    return result.reshape(shape)


def _flatten(data: list) -> list:
    """Nested lists as one flat list, in order (the JSON depth limit bounds the nesting)."""
    flat: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_bytes(data: list, count: int, name: str) -> np.ndarray:
    values = np.asarray(_flatten(data), dtype=object)  # any nesting, as Triton reads it
    if values.size != count:
        raise InvalidArgument(
            f"{SHAPE_MISMATCH}: input '{name}': its shape needs {count} elements, but 'data' has {values.size}"
        )
    elements = values.tolist()
    try:
        encoded = [element.encode("utf-8") for element in elements]
    except AttributeError:
        bad = next(i for i, element in enumerate(elements) if type(element) is not str)
        raise InvalidArgument(
            f"input '{name}': BYTES data must be strings, element {bad} is {_json_type(elements[bad])}"
        ) from None
    array = np.empty(count, dtype=object)
    array[:] = encoded
    return array


def _decode_outputs(items: Any) -> tuple[list[RequestedOutput], dict[str, bool]]:
    if items is None:
        return [], {}
    if type(items) is not list:
        raise InvalidArgument(f"'outputs' must be a list of output objects, got {_json_type(items)}")
    outputs, per_output = [], {}
    for index, item in enumerate(items):
        if type(item) is not dict or type(item.get("name")) is not str:
            raise InvalidArgument(f"output #{index} must be an object with a string 'name', got {json_excerpt(item)}")
        name = item["name"]
        parameters = _parameters(item.get("parameters"), f"output '{name}'")
        if REGION in parameters:
            _check_shared_memory(parameters, f"output '{name}'")
        if "binary_data" in parameters:
            per_output[name] = _bool_parameter(parameters.pop("binary_data"), f"output '{name}': binary_data")
        outputs.append(RequestedOutput(name, parameters))
    return outputs, per_output


def _parameters(value: Any, where: str) -> dict:
    """An object of parameters; null (the object, or one parameter) is absent, as MLServer's client sends unset
    ones (``"parameters": null``, ``"headers": null``)."""
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidArgument(f"{where}: 'parameters' must be an object, got {_json_type(value)}")
    unset = False
    for key, item in value.items():
        if item is None:
            unset = True
        elif type(item) not in (str, int, float, bool):
            raise InvalidArgument(
                f"{where}: parameter '{key}' must be a string, number or boolean, got {_json_type(item)}"
            )
    return {key: item for key, item in value.items() if item is not None} if unset else dict(value)


def _check_shared_memory(parameters: dict, where: str) -> None:
    """The shared-memory parameters' JSON types: a region name and non-negative integers."""
    region = parameters[REGION]
    if type(region) is not str or not region:
        raise InvalidArgument(
            f"{where}: '{REGION}' must be a region name (a non-empty string), got {json_excerpt(region)}"
        )
    for key in (OFFSET, BYTE_SIZE):
        value = parameters.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidArgument(
                f"{where}: '{key}' must be a non-negative integer, got {json_excerpt(value)} (region '{region}')"
            )


def _bool_parameter(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise InvalidArgument(f"parameter '{name}' must be true or false, got {json_excerpt(value)}")
    return value


# --------------------------------------------------------------------------- #
# Responses                                                                   #
# --------------------------------------------------------------------------- #


def encode_infer_response(response: InferResponse, output_format: OutputFormat) -> tuple[bytes, int | None, bytes]:
    """``(content_type, json_header_length or None, body)`` for an InferResponse.

    The JSON length is None when every output is JSON (the body is plain JSON).
    """
    outputs = []
    blobs: list[Any] = []
    for out in response.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        parameters = dict(out.parameters) if out.parameters else {}
        if out.data is None:
            pass  # written to a shared-memory region: no data and no binary part, as Triton answers
        elif output_format.is_binary(out.name):
            blob = _binary_output(out.datatype, out.data)
            parameters["binary_data_size"] = len(blob)
            blobs.append(blob)
        else:
            entry["data"] = _json_output(out.name, out.datatype, out.data)
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return JSON_CONTENT_TYPE, None, header
    # The one copy of each output: into the response body.
    return BINARY_CONTENT_TYPE, len(header), b"".join([header, *blobs])


def _binary_output(datatype: str, data: np.ndarray) -> Any:
    if datatype == "BYTES":
        return _codec.serialize_bytes_tensor(data)
    # A byte view of the array (no copy unless the array is not contiguous).
    return memoryview(np.ascontiguousarray(data).reshape(-1)).cast("B")  # type: ignore[arg-type]  # numpy arrays are buffers; numpy 2 stubs do not say so


def _json_output(name: str, datatype: str, data: np.ndarray) -> Any:
    if datatype in BINARY_ONLY:
        raise InvalidArgument(
            f"output '{name}' is {datatype}, which has no JSON form; request it as binary data "
            "(output parameter binary_data: true, or request parameter binary_data_output: true)"
        )
    if datatype == "BYTES":
        elements = data.reshape(-1).tolist()
        try:
            return [e.decode("utf-8") if type(e) is bytes else e for e in elements]
        except UnicodeDecodeError:
            bad = next(i for i, e in enumerate(elements) if type(e) is bytes and not _is_utf8(e))
            raise InvalidArgument(
                f"output '{name}' element {bad} is not valid UTF-8, so it cannot be sent as a JSON string; "
                "request the output as binary data (binary_data: true)"
            ) from None
    # orjson writes numpy arrays itself (OPT_SERIALIZE_NUMPY): no Python objects per element.
    return np.ascontiguousarray(data).reshape(-1)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --------------------------------------------------------------------------- #
# Messages                                                                    #
# --------------------------------------------------------------------------- #


_JSON_TYPE_WORDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
                    dict: "an object", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPE_WORDS.get(type(value), type(value).__name__)


def json_excerpt(value: Any, limit: int = 80) -> str:
    """``value`` as JSON, cut to ``limit`` characters: how error messages quote what a client sent."""
    text = orjson.dumps(value, default=repr).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: A JSON input's data as an array, and an output's data as JSON: shared with the generate extension (.generate).
json_tensor = _json_tensor
json_output = _json_output
json_type = _json_type

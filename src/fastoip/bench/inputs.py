"""From a model's metadata and config to request bytes, built once before the load.

The batch rule (what the leading dimension means), as perf_analyzer does it
where a config exists and a documented guess where none does:

1. The server returned a ModelConfig:
   ``max_batch_size > 0`` -> the first metadata dim of every input and output is
   the batch dim; it is filled with ``-b`` (``-b`` above max_batch_size is an
   error) and ``--shape`` gives the other dims.  ``max_batch_size == 0`` -> no
   batch dim, ``-b`` must be 1, ``--shape`` gives the whole shape.
2. No ModelConfig (UNIMPLEMENTED / 404, e.g. MLServer, KServe): when every
   input's metadata shape starts with ``-1`` the first dim is taken as the batch
   dim and filled with ``-b`` (so ``-b 1`` sends a leading 1, which is what a
   non-batching model with a ``-1`` leading dim accepts too); otherwise ``-b``
   must be 1 and shapes are used as they are.

Any other ``-1`` dim needs ``--shape NAME:d1,d2`` (or a ``"shape"`` in the
``--input-data`` file, or, with exactly one ``-1``, data that fixes it).

Input data (``--input-data``): ``zero``, ``random`` (numpy default_rng(0)), or
a JSON file in perf_analyzer's format::

    {"data": [{"INPUT0": [1, 2, ...], "INPUT1": {"content": [...], "shape": [16]}},
              {"INPUT0": {"b64": "<base64 of the raw little-endian bytes>"}, ...}]}

Each entry is one batch item (one request when the model has no batch dim);
a request of batch b stacks b consecutive entries, and the load cycles over
``max(1, len(entries) // b)`` distinct requests.
"""

from __future__ import annotations

import base64
import json
import string
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..datatypes import NUMPY_DTYPES
from .target import BenchError

#: At most this many distinct requests are built from an --input-data file.
MAX_DISTINCT_REQUESTS = 256


@dataclass
class TensorPlan:
    """One tensor of the request (or an expected output): name, type, full shape."""

    name: str
    datatype: str
    shape: list[int]


@dataclass
class ModelPlan:
    """What every request to one model looks like."""

    model: str
    version: str
    batch_size: int
    #: True when the leading dim is the batch dim.
    batched: bool
    #: From the config; None when the server gave no config.
    max_batch_size: Optional[int]
    #: "config" or "metadata": where the batch rule came from.
    source: str
    #: Input tensors; shapes may hold -1 only until the data fixes them.
    inputs: list[TensorPlan] = field(default_factory=list)
    #: Outputs with the batch dim filled in (-1 stays where the model is dynamic).
    outputs: list[TensorPlan] = field(default_factory=list)


def parse_shape_arg(text: str) -> tuple[str, list[int]]:
    """``NAME:d1,d2`` -> (NAME, [d1, d2]).  The name may itself hold ':'."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise BenchError(f"--shape {text!r}: expected NAME:d1,d2", stage="args")
    try:
        values = [int(d) for d in dims.split(",") if d.strip() != ""]
    except ValueError:
        raise BenchError(f"--shape {text!r}: dims must be integers", stage="args") from None
    if any(d < 0 for d in values):
        raise BenchError(f"--shape {text!r}: dims must be >= 0", stage="args")
    return name, values


def plan_model(
    metadata: dict,
    config: Optional[dict],
    batch_size: int,
    shapes: dict[str, list[int]],
    version: str = "",
) -> ModelPlan:
    """Apply the batch rule (module docstring) and --shape to the metadata."""
    model = metadata["name"]
    if batch_size < 1:
        raise BenchError("-b must be >= 1", stage="args")
    if not metadata["inputs"]:
        raise BenchError(f"model '{model}' lists no inputs in its metadata; cannot build requests", stage="metadata")
    if config is not None:
        max_batch = int(config.get("max_batch_size", 0))
        batched = max_batch > 0
        source = "config"
        if batched and batch_size > max_batch:
            raise BenchError(f"-b {batch_size} exceeds max_batch_size {max_batch} of model '{model}'", stage="args")
        if not batched and batch_size > 1:
            raise BenchError(
                f"model '{model}' does not support batching (max_batch_size 0): -b must be 1", stage="args"
            )
    else:
        max_batch = None
        source = "metadata"
        batched = all(t["shape"] and t["shape"][0] == -1 for t in metadata["inputs"])
        if not batched and batch_size > 1:
            raise BenchError(
                f"model '{model}' has no config and not every input has a leading -1 dim: "
                f"cannot tell its batch dim, so -b must be 1",
                stage="args",
            )
    config_inputs = (config or {}).get("inputs", {})
    unknown = set(shapes) - {t["name"] for t in metadata["inputs"]}
    if unknown:
        raise BenchError(f"--shape names unknown input(s) {sorted(unknown)} of model '{model}'", stage="args")

    plan = ModelPlan(model, version, batch_size, batched, max_batch, source)
    for tensor in metadata["inputs"]:
        name, datatype, dims = tensor["name"], tensor["datatype"], list(tensor["shape"])
        info = config_inputs.get(name, {})
        if info.get("is_shape_tensor"):
            raise BenchError(f"input '{name}' of model '{model}' is a shape tensor: not supported", stage="metadata")
        if datatype not in NUMPY_DTYPES:
            raise BenchError(f"input '{name}' has unknown datatype {datatype!r}", stage="metadata")
        if batched:
            if not dims:
                raise BenchError(f"input '{name}' has an empty shape but the model batches", stage="metadata")
            dims = dims[1:]
        if name in shapes:
            given = shapes[name]
            if len(given) != len(dims):
                what = "dims after the batch dim" if batched else "dims"
                raise BenchError(
                    f"--shape {name}: model shape {tensor['shape']} needs {len(dims)} {what}, got {len(given)}",
                    stage="args",
                )
            for want, got in zip(dims, given):
                if want != -1 and want != got:
                    raise BenchError(
                        f"--shape {name}:{given} does not match model shape {tensor['shape']}", stage="args"
                    )
            dims = list(given)
        full = ([batch_size] if batched else []) + dims
        plan.inputs.append(TensorPlan(name, datatype, full))
    for tensor in metadata["outputs"]:
        dims = list(tensor["shape"])
        if batched and dims:
            dims = [batch_size] + dims[1:]
        plan.outputs.append(TensorPlan(tensor["name"], tensor["datatype"], dims))
    return plan


# --------------------------------------------------------------------------- data
def _random_tensor(rng: np.random.Generator, datatype: str, shape: list[int], string_length: int) -> np.ndarray:
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        letters = np.frombuffer((string.ascii_letters + string.digits).encode(), dtype=np.uint8)
        picks = rng.integers(0, len(letters), size=(count, string_length))
        items = [letters[row].tobytes() for row in picks]
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if datatype == "BF16":
        values = rng.random(size=shape, dtype=np.float32)
        return (values.view(np.uint32) >> 16).astype("<u2")
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind == "f":
        return rng.random(size=shape).astype(dtype)
    return rng.integers(0, 64, size=shape).astype(dtype)


def _zero_tensor(datatype: str, shape: list[int], string_length: int) -> np.ndarray:
    if datatype == "BYTES":
        array = np.empty(int(np.prod(shape)) if shape else 1, dtype=object)
        array[:] = [b"0" * string_length] * array.size
        return array.reshape(shape)
    return np.zeros(shape, dtype=NUMPY_DTYPES[datatype])


def _require_fixed(plan: ModelPlan) -> None:
    for tensor in plan.inputs:
        if any(d < 0 for d in tensor.shape):
            dims = tensor.shape[1:] if plan.batched else tensor.shape
            raise BenchError(
                f"input '{tensor.name}' of model '{plan.model}' has a variable dim {dims}: "
                f"pass --shape {tensor.name}:" + ",".join("N" if d < 0 else str(d) for d in dims),
                stage="args",
            )


def synthetic_requests(plan: ModelPlan, mode: str, string_length: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """One request's tensors for ``zero`` or ``random`` data."""
    _require_fixed(plan)
    rng = np.random.default_rng(seed)
    tensors = {}
    for tensor in plan.inputs:
        if mode == "zero":
            tensors[tensor.name] = _zero_tensor(tensor.datatype, tensor.shape, string_length)
        else:
            tensors[tensor.name] = _random_tensor(rng, tensor.datatype, tensor.shape, string_length)
    return [tensors]


def load_input_file(path: str) -> list[dict[str, Any]]:
    """The ``data`` entries of a perf_analyzer-style JSON input file."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"--input-data {path}: {exc}", stage="args") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise BenchError(
            f'--input-data {path}: expected {{"data": [{{...}}, ...]}} with at least one entry', stage="args"
        )
    for index, entry in enumerate(entries):
        if isinstance(entry, list):
            raise BenchError(
                f"--input-data {path}: entry {index} is a list (multiple streams): not supported", stage="args"
            )
        if not isinstance(entry, dict):
            raise BenchError(f"--input-data {path}: entry {index} must be an object", stage="args")
    return entries


def _from_bytes_framing(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise ValueError("truncated BYTES element length")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ValueError("truncated BYTES element")
        items.append(raw[offset : offset + length])
        offset += length
    return items


def _entry_tensor(value: Any, tensor: TensorPlan, item_dims: list[int], where: str) -> np.ndarray:
    """One entry's value for one input, as an array of the item shape."""
    shape = list(item_dims)
    if isinstance(value, dict):
        if "shape" in value:
            shape = [int(d) for d in value["shape"]]
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if tensor.datatype == "BYTES":
                items = _from_bytes_framing(raw)
                flat = np.empty(len(items), dtype=object)
                flat[:] = items
            else:
                flat = np.frombuffer(raw, dtype=NUMPY_DTYPES[tensor.datatype]).copy()
        elif "content" in value:
            value = value["content"]
            flat = None
        else:
            raise BenchError(f"{where}: expected a list, or an object with 'content' or 'b64'", stage="args")
    else:
        flat = None
    if flat is None:
        if tensor.datatype == "BYTES":
            items = [v.encode() if isinstance(v, str) else bytes(v) for v in np.asarray(value, dtype=object).ravel()]
            flat = np.empty(len(items), dtype=object)
            flat[:] = items
        elif tensor.datatype == "BF16":
            floats = np.asarray(value, dtype=np.float32).ravel()
            flat = (floats.view(np.uint32) >> 16).astype("<u2")
        else:
            flat = np.asarray(value).ravel().astype(NUMPY_DTYPES[tensor.datatype])
    unknown = [i for i, d in enumerate(shape) if d < 0]
    if len(unknown) == 1:
        known = int(np.prod([d for d in shape if d >= 0]))
        if known and flat.size % known == 0:
            shape[unknown[0]] = flat.size // known
    if any(d < 0 for d in shape):
        raise BenchError(f'{where}: shape {shape} has variable dims: add "shape" or --shape', stage="args")
    if int(np.prod(shape)) != flat.size:
        raise BenchError(f"{where}: {flat.size} elements do not fill shape {shape}", stage="args")
    return flat.reshape(shape)


def file_requests(plan: ModelPlan, entries: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """Requests from --input-data entries (each entry is one batch item)."""
    per_request = plan.batch_size if plan.batched else 1
    count = min(MAX_DISTINCT_REQUESTS, max(1, len(entries) // per_request))
    requests = []
    for r in range(count):
        tensors = {}
        for tensor in plan.inputs:
            item_dims = tensor.shape[1:] if plan.batched else tensor.shape
            items = []
            for k in range(per_request):
                index = (r * per_request + k) % len(entries)
                entry = entries[index]
                if tensor.name not in entry:
                    raise BenchError(f"--input-data entry {index} has no input '{tensor.name}'", stage="args")
                items.append(
                    _entry_tensor(entry[tensor.name], tensor, item_dims, f"--input-data entry {index} '{tensor.name}'")
                )
            if any(item.shape != items[0].shape for item in items):
                raise BenchError(f"--input-data: items of one batch differ in shape for '{tensor.name}'", stage="args")
            tensors[tensor.name] = np.stack(items) if plan.batched else items[0]
        requests.append(tensors)
    return requests


def directory_entry(plan: ModelPlan, directory: str) -> dict[str, Any]:
    """perf_analyzer's --data-directory as one --input-data entry: a file per input, named after it.

    BYTES inputs: one element a line; other inputs: the raw little-endian values of one batch item.
    """
    entry: dict[str, Any] = {}
    for tensor in plan.inputs:
        path = Path(directory) / tensor.name
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise BenchError(f"--data-directory {directory}: input '{tensor.name}': {exc}", stage="args") from None
        if tensor.datatype == "BYTES":
            entry[tensor.name] = raw.decode("utf-8", "surrogateescape").splitlines()
            continue
        size = np.dtype(NUMPY_DTYPES[tensor.datatype]).itemsize
        if len(raw) % size:
            raise BenchError(
                f"--data-directory {directory}: input '{tensor.name}' holds {len(raw)} bytes, "
                f"not a whole number of {tensor.datatype} values ({size} bytes each)",
                stage="args",
            )
        entry[tensor.name] = {"b64": base64.b64encode(raw).decode()}
    return entry


def make_requests(
    plan: ModelPlan,
    input_data: str,
    string_length: int,
    string_data: str | None = None,
    data_directory: str | None = None,
) -> list[dict[str, np.ndarray]]:
    """Tensors of each distinct request; fixes the plan's -1 dims from the data.

    ``string_data`` (perf_analyzer's --string-data) fills every BYTES element; ``data_directory``
    reads one file per input (:func:`directory_entry`).
    """
    if data_directory is not None:
        requests = file_requests(plan, [directory_entry(plan, data_directory)])
    elif input_data in ("zero", "random"):
        requests = synthetic_requests(plan, input_data, string_length)
        if string_data is not None:
            for tensors in requests:
                for tensor in plan.inputs:
                    if tensor.datatype == "BYTES":
                        tensors[tensor.name][...] = string_data.encode()
    else:
        requests = file_requests(plan, load_input_file(input_data))
    for tensor in plan.inputs:
        tensor.shape = list(requests[0][tensor.name].shape)
    return requests


# --------------------------------------------------------------------------- encoding
def bytes_tensor(array: np.ndarray) -> bytes:
    """BYTES framing: uint32 LE length then the bytes, per element in row-major order."""
    try:
        from .. import _codec

        return _codec.serialize_bytes_tensor(array)
    except ImportError:
        return b"".join(struct.pack("<I", len(item)) + bytes(item) for item in array.ravel())


def raw_bytes(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return bytes_tensor(array)
    return np.ascontiguousarray(array, dtype=NUMPY_DTYPES[datatype]).tobytes()


def encode_grpc(
    plan: ModelPlan, tensors: dict[str, np.ndarray], shm: Any = None, parameters: dict[str, Any] | None = None
) -> bytes:
    """A ModelInferRequest with every input in raw_input_contents, asking for all outputs.

    ``shm`` (a :class:`fastoip.bench.shm.Placement`): inputs carry region
    parameters instead of data, outputs are listed with theirs.  Uses the
    native codec (``fastoip._codec.encode_infer_request``); falls back to the
    generated protobuf classes when the extension is not built (the request is
    encoded once, so the fallback costs nothing under load).
    """
    from ..types import InferInput, InferRequest, RequestedOutput

    inputs = []
    for t in plan.inputs:
        array = tensors[t.name]
        if shm is not None:
            inputs.append(InferInput(t.name, t.datatype, tuple(array.shape), None, dict(shm.inputs[t.name])))
        else:
            inputs.append(InferInput(t.name, t.datatype, tuple(array.shape), array))
    outputs = [RequestedOutput(name, dict(params)) for name, params in shm.outputs] if shm is not None else []
    request = InferRequest(plan.model, plan.version, parameters=dict(parameters or {}), inputs=inputs, outputs=outputs)
    try:
        from .. import _codec
    except ImportError:
        return _encode_grpc_protobuf(plan, tensors, shm, parameters)
    return _codec.encode_infer_request(request)


def _encode_grpc_protobuf(
    plan: ModelPlan, tensors: dict[str, np.ndarray], shm: Any = None, parameters: dict[str, Any] | None = None
) -> bytes:
    from .._proto import grpc_service_pb2 as pb

    def set_params(target: Any, params: dict) -> None:
        for key, value in params.items():
            if isinstance(value, str):
                target[key].string_param = value
            elif isinstance(value, bool):
                target[key].bool_param = value
            else:
                target[key].int64_param = int(value)

    message = pb.ModelInferRequest(model_name=plan.model, model_version=plan.version)
    set_params(message.parameters, parameters or {})
    for t in plan.inputs:
        item = message.inputs.add()
        item.name = t.name
        item.datatype = t.datatype
        item.shape.extend(tensors[t.name].shape)
        if shm is not None:
            set_params(item.parameters, shm.inputs[t.name])
        else:
            message.raw_input_contents.append(raw_bytes(t.datatype, tensors[t.name]))
    if shm is not None:
        for name, params in shm.outputs:
            output = message.outputs.add()
            output.name = name
            set_params(output.parameters, params)
    return message.SerializeToString()


def _json_values(datatype: str, array: np.ndarray) -> list:
    if datatype == "BYTES":
        try:
            return [bytes(v).decode() for v in array.ravel()]
        except UnicodeDecodeError:
            raise BenchError(
                "BYTES data that is not UTF-8 cannot travel as V2 JSON: use --http-binary", stage="args"
            ) from None
    if datatype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32).ravel().tolist()
    return array.ravel().tolist()


def encode_http(
    plan: ModelPlan,
    tensors: dict[str, np.ndarray],
    host: str,
    binary: bool,
    shm: Any = None,
    parameters: dict[str, Any] | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A complete HTTP/1.1 POST .../infer request (request line, headers, body).

    ``binary``: Triton's binary tensor extension for inputs and outputs
    (``binary_data_size`` per input, ``binary_data_output`` for the reply);
    otherwise plain V2 JSON both ways.  ``shm``: as for :func:`encode_grpc`.
    """
    inputs, blobs = [], []
    for t in plan.inputs:
        array = tensors[t.name]
        entry: dict[str, Any] = {"name": t.name, "shape": list(array.shape), "datatype": t.datatype}
        if shm is not None:
            entry["parameters"] = dict(shm.inputs[t.name])
        elif binary:
            blob = raw_bytes(t.datatype, array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_values(t.datatype, array)
        inputs.append(entry)
    header_doc: dict[str, Any] = {"inputs": inputs}
    if shm is not None and shm.outputs:
        header_doc["outputs"] = [
            {"name": name, "parameters": dict(params) if params else {"binary_data": binary}}
            for name, params in shm.outputs
        ]
    if parameters or binary:
        header_doc["parameters"] = {**(parameters or {}), **({"binary_data_output": True} if binary else {})}
    header = json.dumps(header_doc, separators=(",", ":")).encode()
    body = header + b"".join(blobs)
    binary = binary and bool(blobs)
    path = f"/v2/models/{plan.model}" + (f"/versions/{plan.version}" if plan.version else "") + "/infer"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    if binary:
        lines += ["Content-Type: application/octet-stream", f"Inference-Header-Content-Length: {len(header)}"]
    else:
        lines += ["Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

"""The codec tests' oracle: expected decodings computed from protobuf, normalised forms and wire builders.

Shared by ``unit/test_codec.py`` and ``unit/test_codec_fuzz.py``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from fastoip import _codec as codec
from fastoip.datatypes import NUMPY_DTYPES
from fastoip.errors import CodecError
from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput, UInt64

DATATYPES = list(NUMPY_DTYPES)
FIXED_DATATYPES = [dt for dt in DATATYPES if dt != "BYTES"]
ITEMSIZE = {dt: (0 if dt == "BYTES" else NUMPY_DTYPES[dt].itemsize) for dt in DATATYPES}

#: datatype -> the InferTensorContents field that carries it (None: no typed field)
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
    "FP16": None, "BF16": None,
}
ALL_CONTENTS_FIELDS = [
    "bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
    "fp32_contents", "fp64_contents", "bytes_contents",
]
INT64_MAX = 2**63 - 1


# --------------------------------------------------------------------------- #
# Shared helpers                                                               #
# --------------------------------------------------------------------------- #

class Reject(Exception):
    """The codec must raise CodecError for this message (a semantic rule)."""


def sample_array(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Deterministic test data of any datatype (BYTES: object array of bytes)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape, dtype=np.int64))
    if datatype == "BYTES":
        items = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 6)), dtype=np.uint8))
                 for _ in range(count)]
        arr = np.empty(count, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8).tobytes()
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def raw_bytes(datatype: str, array: np.ndarray) -> bytes:
    """The raw_*_contents form of an array."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=NUMPY_DTYPES[datatype]).tobytes()


def parse_bytes_framing(raw: bytes, count: int) -> list[bytes]:
    """Reference BYTES framing parser (raises Reject on any inconsistency)."""
    items, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(raw):
            raise Reject("BYTES: truncated length prefix")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise Reject("BYTES: element runs past the end")
        items.append(bytes(raw[pos:pos + n]))
        pos += n
    if pos != len(raw):
        raise Reject("BYTES: bytes left over")
    return items


def pb_params(params: Any) -> dict[str, tuple[str, Any]]:
    """A protobuf parameters map, normalized (unset values are dropped, as the codec does)."""
    out = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = norm_value(which, getattr(value, which))
    return out


def norm_value(kind: str, value: Any) -> tuple[str, Any]:
    if kind == "double_param":
        return ("double_param", struct.pack("<d", value))   # NaN compares by its bits
    return (kind, value)


def norm_params(params: dict) -> dict[str, tuple[str, Any]]:
    """Our parameters dict, normalized like pb_params (and checking the Python types)."""
    out = {}
    for key, value in params.items():
        if type(value) is bool:
            out[key] = ("bool_param", value)
        elif type(value) is UInt64:
            out[key] = ("uint64_param", int(value))
        elif type(value) is int:
            out[key] = ("int64_param", value)
        elif type(value) is float:
            out[key] = norm_value("double_param", value)
        elif type(value) is str:
            out[key] = ("string_param", value)
        else:
            raise AssertionError(f"parameter {key!r} has type {type(value).__name__}")
    return out


def norm_array(datatype: str, shape: tuple[int, ...], data: np.ndarray | None) -> Any:
    """Tensor data as a comparable value (NaNs made canonical: typed float contents go through
    Python floats in protobuf, which may quiet a signalling NaN)."""
    if data is None:
        return None
    assert data.shape == tuple(shape), (data.shape, shape)
    if datatype == "BYTES":
        assert data.dtype == object
        values = list(data.reshape(-1))
        assert all(type(v) is bytes for v in values)
        return ("BYTES", tuple(shape), tuple(values))
    assert data.dtype == NUMPY_DTYPES[datatype], (data.dtype, datatype)
    if data.dtype.kind == "f":
        data = data.copy()
        data[np.isnan(data)] = np.nan
    return (datatype, tuple(shape), data.tobytes())


def check_dims(shape: tuple[int, ...], datatype: str) -> int:
    """The element count of a shape, or Reject as the codec does (numpy's limits)."""
    if any(d < 0 for d in shape):
        raise Reject("negative dimension")
    if len(shape) > 64:
        raise Reject("too many dimensions")
    count = 1
    for d in shape:
        if d:
            count *= d
    if count * (ITEMSIZE[datatype] or 8) > INT64_MAX:
        raise Reject("too many elements")
    return 0 if 0 in shape else count


def expected_typed(datatype: str, shape: tuple[int, ...], count: int, contents: Any) -> Any:
    field = CONTENTS_FIELD[datatype]
    if field is None:
        raise Reject(f"{datatype} has no typed contents")
    for other in ALL_CONTENTS_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise Reject("wrong contents field")
    values = list(getattr(contents, field))
    if len(values) != count:
        raise Reject("contents count mismatch")
    if datatype == "BYTES":
        return ("BYTES", tuple(shape), tuple(values))
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BOOL":
        arr = np.array(values, dtype=bool)
    elif dtype.kind in "iu":
        wide = np.int64 if dtype.kind == "i" else np.uint64
        arr = np.array(values, dtype=wide).astype(dtype)   # C-cast truncation, as the codec
    else:
        arr = np.array(values, dtype=dtype)
    return norm_array(datatype, shape, arr.reshape(shape))


def expected_raw(datatype: str, shape: tuple[int, ...], count: int, raw: bytes) -> Any:
    if datatype == "BYTES":
        if count > len(raw) // 4:
            raise Reject("BYTES count larger than the data")
        arr = np.empty(count, dtype=object)
        arr[:] = parse_bytes_framing(raw, count)
        return norm_array(datatype, shape, arr.reshape(shape))
    if count * ITEMSIZE[datatype] != len(raw):
        raise Reject("raw size mismatch")
    return norm_array(datatype, shape, np.frombuffer(raw, NUMPY_DTYPES[datatype]).reshape(shape))


def _tensor_header(t: Any) -> tuple[str, str, tuple[int, ...], dict, bool, int]:
    if t.datatype not in NUMPY_DTYPES:
        raise Reject("unknown datatype")
    shape = tuple(t.shape)
    count = check_dims(shape, t.datatype)
    params = pb_params(t.parameters)
    return t.name, t.datatype, shape, params, "shared_memory_region" in params, count


def expected_request(m: Any) -> dict:
    """What decode_infer_request must return for the protobuf-parsed request ``m`` (normalized),
    or Reject when one of the codec's semantic rules fails."""
    raw = list(m.raw_input_contents)
    headers = [_tensor_header(t) for t in m.inputs]
    needing = 0
    for t, (_, _, _, _, shm, _) in zip(m.inputs, headers, strict=False):
        has_contents = t.HasField("contents")
        if shm and has_contents:
            raise Reject("shared-memory input with contents")
        if not shm and has_contents and raw:
            raise Reject("contents and raw mixed")
        if not shm and not has_contents:
            needing += 1
    if len(raw) != needing:
        raise Reject("raw count")
    inputs, j = [], 0
    for t, (name, datatype, shape, params, shm, count) in zip(m.inputs, headers, strict=False):
        if shm:
            data = None
        elif t.HasField("contents"):
            data = expected_typed(datatype, shape, count, t.contents)
        else:
            data = expected_raw(datatype, shape, count, raw[j])
            j += 1
        inputs.append((name, datatype, shape, params, data))
    return {
        "model_name": m.model_name,
        "model_version": m.model_version,
        "id": m.id,
        "parameters": pb_params(m.parameters),
        "inputs": inputs,
        "outputs": [(o.name, pb_params(o.parameters)) for o in m.outputs],
    }


def expected_response(m: Any) -> dict:
    """What decode_infer_response must return for the protobuf-parsed response ``m``."""
    raw = list(m.raw_output_contents)
    headers = [_tensor_header(t) for t in m.outputs]
    if raw and len(raw) != len(m.outputs):
        raise Reject("raw count")
    outputs = []
    for i, (t, (name, datatype, shape, params, shm, count)) in enumerate(zip(m.outputs, headers, strict=False)):
        has_contents = t.HasField("contents")
        if raw:
            if has_contents:
                raise Reject("contents and raw mixed")
            if (shm or count != 0) and not raw[i]:
                data = None  # an empty entry for an output with elements: it went to shared memory
            else:
                data = expected_raw(datatype, shape, count, raw[i])
        elif has_contents:
            data = expected_typed(datatype, shape, count, t.contents)
        elif shm:
            data = None
        elif count == 0:
            data = norm_array(datatype, shape, np.empty(shape, NUMPY_DTYPES[datatype]))
        else:
            raise Reject("output without data")
        outputs.append((name, datatype, shape, params, data))
    return {
        "model_name": m.model_name,
        "model_version": m.model_version,
        "id": m.id,
        "parameters": pb_params(m.parameters),
        "outputs": outputs,
    }


def normalize_request(req: InferRequest) -> dict:
    assert type(req) is InferRequest
    for t in req.inputs:
        assert type(t) is InferInput and type(t.shape) is tuple
        assert all(type(d) is int for d in t.shape)
    for o in req.outputs:
        assert type(o) is RequestedOutput
    return {
        "model_name": req.model_name,
        "model_version": req.model_version,
        "id": req.id,
        "parameters": norm_params(req.parameters),
        "inputs": [(t.name, t.datatype, t.shape, norm_params(t.parameters),
                    norm_array(t.datatype, t.shape, t.data)) for t in req.inputs],
        "outputs": [(o.name, norm_params(o.parameters)) for o in req.outputs],
    }


def normalize_response(resp: InferResponse) -> dict:
    assert type(resp) is InferResponse
    for t in resp.outputs:
        assert type(t) is InferOutput and type(t.shape) is tuple
    return {
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "id": resp.id,
        "parameters": norm_params(resp.parameters),
        "outputs": [(t.name, t.datatype, t.shape, norm_params(t.parameters),
                     norm_array(t.datatype, t.shape, t.data)) for t in resp.outputs],
    }


def pb_parse(cls: Any, data: bytes) -> Any:
    m = cls()
    m.ParseFromString(data)
    return m


# -- wire builders for messages protobuf cannot produce (unpacked, duplicated, malformed) -- #

def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(field: int, wt: int) -> bytes:
    return varint((field << 3) | wt)


def ld(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def vfield(field: int, value: int) -> bytes:
    return tag(field, 0) + varint(value)


def simple_request_bytes() -> bytes:
    """The `simple` example request as tritonclient would send it, with a few parameters."""
    m = pb.ModelInferRequest(model_name="simple", model_version="1", id="req-7")
    m.parameters["priority"].uint64_param = 3
    m.parameters["sequence_start"].bool_param = True
    m.parameters["timeout"].int64_param = -5
    m.parameters["ratio"].double_param = 0.25
    m.parameters["tag"].string_param = "héllo"
    for i in range(2):
        t = m.inputs.add(name=f"INPUT{i}", datatype="INT32", shape=[1, 16])
        t.parameters["binary_data_size"].int64_param = 64
        m.raw_input_contents.append(np.arange(16, dtype="<i4").tobytes())
    o = m.outputs.add(name="OUTPUT0")
    o.parameters["binary_data"].bool_param = True
    m.outputs.add(name="OUTPUT1")
    return m.SerializeToString()


def assert_decodes_like_protobuf(data: bytes) -> None:
    """Decode ``data`` with both and require agreement (or CodecError for a rejected message)."""
    m = pb_parse(pb.ModelInferRequest, data)
    try:
        expected = expected_request(m)
    except Reject:
        with pytest.raises(CodecError):
            codec.decode_infer_request(data)
        return
    assert normalize_request(codec.decode_infer_request(data)) == expected


# --------------------------------------------------------------------------- #

"""Differential fuzzing of the native codec against protobuf (tritonclient's service_pb2).

(a) Random valid messages: what protobuf builds we decode to the same content,
    and what we encode protobuf parses to the same content.
(b) Random bytes and mutated/truncated valid messages: the codec either raises
    CodecError or returns exactly what protobuf's parse says, and it raises
    CodecError whenever protobuf raises DecodeError.  Where protobuf accepts and
    we raise, the reason must be one of the documented ones:

    * a semantic rule protobuf does not check (``Reject`` from
      ``expected_request``/``expected_response``: sizes, datatypes, shapes, ...);
    * a protobuf group (wire types 3/4), which protobuf skips as unknown and we refuse;
    * a varint whose 10th byte is above 1 (over 64 bits), which protobuf truncates.

    The last two are found by ``wire_leniency`` below, a small schema-aware walk
    of the bytes that looks exactly where both parsers look.
Never any other exception, never a crash.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

codec = pytest.importorskip(
    "fastoip._codec", reason="the native codec is not built (setup.py build_ext --inplace)"
)
from google.protobuf.message import DecodeError  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from codec_oracle import (  # noqa: E402
    CONTENTS_FIELD,
    DATATYPES,
    ITEMSIZE,
    NUMPY_DTYPES,
    Reject,
    expected_request,
    expected_response,
    norm_params,
    normalize_request,
    normalize_response,
    pb_params,
    raw_bytes,
)
from fastoip.errors import CodecError  # noqa: E402
from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput, UInt64  # noqa: E402

#: FASTOIP_FUZZ_EXAMPLES=20000 for a long run; 300 by default.
FUZZ = settings(max_examples=int(os.environ.get("FASTOIP_FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --------------------------------------------------------------------------- #
# Strategies                                                                   #
# --------------------------------------------------------------------------- #

names = st.text(max_size=10)
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)

param_values = st.one_of(
    st.booleans().map(lambda v: ("bool_param", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int64_param", v)),
    st.integers(0, 2**64 - 1).map(lambda v: ("uint64_param", v)),
    st.floats().map(lambda v: ("double_param", v)),
    st.text(max_size=8).map(lambda v: ("string_param", v)),
)
param_maps = st.dictionaries(st.text(max_size=6), param_values, max_size=3)

TYPED_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}


def set_pb_params(pbmap: Any, params: dict) -> None:
    for key, (kind, value) in params.items():
        setattr(pbmap[key], kind, value)


def py_params(params: dict) -> dict:
    """The fastoip form of generated parameters."""
    out = {}
    for key, (kind, value) in params.items():
        out[key] = UInt64(value) if kind == "uint64_param" else value
    return out


@st.composite
def tensor_data(draw: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        return arr.reshape(shape)
    raw = draw(st.binary(min_size=count * ITEMSIZE[datatype], max_size=count * ITEMSIZE[datatype]))
    arr = np.frombuffer(raw, dtype=NUMPY_DTYPES[datatype]).reshape(shape)
    if datatype == "BOOL":
        arr = arr.view(np.uint8) & 1   # valid bools only
        arr = arr.astype(bool)
    return arr


@st.composite
def request_messages(draw: Any) -> Any:
    """A random ModelInferRequest as a client could send it (raw or typed contents)."""
    typed = draw(st.booleans())
    m = pb.ModelInferRequest(model_name=draw(names), model_version=draw(names), id=draw(names))
    set_pb_params(m.parameters, draw(param_maps))
    dts = [dt for dt in DATATYPES if CONTENTS_FIELD[dt]] if typed else DATATYPES
    for _ in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(dts))
        shape = draw(shapes)
        t = m.inputs.add(name=draw(names), datatype=datatype, shape=list(shape))
        params = draw(param_maps)
        shm = draw(st.integers(0, 5)) == 0
        if shm:
            params["shared_memory_region"] = ("string_param", "region")
        set_pb_params(t.parameters, params)
        if shm:
            continue
        count = int(np.prod(shape, dtype=np.int64))
        if typed:
            field = CONTENTS_FIELD[datatype]
            values = draw(st.lists(TYPED_VALUES[field], min_size=count, max_size=count))
            t.contents.SetInParent()
            getattr(t.contents, field).extend(values)
        else:
            m.raw_input_contents.append(raw_bytes(datatype, draw(tensor_data(datatype, shape))))
    for _ in range(draw(st.integers(0, 2))):
        o = m.outputs.add(name=draw(names))
        set_pb_params(o.parameters, draw(param_maps))
    return m


@st.composite
def responses(draw: Any) -> InferResponse:
    """A random InferResponse as the server would build it."""
    outputs = []
    for _ in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(DATATYPES))
        shape = draw(shapes)
        params = draw(param_maps)
        if draw(st.integers(0, 5)) == 0:
            params["shared_memory_region"] = ("string_param", "out")
            data = None
        else:
            data = draw(tensor_data(datatype, shape))
        outputs.append(InferOutput(draw(names), datatype, shape, data, py_params(params)))
    return InferResponse(draw(names), draw(names), draw(names), py_params(draw(param_maps)), outputs)


@st.composite
def requests(draw: Any) -> InferRequest:
    """A random InferRequest (what the bench client encodes)."""
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(DATATYPES))
        shape = draw(shapes)
        params = draw(param_maps)
        if draw(st.integers(0, 5)) == 0:
            params["shared_memory_region"] = ("string_param", "in")
            data = None
        else:
            data = draw(tensor_data(datatype, shape))
        inputs.append(InferInput(draw(names), datatype, shape, data, py_params(params)))
    outputs = [RequestedOutput(draw(names), py_params(draw(param_maps)))
               for _ in range(draw(st.integers(0, 2)))]
    return InferRequest(draw(names), draw(names), draw(names), py_params(draw(param_maps)), inputs, outputs)


# --------------------------------------------------------------------------- #
# The differential check                                                       #
# --------------------------------------------------------------------------- #

PARAM: dict = {}
MAP_ENTRY = {2: PARAM}
CONTENTS = {f: "packed" for f in (1, 2, 3, 4, 5)}
TENSOR = {3: "packed", 4: MAP_ENTRY, 5: CONTENTS}
REQUEST_SCHEMA = {4: MAP_ENTRY, 5: TENSOR, 6: {2: MAP_ENTRY}}
RESPONSE_SCHEMA = {4: MAP_ENTRY, 5: TENSOR}


def _varint(buf: bytes, pos: int) -> tuple[int, int, bool]:
    """(value, new position, overflows 64 bits) of a varint protobuf accepted."""
    value, shift, overflow = 0, 0, False
    while True:
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:
            overflow = True
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos, overflow
        shift += 7


def wire_leniency(buf: bytes, schema: dict) -> bool:
    """True if ``buf`` (which protobuf parsed) holds a group or an over-64-bit varint in a
    place both parsers read: the two things protobuf lets through and the codec refuses."""
    try:
        pos = 0
        while pos < len(buf):
            tag, pos, overflow = _varint(buf, pos)
            field, wt = tag >> 3, tag & 7
            if overflow or wt in (3, 4):
                return True
            if wt == 0:
                _, pos, overflow = _varint(buf, pos)
                if overflow:
                    return True
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            elif wt == 2:
                n, pos, overflow = _varint(buf, pos)
                payload, pos = buf[pos:pos + n], pos + n
                sub = schema.get(field)
                if sub == "packed":
                    p = 0
                    while p < len(payload):
                        _, p, overflow = _varint(payload, p)
                        if overflow:
                            return True
                elif isinstance(sub, dict) and wire_leniency(payload, sub):
                    return True
        return False
    except IndexError:   # pragma: no cover - protobuf accepted it, so it is well-formed
        return False


def check_against_protobuf(data: bytes, response: bool = False) -> dict | None:
    """The differential rule for one input; returns the decoded (normalized) result, if any."""
    cls = pb.ModelInferResponse if response else pb.ModelInferRequest
    decode = codec.decode_infer_response if response else codec.decode_infer_request
    m = cls()
    try:
        m.ParseFromString(data)
    except DecodeError:
        with pytest.raises(CodecError):
            decode(data)
        return None
    try:
        expected = expected_response(m) if response else expected_request(m)
    except Reject:
        with pytest.raises(CodecError):
            decode(data)
        return None
    if wire_leniency(data, RESPONSE_SCHEMA if response else REQUEST_SCHEMA):
        with pytest.raises(CodecError, match="groups are not supported|malformed varint"):
            decode(data)
        return None
    result = decode(data)
    got = normalize_response(result) if response else normalize_request(result)
    assert got == expected
    return got


# --------------------------------------------------------------------------- #
# (a) valid messages                                                           #
# --------------------------------------------------------------------------- #

@FUZZ
@given(request_messages())
def test_decode_agrees_with_protobuf(m: Any) -> None:
    data = m.SerializeToString()
    expected = expected_request(m)            # these messages are valid: no Reject
    assert normalize_request(codec.decode_infer_request(data)) == expected
    assert normalize_request(codec.decode_infer_request(bytearray(data))) == expected
    # and what we write for the decoded request is the same message again
    again = pb.ModelInferRequest.FromString(codec.encode_infer_request(codec.decode_infer_request(data)))
    if not any(t.HasField("contents") for t in m.inputs):
        assert expected_request(again) == expected


@FUZZ
@given(responses())
def test_encode_response_agrees_with_protobuf(resp: InferResponse) -> None:
    data = codec.encode_infer_response(resp)
    m = pb.ModelInferResponse.FromString(data)
    assert (m.model_name, m.model_version, m.id) == (resp.model_name, resp.model_version, resp.id)
    assert pb_params(m.parameters) == norm_params(resp.parameters)
    assert len(m.outputs) == len(resp.outputs) == len(m.raw_output_contents)
    for out, t, raw in zip(resp.outputs, m.outputs, m.raw_output_contents, strict=False):
        assert (t.name, t.datatype, tuple(t.shape)) == (out.name, out.datatype, out.shape)
        assert pb_params(t.parameters) == norm_params(out.parameters)
        assert not t.HasField("contents")
        assert raw == (b"" if out.data is None else raw_bytes(out.datatype, out.data))
    # protobuf writes the same bytes (map order is only defined for maps of one entry)
    if all(len(p) <= 1 for p in [resp.parameters] + [o.parameters for o in resp.outputs]):
        assert m.SerializeToString() == data
    # and we read back what we wrote
    assert normalize_response(codec.decode_infer_response(data)) == normalize_response(resp)
    assert normalize_response(codec.decode_infer_response(data)) == expected_response(m)
    # wrapped in a stream response
    s = pb.ModelStreamInferResponse.FromString(codec.encode_stream_response(resp, "e"))
    assert s.error_message == "e" and s.infer_response.SerializeToString() == m.SerializeToString()


@FUZZ
@given(requests())
def test_encode_request_agrees_with_protobuf(req: InferRequest) -> None:
    data = codec.encode_infer_request(req)
    m = pb.ModelInferRequest.FromString(data)
    assert expected_request(m) == normalize_request(req)
    assert normalize_request(codec.decode_infer_request(data)) == normalize_request(req)
    with_data = [t for t in req.inputs if t.data is not None]
    assert list(m.raw_input_contents) == [raw_bytes(t.datatype, t.data) for t in with_data]


# --------------------------------------------------------------------------- #
# (b) random and damaged bytes                                                 #
# --------------------------------------------------------------------------- #

@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    check_against_protobuf(data)
    check_against_protobuf(data, response=True)


def _field(field: int, wt: int, payload: bytes) -> bytes:
    from codec_oracle import ld, tag, varint
    if wt == 2:
        return ld(field, payload)
    if wt == 0:
        return tag(field, 0) + varint(int.from_bytes(payload[:8].ljust(8, b"\0"), "little"))
    if wt == 1:
        return tag(field, 1) + payload[:8].ljust(8, b"\0")
    if wt == 5:
        return tag(field, 5) + payload[:4].ljust(4, b"\0")
    return tag(field, wt) + payload     # groups and invalid wire types, raw


@st.composite
def wire_soup(draw: Any, depth: int = 2) -> bytes:
    """Random but mostly well-formed wire data over the message's field numbers."""
    from codec_oracle import tag
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        field = draw(st.integers(1, 9))
        wt = draw(st.sampled_from([0, 0, 1, 2, 2, 2, 2, 5, 3, 4, 6, "group", "overflow"]))
        if wt == "group":        # a well-formed group: protobuf skips it, we refuse it
            parts.append(tag(field, 3) + draw(wire_soup(0)) + tag(field, 4))
            continue
        if wt == "overflow":     # a 10-byte varint over 64 bits: protobuf truncates it
            parts.append(tag(field, 0) + b"\xff" * 9 + bytes([draw(st.integers(2, 0x7F))]))
            continue
        if wt == 2 and depth and draw(st.booleans()):
            payload = draw(wire_soup(depth - 1))
        elif wt == 2 and draw(st.booleans()):
            payload = draw(st.sampled_from([b"INT32", b"BYTES", b"FP16", b"BOOL", b"x"]))
        else:
            payload = draw(st.binary(max_size=12))
        parts.append(_field(field, wt, payload))
    return b"".join(parts)


@FUZZ
@given(wire_soup())
def test_wire_soup(data: bytes) -> None:
    check_against_protobuf(data)
    check_against_protobuf(data, response=True)


mutations = st.lists(st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "truncate", "duplicate"]),
    st.integers(0, 10**6), st.integers(0, 10**6), st.binary(min_size=1, max_size=4)), min_size=1, max_size=2)


def mutate(data: bytes, ops: list) -> bytes:
    buf = bytearray(data)
    for op, a, b, extra in ops:
        n = len(buf)
        i = a % (n + 1)
        if op == "flip" and n:
            buf[a % n] ^= 1 << (b % 8)
        elif op == "set" and n:
            buf[a % n] = extra[0]
        elif op == "insert":
            buf[i:i] = extra
        elif op == "delete" and n:
            del buf[a % n: a % n + 1 + b % 4]
        elif op == "truncate":
            del buf[i:]
        elif op == "duplicate" and n:
            j = min(n, i + 1 + b % 16)
            buf[j:j] = buf[i:j]
    return bytes(buf)


@FUZZ
@given(request_messages(), mutations)
def test_mutated_requests(m: Any, ops: list) -> None:
    check_against_protobuf(mutate(m.SerializeToString(), ops))


@FUZZ
@given(responses(), mutations)
def test_mutated_responses(resp: InferResponse, ops: list) -> None:
    check_against_protobuf(mutate(codec.encode_infer_response(resp), ops), response=True)


def _semantic_mutation(draw: Any, m: Any) -> None:
    """Damage a valid request at the protobuf level (only the codec's own rules can catch it)."""
    op = draw(st.sampled_from(["datatype", "shape", "rank", "raw_drop", "raw_add", "raw_resize",
                               "contents", "shm", "wrong_field"]))
    if op == "datatype" and m.inputs:
        t = m.inputs[draw(st.integers(0, len(m.inputs) - 1))]
        t.datatype = draw(st.sampled_from(DATATYPES + ["", "INT128", "fp32", "FLOAT"]))
    elif op == "shape" and m.inputs:
        t = m.inputs[draw(st.integers(0, len(m.inputs) - 1))]
        t.shape.append(draw(st.sampled_from([-1, 0, 2, 2**31, 2**60, 2**61, 2**62, 2**63 - 1, -(2**63)])))
    elif op == "rank" and m.inputs:
        t = m.inputs[draw(st.integers(0, len(m.inputs) - 1))]
        t.shape.extend([1] * draw(st.integers(60, 70)))
    elif op == "raw_drop" and m.raw_input_contents:
        del m.raw_input_contents[draw(st.integers(0, len(m.raw_input_contents) - 1))]
    elif op == "raw_add":
        m.raw_input_contents.append(draw(st.binary(max_size=12)))
    elif op == "raw_resize" and m.raw_input_contents:
        i = draw(st.integers(0, len(m.raw_input_contents) - 1))
        m.raw_input_contents[i] = m.raw_input_contents[i] + draw(st.binary(min_size=1, max_size=3))
    elif op in ("contents", "wrong_field") and m.inputs:
        t = m.inputs[draw(st.integers(0, len(m.inputs) - 1))]
        field = draw(st.sampled_from(sorted(TYPED_VALUES)))
        getattr(t.contents, field).extend(draw(st.lists(TYPED_VALUES[field], max_size=3)))
    elif op == "shm" and m.inputs:
        t = m.inputs[draw(st.integers(0, len(m.inputs) - 1))]
        t.parameters["shared_memory_region"].string_param = "r"


@FUZZ
@given(request_messages(), st.data())
def test_semantically_damaged_requests(m: Any, data: Any) -> None:
    for _ in range(data.draw(st.integers(1, 2))):
        _semantic_mutation(data.draw, m)
    check_against_protobuf(m.SerializeToString())


@FUZZ
@given(request_messages(), st.integers(0, 10**6))
def test_truncated_requests(m: Any, cut: int) -> None:
    data = m.SerializeToString()
    check_against_protobuf(data[: cut % (len(data) + 1)])


@FUZZ
@given(st.binary(max_size=64), st.integers(-2, 20))
def test_deserialize_bytes_tensor_random(data: bytes, count: int) -> None:
    try:
        arr = codec.deserialize_bytes_tensor(data, count)
    except CodecError:
        return
    assert arr.dtype == object and arr.shape == (count,)
    assert codec.serialize_bytes_tensor(arr) == data


def test_leniency_walker_finds_the_documented_differences() -> None:
    from codec_oracle import ld, tag, varint
    overflow = tag(9, 0) + b"\xff" * 9 + b"\x02"
    assert wire_leniency(overflow, REQUEST_SCHEMA)
    assert wire_leniency(ld(4, ld(2, overflow)), REQUEST_SCHEMA)
    assert wire_leniency(ld(5, ld(3, b"\xff" * 9 + b"\x7f")), REQUEST_SCHEMA)
    assert wire_leniency(b"\x0b\x0c", REQUEST_SCHEMA)
    assert not wire_leniency(ld(7, b"\x0b\x0c" + b"\xff" * 9 + b"\x02"), REQUEST_SCHEMA)   # raw bytes
    assert not wire_leniency(ld(9, b"\x0b\x0c"), REQUEST_SCHEMA)                          # unknown field
    for data in (overflow, b"\x0b\x0c", ld(4, ld(1, b"k") + b"\x0b\x0c" + ld(2, varint(0)))):
        check_against_protobuf(data)

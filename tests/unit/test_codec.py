"""Unit tests of the native codec (fastoip._codec) against tritonclient's protobuf messages.

The reference for every wire question is protobuf itself: ``service_pb2`` from
tritonclient parses what we write and writes what we parse.  The oracle (expected
decodings, normalised forms, wire builders) lives in ``helpers/codec_oracle.py``, shared with the fuzz tests.
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

import numpy as np
import pytest

codec = pytest.importorskip(
    "fastoip._codec", reason="the native codec is not built (setup.py build_ext --inplace)"
)
from google.protobuf.message import DecodeError  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from codec_oracle import (  # noqa: E402
    CONTENTS_FIELD,
    DATATYPES,
    Reject,
    assert_decodes_like_protobuf,
    expected_request,
    expected_response,
    ld,
    norm_params,
    normalize_request,
    normalize_response,
    pb_parse,
    raw_bytes,
    sample_array,
    simple_request_bytes,
    tag,
    varint,
    vfield,
)
from fastoip.datatypes import NUMPY_DTYPES, bf16_bits_from_float32, float32_from_bf16_bits  # noqa: E402
from fastoip.errors import CodecError  # noqa: E402
from fastoip.types import (  # noqa: E402
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    UInt64,
)

# Decoding                                                                     #
# --------------------------------------------------------------------------- #

def test_decode_simple_request() -> None:
    data = simple_request_bytes()
    req = codec.decode_infer_request(data)
    assert (req.model_name, req.model_version, req.id) == ("simple", "1", "req-7")
    assert req.parameters == {"priority": 3, "sequence_start": True, "timeout": -5,
                              "ratio": 0.25, "tag": "héllo"}
    assert type(req.parameters["priority"]) is UInt64
    assert type(req.parameters["sequence_start"]) is bool
    assert type(req.parameters["timeout"]) is int
    assert [t.name for t in req.inputs] == ["INPUT0", "INPUT1"]
    for t in req.inputs:
        assert t.datatype == "INT32" and t.shape == (1, 16)
        assert t.parameters == {"binary_data_size": 64}
        np.testing.assert_array_equal(t.data, np.arange(16, dtype=np.int32).reshape(1, 16))
    assert [(o.name, o.parameters) for o in req.outputs] == [
        ("OUTPUT0", {"binary_data": True}), ("OUTPUT1", {})]
    assert_decodes_like_protobuf(data)


def test_raw_inputs_are_zero_copy_read_only_views() -> None:
    data = simple_request_bytes()
    req = codec.decode_infer_request(data)
    whole = np.frombuffer(data, dtype=np.uint8)
    for t in req.inputs:
        arr = t.data
        assert not arr.flags.owndata
        assert not arr.flags.writeable
        assert np.shares_memory(arr, whole)
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert base is data
        with pytest.raises(ValueError):
            arr[0, 0] = 1
    # The two inputs are views on different bytes of the message.
    assert not np.shares_memory(req.inputs[0].data, req.inputs[1].data)


@pytest.mark.parametrize("wrap", [bytearray, memoryview, lambda b: memoryview(bytearray(b))])
def test_decode_accepts_any_buffer_and_stays_read_only(wrap: Any) -> None:
    data = simple_request_bytes()
    buf = wrap(data)
    req = codec.decode_infer_request(buf)
    assert normalize_request(req) == normalize_request(codec.decode_infer_request(data))
    arr = req.inputs[0].data
    assert not arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(buf, dtype=np.uint8))
    with pytest.raises(ValueError):
        arr.flags.writeable = True
    assert normalize_request(codec.decode_infer_request(np.frombuffer(data, np.uint8))) \
        == normalize_request(req)


def test_views_on_a_bytearray_pin_it() -> None:
    """While a view lives, the bytearray under it cannot be resized (no dangling pointer)."""
    buf = bytearray(simple_request_bytes())
    req = codec.decode_infer_request(buf)
    with pytest.raises(BufferError):
        buf.clear()
    with pytest.raises(BufferError):
        buf.extend(b"\x00" * 100_000)
    np.testing.assert_array_equal(req.inputs[0].data, np.arange(16, dtype=np.int32).reshape(1, 16))
    del req
    import gc
    gc.collect()
    buf.clear()     # all views gone: free to resize again


def test_decode_accepts_memoryview_of_other_formats() -> None:
    data = simple_request_bytes()
    framed = data + ld(15, b"\x00" * (-(len(data) + 2) % 4))   # pad with an unknown field
    as_u32 = memoryview(np.frombuffer(framed, dtype="<u4").copy())
    assert as_u32.format != "B"
    req = codec.decode_infer_request(as_u32)
    assert normalize_request(req) == normalize_request(codec.decode_infer_request(data))


def test_decode_non_contiguous_buffer_rejected() -> None:
    data = simple_request_bytes()
    strided = memoryview(np.frombuffer(data * 2, dtype=np.uint8)[::2])
    with pytest.raises(CodecError, match="contiguous"):
        codec.decode_infer_request(strided)


def _request(inputs: list[InferInput], outputs: list[RequestedOutput] | None = None,
             **kw: Any) -> InferRequest:
    return InferRequest(kw.pop("model_name", "m"), kw.pop("model_version", ""), kw.pop("id", ""),
                        kw.pop("parameters", None), inputs, outputs)


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("shape", [(2, 3), (0,), (), (1, 1, 5)])
def test_request_round_trip_every_datatype(datatype: str, shape: tuple[int, ...]) -> None:
    array = sample_array(datatype, shape, seed=len(shape))
    req = _request([InferInput("IN", datatype, shape, array, {"k": "v"})],
                   [RequestedOutput("OUT", {"classification": 2})], id="x")
    data = codec.encode_infer_request(req)

    # protobuf reads what we wrote ...
    m = pb_parse(pb.ModelInferRequest, data)
    assert m.inputs[0].datatype == datatype and tuple(m.inputs[0].shape) == shape
    assert list(m.raw_input_contents) == [raw_bytes(datatype, array)]
    assert m.outputs[0].name == "OUT" and m.outputs[0].parameters["classification"].int64_param == 2
    # ... and writes the same bytes for the same content
    assert m.SerializeToString() == data

    # we read it back bit-exactly
    back = codec.decode_infer_request(data)
    assert normalize_request(back) == normalize_request(req)
    assert normalize_request(back) == expected_request(m)
    if datatype != "BYTES":
        assert back.inputs[0].data.tobytes() == np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_response_round_trip_every_datatype(datatype: str) -> None:
    array = sample_array(datatype, (3, 2), seed=7)
    resp = InferResponse("m", "2", "id-1", {"p": UInt64(2**64 - 1)},
                         [InferOutput("OUT", datatype, (3, 2), array, {"q": 1.5})])
    data = codec.encode_infer_response(resp)

    m = pb.ModelInferResponse(model_name="m", model_version="2", id="id-1")
    m.parameters["p"].uint64_param = 2**64 - 1
    out = m.outputs.add(name="OUT", datatype=datatype, shape=[3, 2])
    out.parameters["q"].double_param = 1.5
    m.raw_output_contents.append(raw_bytes(datatype, array))
    assert data == m.SerializeToString()

    back = codec.decode_infer_response(data)
    assert normalize_response(back) == normalize_response(resp)
    assert normalize_response(back) == expected_response(pb_parse(pb.ModelInferResponse, data))
    view = back.outputs[0].data
    if datatype != "BYTES":
        assert not view.flags.writeable and np.shares_memory(view, np.frombuffer(data, np.uint8))


@pytest.mark.parametrize("datatype", [dt for dt in DATATYPES if CONTENTS_FIELD[dt]])
def test_typed_contents_every_datatype(datatype: str) -> None:
    field = CONTENTS_FIELD[datatype]
    if datatype == "BYTES":
        values: list[Any] = [b"", b"\x00", b"abc"]
    elif datatype == "BOOL":
        values = [True, False, True]
    elif datatype.startswith("FP"):
        values = [1.5, -0.0, float("inf")]
    elif datatype.startswith("UINT"):
        values = [0, 1, np.iinfo(NUMPY_DTYPES[datatype]).max]
    else:
        values = [np.iinfo(NUMPY_DTYPES[datatype]).min, -1, np.iinfo(NUMPY_DTYPES[datatype]).max]
    m = pb.ModelInferRequest(model_name="m")
    t = m.inputs.add(name="IN", datatype=datatype, shape=[1, 3])
    getattr(t.contents, field).extend(values)
    req = codec.decode_infer_request(m.SerializeToString())
    data = req.inputs[0].data
    assert data.shape == (1, 3) and data.dtype == NUMPY_DTYPES[datatype]
    assert data.reshape(-1).tolist() == values
    assert normalize_request(req) == expected_request(m)


def test_typed_contents_unpacked_and_merged() -> None:
    # int_contents unpacked (one tag per value), then a second `contents` occurrence:
    # protobuf merges them, and so must we.
    contents1 = vfield(2, 1) + vfield(2, (1 << 64) - 1)          # 1, -1 (unpacked)
    contents2 = ld(2, varint(7) + varint(1 << 33))              # 7, 2**33 -> 0 as int32 (packed)
    tensor = ld(1, b"IN") + ld(2, b"INT32") + vfield(3, 2) + vfield(3, 2) + ld(5, contents1) \
        + ld(5, contents2)
    data = ld(1, b"m") + ld(5, tensor)
    m = pb_parse(pb.ModelInferRequest, data)
    assert list(m.inputs[0].contents.int_contents) == [1, -1, 7, 0]
    req = codec.decode_infer_request(data)
    assert req.inputs[0].shape == (2, 2)
    assert req.inputs[0].data.tolist() == [[1, -1], [7, 0]]
    assert normalize_request(req) == expected_request(m)


def test_typed_contents_float_packed_and_unpacked() -> None:
    fp32 = tag(6, 5) + struct.pack("<f", 1.5) + ld(6, struct.pack("<2f", -2.0, 3.25))
    fp64 = tag(7, 1) + struct.pack("<d", 0.1) + ld(7, struct.pack("<d", -0.0))
    data = ld(5, ld(1, b"A") + ld(2, b"FP32") + ld(3, varint(3)) + ld(5, fp32)) \
        + ld(5, ld(1, b"B") + ld(2, b"FP64") + ld(3, varint(2)) + ld(5, fp64))
    req = codec.decode_infer_request(data)
    assert req.inputs[0].data.tolist() == [1.5, -2.0, 3.25]
    assert req.inputs[1].data.tolist() == [0.1, -0.0]
    assert math.copysign(1.0, req.inputs[1].data[1]) == -1.0
    assert_decodes_like_protobuf(data)


def test_narrow_ints_from_int_contents_truncate_like_a_c_cast() -> None:
    m = pb.ModelInferRequest()
    t = m.inputs.add(name="I8", datatype="INT8", shape=[3])
    t.contents.int_contents.extend([127, 128, -129])
    t = m.inputs.add(name="U16", datatype="UINT16", shape=[2])
    t.contents.uint_contents.extend([65535, 65536])
    req = codec.decode_infer_request(m.SerializeToString())
    assert req.inputs[0].data.tolist() == [127, -128, 127]
    assert req.inputs[1].data.tolist() == [65535, 0]


def test_bytes_elements_empty_nul_and_non_utf8_bit_exact() -> None:
    values = [b"", b"\x00", b"\x00\x00abc\x00", b"\xff\xfe\xfd", "héllo".encode(), b"x" * 300]
    array = np.empty(len(values), dtype=object)
    array[:] = values
    req = _request([InferInput("B", "BYTES", (2, 3), array.reshape(2, 3))])
    data = codec.encode_infer_request(req)
    assert pb_parse(pb.ModelInferRequest, data).raw_input_contents[0] == raw_bytes("BYTES", array)
    back = codec.decode_infer_request(data).inputs[0].data
    assert back.dtype == object and back.shape == (2, 3)
    assert list(back.reshape(-1)) == values
    assert all(type(v) is bytes for v in back.reshape(-1))

    # str elements are written as UTF-8
    resp = InferResponse("m", outputs=[InferOutput("S", "BYTES", (2,),
                                                   np.array(["é", "a\x00"], dtype=object))])
    out = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(resp))
    assert out.raw_output_contents[0] == b"\x02\x00\x00\x00\xc3\xa9\x02\x00\x00\x00a\x00"


def test_fp16_special_values_bit_exact() -> None:
    bits = np.array([0x7E00, 0x7C01, 0xFE00, 0x7D55, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001,
                     0x7BFF], dtype="<u2")
    array = bits.view("<f2")
    assert np.isnan(array[:4]).all() and np.isinf(array[4:6]).all()
    req = _request([InferInput("H", "FP16", (10,), array)])
    data = codec.encode_infer_request(req)
    back = codec.decode_infer_request(data).inputs[0].data
    assert back.dtype == np.float16
    assert back.view("<u2").tolist() == bits.tolist()
    resp = codec.decode_infer_response(
        codec.encode_infer_response(InferResponse("m", outputs=[InferOutput("H", "FP16", (10,), array)])))
    assert resp.outputs[0].data.view("<u2").tolist() == bits.tolist()


def test_bf16_as_tritonclient_sends_it() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf, 1e-30], dtype=np.float32)
    # bfloat16 by truncation: the upper two bytes of each little-endian float32
    wire = b"".join(struct.pack("<f", v)[2:] for v in values)
    assert wire == bf16_bits_from_float32(values).tobytes()
    m = pb.ModelInferRequest(model_name="bf16")
    m.inputs.add(name="X", datatype="BF16", shape=[7])
    m.raw_input_contents.append(wire)
    x = codec.decode_infer_request(m.SerializeToString()).inputs[0].data
    assert x.dtype == np.dtype("<u2") and x.tobytes() == wire
    widened = float32_from_bf16_bits(x)
    np.testing.assert_array_equal(widened[:6], values[:6])          # exact in bfloat16
    assert widened[6] == float32_from_bf16_bits(bf16_bits_from_float32(values[6:]))[0]   # truncated
    assert codec.encode_infer_response(
        InferResponse("bf16", outputs=[InferOutput("Y", "BF16", (7,), x)])
    ).endswith(wire)


def test_tritonclient_built_request_and_result() -> None:
    """The exact request tritonclient's gRPC client builds, and its InferResult on our response."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc._utils import _get_inference_request

    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    s = np.array([[b"one", b"", b"\x00\xff"]], dtype=object)
    h = np.array([1.5, -np.inf], dtype=np.float16)
    b = np.array([1.0, -2.5, 3.140625], dtype=ml_dtypes.bfloat16)
    inputs = [grpcclient.InferInput("A", [1, 16], "INT32"), grpcclient.InferInput("S", [1, 3], "BYTES"),
              grpcclient.InferInput("H", [2], "FP16"), grpcclient.InferInput("B", [3], "BF16"),
              grpcclient.InferInput("SHM", [4], "FP32")]
    for inp, arr in zip(inputs, (a, s, h, b), strict=False):
        inp.set_data_from_numpy(arr)
    inputs[4].set_shared_memory("region0", 16, offset=8)
    outputs = [grpcclient.InferRequestedOutput("OUT", class_count=0)]
    m = _get_inference_request("model", inputs, "3", "rid", outputs, 42, True, False, 7, 1000,
                               {"custom": "x", "flag": True, "n": 5, "f": 0.5})
    data = m.SerializeToString()
    req = codec.decode_infer_request(data)
    assert normalize_request(req) == expected_request(m)
    assert req.parameters["priority"] == 7 and type(req.parameters["priority"]) is UInt64
    assert req.parameters["sequence_id"] == 42 and req.parameters["sequence_start"] is True
    np.testing.assert_array_equal(req.inputs[0].data, a)
    assert req.inputs[1].data.tolist() == s.tolist()
    assert req.inputs[2].data.tobytes() == h.tobytes()
    assert req.inputs[3].data.tobytes() == b.tobytes()
    shm = req.inputs[4]
    assert shm.data is None and shm.parameters == {
        "shared_memory_region": "region0", "shared_memory_byte_size": 16, "shared_memory_offset": 8}

    resp = InferResponse("model", "3", "rid", None, [
        InferOutput("A", "INT32", (1, 16), req.inputs[0].data),
        InferOutput("S", "BYTES", (1, 3), req.inputs[1].data),
        InferOutput("B", "BF16", (3,), req.inputs[3].data),
        InferOutput("SHM", "FP32", (4,), None, {"shared_memory_region": "out0"}),
    ])
    result = grpcclient.InferResult(pb_parse(pb.ModelInferResponse, codec.encode_infer_response(resp)))
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    assert result.as_numpy("S").tolist() == s.tolist()
    assert result.as_numpy("B").tobytes() == b.tobytes()
    assert result.get_response().raw_output_contents[3] == b""


@pytest.mark.parametrize("where", ["request", "input", "output"])
def test_parameters_of_all_five_kinds(where: str) -> None:
    params = {"b": True, "f": False, "i": -(2**63), "u": UInt64(2**64 - 1), "d": -1.25e300,
              "nan": float("nan"), "s": "ünïcode", "empty": ""}
    inp = InferInput("IN", "INT8", (1,), np.zeros(1, np.int8), params if where == "input" else None)
    out = RequestedOutput("OUT", params if where == "output" else None)
    req = _request([inp], [out], parameters=params if where == "request" else None)
    data = codec.encode_infer_request(req)
    m = pb_parse(pb.ModelInferRequest, data)
    pbmap = {"request": m.parameters, "input": m.inputs[0].parameters, "output": m.outputs[0].parameters}[where]
    assert {k: v.WhichOneof("parameter_choice") for k, v in pbmap.items()} == {
        "b": "bool_param", "f": "bool_param", "i": "int64_param", "u": "uint64_param",
        "d": "double_param", "nan": "double_param", "s": "string_param", "empty": "string_param"}
    back = codec.decode_infer_request(data)
    got = {"request": back.parameters, "input": back.inputs[0].parameters,
           "output": back.outputs[0].parameters}[where]
    assert norm_params(got) == norm_params(params)
    assert type(got["u"]) is UInt64 and type(got["b"]) is bool and type(got["i"]) is int
    assert normalize_request(back) == expected_request(m)


def test_parameter_values_converted_or_rejected() -> None:
    resp = InferResponse("m", parameters={"np_int": np.int32(-3), "np_float": np.float32(0.5),
                                          "np_bool": np.bool_(True), "none": None})
    m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(resp))
    assert m.parameters["np_int"].int64_param == -3
    assert m.parameters["np_float"].double_param == 0.5
    assert m.parameters["np_bool"].bool_param is True
    assert "none" not in m.parameters
    with pytest.raises(CodecError, match="response parameter 'x'.*list"):
        codec.encode_infer_response(InferResponse("m", parameters={"x": [1]}))
    with pytest.raises(CodecError, match="int64"):
        codec.encode_infer_response(InferResponse("m", parameters={"x": 2**63}))
    with pytest.raises(CodecError, match="uint64"):
        codec.encode_infer_response(InferResponse("m", parameters={"x": UInt64(-1)}))
    with pytest.raises(CodecError, match="parameter name must be a str"):
        codec.encode_infer_response(InferResponse("m", parameters={1: 1}))


def test_map_entry_with_unknown_fields_is_ignored_like_upb_does() -> None:
    earlier = ld(4, ld(1, b"k") + ld(2, vfield(2, 9)))
    for entry in [ld(1, b"k") + vfield(20, 1) + ld(2, vfield(1, 1)),     # unknown field
                  ld(1, b"k") + ld(2, vfield(1, 1)) + vfield(1, 5),      # key with another wire type
                  ld(1, b"k") + ld(2, vfield(1, 1)) + tag(2, 5) + b"1234"]:
        data = earlier + ld(4, entry)
        assert codec.decode_infer_request(data).parameters == {"k": 9}
        assert_decodes_like_protobuf(data)
        data = ld(5, ld(1, b"I") + ld(2, b"INT8") + ld(4, entry)) + ld(7, b"\x01")
        assert codec.decode_infer_request(data).inputs[0].parameters == {}
        assert_decodes_like_protobuf(data)


def test_parameter_without_value_is_dropped_and_replaces_earlier_entry() -> None:
    entry_set = ld(1, b"k") + ld(2, vfield(2, 5))
    entry_unset = ld(1, b"k") + ld(2, b"")
    data = ld(4, entry_set) + ld(4, ld(1, b"j") + ld(2, b""))
    assert codec.decode_infer_request(data).parameters == {"k": 5}
    data = ld(4, entry_set) + ld(4, entry_unset)
    assert codec.decode_infer_request(data).parameters == {}
    assert_decodes_like_protobuf(data)
    # a value sub-message twice in one entry is merged: the last set choice wins
    data = ld(4, ld(1, b"k") + ld(2, vfield(2, 5)) + ld(2, b"") + ld(2, tag(4, 1) + struct.pack("<d", 2.0)))
    assert codec.decode_infer_request(data).parameters == {"k": 2.0}
    assert_decodes_like_protobuf(data)


def test_shared_memory_inputs_have_no_raw_entry() -> None:
    shm = InferInput("SHM", "FP32", (2, 2), None, {"shared_memory_region": "r", "shared_memory_byte_size": 16})
    real = InferInput("REAL", "INT16", (3,), np.array([1, -2, 3], np.int16))
    data = codec.encode_infer_request(_request([shm, real]))
    m = pb_parse(pb.ModelInferRequest, data)
    assert list(m.raw_input_contents) == [np.array([1, -2, 3], "<i2").tobytes()]
    req = codec.decode_infer_request(data)
    assert req.inputs[0].data is None and req.inputs[0].shape == (2, 2)
    assert req.inputs[1].data.tolist() == [1, -2, 3]
    # a shared-memory input never takes a raw entry, even when one would fit
    m.raw_input_contents.insert(0, b"\x00" * 16)
    with pytest.raises(CodecError, match="expected 1 raw_input_contents entries.*got 2"):
        codec.decode_infer_request(m.SerializeToString())


def test_shared_memory_outputs_get_an_empty_raw_entry() -> None:
    resp = InferResponse("m", outputs=[
        InferOutput("A", "FP32", (2,), None, {"shared_memory_region": "o"}),
        InferOutput("B", "INT8", (2,), np.array([1, 2], np.int8)),
    ])
    data = codec.encode_infer_response(resp)
    assert list(pb_parse(pb.ModelInferResponse, data).raw_output_contents) == [b"", b"\x01\x02"]
    back = codec.decode_infer_response(data)
    assert back.outputs[0].data is None and back.outputs[1].data.tolist() == [1, 2]
    # Triton and fastoip send shared-memory outputs with no parameters: an empty entry still means "elsewhere"
    resp.outputs[0].parameters = {}
    back = codec.decode_infer_response(codec.encode_infer_response(resp))
    assert back.outputs[0].data is None and back.outputs[1].data.tolist() == [1, 2]
    # a short, non-empty entry is still an error
    short = pb.ModelInferResponse(model_name="m")
    short.outputs.add(name="A", datatype="FP32", shape=[2])
    short.raw_output_contents.append(b"\x00" * 4)
    with pytest.raises(CodecError, match="output 'A': expected 8 bytes for FP32 \\[2\\], got 4"):
        codec.decode_infer_response(short.SerializeToString())


def test_response_without_raw_contents() -> None:
    m = pb.ModelInferResponse(model_name="m")
    m.outputs.add(name="T", datatype="INT64", shape=[2]).contents.int64_contents.extend([-1, 2])
    m.outputs.add(name="E", datatype="FP16", shape=[0, 3])
    m.outputs.add(name="S", datatype="FP32", shape=[4]).parameters["shared_memory_region"].string_param = "r"
    back = codec.decode_infer_response(m.SerializeToString())
    assert back.outputs[0].data.tolist() == [-1, 2]
    assert back.outputs[1].data.shape == (0, 3) and back.outputs[1].data.dtype == np.float16
    assert back.outputs[2].data is None
    m.outputs.add(name="X", datatype="FP32", shape=[1])
    with pytest.raises(CodecError, match="output 'X': no data"):
        codec.decode_infer_response(m.SerializeToString())


def test_stream_response() -> None:
    err = pb_parse(pb.ModelStreamInferResponse, codec.encode_stream_response(None, "boom é"))
    assert err.error_message == "boom é" and not err.HasField("infer_response")

    echo = codec.encode_stream_response(InferResponse("simple", id="r1"), "bad input")
    m = pb_parse(pb.ModelStreamInferResponse, echo)
    assert m.error_message == "bad input"
    assert m.infer_response.model_name == "simple" and m.infer_response.id == "r1"

    resp = InferResponse("m", outputs=[InferOutput("O", "INT32", (2,), np.array([5, 6], np.int32))])
    ok = codec.encode_stream_response(resp)
    m = pb_parse(pb.ModelStreamInferResponse, ok)
    assert m.error_message == "" and m.infer_response.SerializeToString() == codec.encode_infer_response(resp)
    # an empty response is still present as a sub-message
    assert pb_parse(pb.ModelStreamInferResponse, codec.encode_stream_response(InferResponse(""))).HasField(
        "infer_response")
    assert codec.encode_stream_response(None) == b""


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    unknown = vfield(20, 300) + tag(21, 1) + b"\x01" * 8 + ld(22, b"\xff\x00junk") + tag(23, 5) + b"\x02" * 4
    tensor = ld(1, b"IN") + unknown + ld(2, b"UINT8") + ld(3, varint(2)) + unknown
    tensor += ld(4, ld(1, b"k") + ld(2, unknown + vfield(1, 1)))
    # a known field with an unexpected wire type is an unknown field too (protobuf semantics)
    wrong_wt = vfield(1, 7) + tag(5, 5) + b"\x00" * 4 + tag(7, 1) + b"\x00" * 8
    data = unknown + wrong_wt + ld(1, b"m") + ld(5, tensor) + unknown + ld(7, b"\x09\x08") \
        + ld(6, ld(1, b"O") + unknown)
    req = codec.decode_infer_request(data)
    assert req.model_name == "m" and req.inputs[0].data.tolist() == [9, 8]
    assert req.inputs[0].parameters == {"k": True} and req.outputs[0].name == "O"
    assert_decodes_like_protobuf(data)


def test_last_occurrence_of_a_scalar_field_wins() -> None:
    data = ld(1, b"first") + ld(2, b"v1") + ld(1, b"second") + ld(5, ld(2, b"FP32") + ld(2, b"INT8")
                                                                   + ld(1, b"a") + ld(1, b"b")) \
        + ld(7, b"\x05")
    req = codec.decode_infer_request(data)
    assert req.model_name == "second" and req.inputs[0].name == "b" and req.inputs[0].datatype == "INT8"
    assert req.inputs[0].shape == () and req.inputs[0].data.tolist() == 5
    assert_decodes_like_protobuf(data)


def test_packed_and_unpacked_shape() -> None:
    base = ld(1, b"x") + ld(2, b"INT8")
    packed = codec.decode_infer_request(ld(5, base + ld(3, varint(2) + varint(3))) + ld(7, b"\x00" * 6))
    unpacked = codec.decode_infer_request(ld(5, base + vfield(3, 2) + vfield(3, 3)) + ld(7, b"\x00" * 6))
    mixed = codec.decode_infer_request(ld(5, base + vfield(3, 2) + ld(3, varint(3))) + ld(7, b"\x00" * 6))
    assert packed.inputs[0].shape == unpacked.inputs[0].shape == mixed.inputs[0].shape == (2, 3)


def test_decoded_datatype_strings_are_the_canonical_names() -> None:
    req = codec.decode_infer_request(simple_request_bytes())
    assert req.inputs[0].datatype is req.inputs[1].datatype


# --------------------------------------------------------------------------- #
# Decoding errors                                                              #
# --------------------------------------------------------------------------- #

def _one_input(datatype: bytes, shape: list[int], raw: bytes | None, name: bytes = b"INPUT0",
               extra: bytes = b"") -> bytes:
    t = ld(1, name) + ld(2, datatype) + ld(3, b"".join(varint(d) for d in shape)) + extra
    return ld(1, b"m") + ld(5, t) + (ld(7, raw) if raw is not None else b"")


@pytest.mark.parametrize("data, match", [
    (_one_input(b"INT32", [1, 16], b"\x00" * 60), r"input byte size mismatch for input 'INPUT0' for model 'm'. Expected 64, got 60 \(INT32 \[1,16\]\)"),
    (_one_input(b"FP64", [2], b"\x00" * 17), r"input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 17 \(FP64 \[2\]\)"),
    (_one_input(b"INT8", [-1], b"\x00"), r"input 'INPUT0': negative dimension in shape \[-1\]"),
    (_one_input(b"INT8", [2**62, 2**62], b"\x00"), r"input 'INPUT0': shape \[4611686018427387904,4611686018427387904\] has too many elements"),
    (_one_input(b"INT8", [2**62, 2**62, 0], b""), r"too many elements"),
    (_one_input(b"UINT16", [0, 2**62], b""), r"too many elements"),        # numpy: 2**63 bytes
    (_one_input(b"BYTES", [2**61, 0], b""), r"too many elements"),         # 8-byte pointers
    (_one_input(b"INT8", [1] * 65, b"\x00"), r"input 'INPUT0': 65 dimensions, numpy allows at most 64"),
    (_one_input(b"BYTES", [1000], b"\x00" * 8), r"input 'INPUT0': 1000 BYTES elements need at least 4000 bytes, got 8"),
    (_one_input(b"BYTES", [2], b"\x01\x00\x00\x00a\x05\x00\x00\x00b"), r"input 'INPUT0': BYTES element 1 declares 5 bytes but only 1 remain"),
    (_one_input(b"BYTES", [1], b"\x01\x00\x00\x00ab"), r"input 'INPUT0': 1 bytes left over after 1 BYTES elements"),
    (_one_input(b"BYTES", [2], b"\x01\x00\x00\x00abcd"), r"input 'INPUT0': BYTES element 1: truncated length prefix"),
    (_one_input(b"FLOAT", [1], b"\x00" * 4), r"input 'INPUT0': unknown datatype 'FLOAT'"),
    (_one_input(b"", [1], b"\x00" * 4), r"input 'INPUT0': unknown datatype ''"),
    (_one_input(b"INT8", [1], None), r"expected 1 raw_input_contents entries .*got 0"),
    (_one_input(b"INT8", [1], b"\x00") + ld(7, b"\x00"), r"expected 1 raw_input_contents entries .*got 2"),
    (_one_input(b"INT32", [1], b"\x00" * 4, extra=ld(5, vfield(2, 1))),
     r"input 'INPUT0': contents and raw_input_contents cannot be mixed"),
    (_one_input(b"INT32", [1], None, extra=ld(5, ld(6, b"\x00" * 4))),
     r"input 'INPUT0': datatype INT32 takes int_contents, got fp32_contents"),
    (_one_input(b"INT64", [1], None, extra=ld(5, vfield(2, 1))),
     r"input 'INPUT0': datatype INT64 takes int64_contents, got int_contents"),
    (_one_input(b"FP16", [1], None, extra=ld(5, b"")), r"input 'INPUT0': FP16 has no typed contents field"),
    (_one_input(b"BF16", [1], None, extra=ld(5, vfield(2, 1))), r"input 'INPUT0': BF16 has no typed contents field"),
    (_one_input(b"INT32", [3], None, extra=ld(5, ld(2, b"\x01\x02"))),
     r"input 'INPUT0': INT32 \[3\] needs 3 elements, int_contents has 2"),
    (_one_input(b"FP32", [1], None, extra=ld(4, ld(1, b"shared_memory_region") + ld(2, ld(3, b"r")))
     + ld(5, ld(6, b"\x00" * 4))), r"input 'INPUT0': a shared-memory input cannot carry contents"),
])
def test_semantic_errors_name_the_input(data: bytes, match: str) -> None:
    pb_parse(pb.ModelInferRequest, data)     # protobuf accepts all of these
    with pytest.raises(CodecError, match=match):
        codec.decode_infer_request(data)
    with pytest.raises(Reject):
        expected_request(pb_parse(pb.ModelInferRequest, data))


@pytest.mark.parametrize("data, match", [
    (ld(1, b"\xff\xfe"), r"model_name is not valid UTF-8"),
    (ld(1, b"\xed\xa0\x80"), r"model_name is not valid UTF-8"),        # an encoded surrogate
    (ld(1, b"\xc0\x80"), r"model_name is not valid UTF-8"),            # overlong NUL
    (ld(3, b"a\x80"), r"id is not valid UTF-8"),
    (ld(5, ld(1, b"\xff")), r"input name is not valid UTF-8"),
    (ld(5, ld(2, b"\xff")), r"input datatype is not valid UTF-8"),
    (ld(4, ld(1, b"\xff")), r"parameter name is not valid UTF-8"),
    (ld(4, ld(1, b"k") + ld(2, ld(3, b"\xff"))), r"string_param is not valid UTF-8"),
    (ld(6, ld(1, b"\xff")), r"output name is not valid UTF-8"),
    (b"\x0e", r"invalid wire type 6 for field 1"),
    (b"\x0f", r"invalid wire type 7 for field 1"),
    (b"\x0b\x08\x01\x0c", r"groups are not supported"),
    (b"\x0c", r"groups are not supported"),
    (ld(5, b"\x0b\x0c"), r"groups are not supported"),
    (b"\x00\x01", r"invalid field number 0"),
    (b"\x02\x00", r"invalid field number 0"),
    (vfield(9, 0) + b"\x80", r"truncated message: varint at byte 2"),
    (b"\x48" + b"\xff" * 10 + b"\x01", r"malformed varint at byte 1"),       # 11 bytes
    (b"\x48" + b"\xff" * 9 + b"\x02", r"malformed varint at byte 1"),        # overflows 64 bits
    (b"\x8a\x80\x80\x80\x80\x00", r"malformed tag"),                         # 6-byte tag
    (b"\xfa\xff\xff\xff\x7f\x00", r"malformed tag"),                         # tag over 32 bits
    (b"\x0a\x05abc", r"truncated message: field of 5 bytes at byte 2 runs past the end \(3 bytes left\)"),
    (ld(5, ld(1, b"x") + b"\x12\x09INT"), r"field of 9 bytes"),
    (b"\x21\x00\x00", r"truncated message: 8-byte value"),
    (b"\x25\x00", r"truncated message: 4-byte value"),
    (_one_input(b"FP32", [1], None, extra=ld(5, ld(6, b"\x00" * 5))), r"malformed packed fp32_contents"),
    (_one_input(b"INT32", [1], None, extra=ld(5, ld(2, b"\x80"))), r"truncated message: varint"),
])
def test_wire_errors(data: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        codec.decode_infer_request(data)


def test_protobuf_rejects_what_we_reject_on_the_wire() -> None:
    """Our wire errors are protobuf's too, except groups and 64-bit varint overflow, which
    protobuf skips or truncates silently (the documented differences)."""
    for data in [ld(1, b"\xff\xfe"), ld(4, ld(1, b"k") + ld(2, ld(3, b"\xff"))), b"\x0e", b"\x00\x01",
                 b"\x48" + b"\xff" * 10 + b"\x01", b"\x0a\x05abc", b"\x8a\x80\x80\x80\x80\x00",
                 _one_input(b"FP32", [1], None, extra=ld(5, ld(6, b"\x00" * 5)))]:
        with pytest.raises(DecodeError):
            pb_parse(pb.ModelInferRequest, data)
    for data in [b"\x0b\x08\x01\x0c", b"\x48" + b"\xff" * 9 + b"\x02"]:
        pb_parse(pb.ModelInferRequest, data)


@pytest.mark.parametrize("build", ["simple", "typed", "bytes"])
def test_truncated_at_every_offset(build: str) -> None:
    if build == "simple":
        data = simple_request_bytes()
    elif build == "typed":
        m = pb.ModelInferRequest(model_name="t", id="1")
        m.inputs.add(name="A", datatype="FP64", shape=[2]).contents.fp64_contents.extend([1.0, -2.0])
        m.inputs.add(name="B", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"x", b""])
        m.outputs.add(name="O").parameters["p"].double_param = 1.0
        data = m.SerializeToString()
    else:
        array = np.array([b"abc", b"", b"\x00"], dtype=object)
        data = codec.encode_infer_request(_request([InferInput("S", "BYTES", (3,), array)]))
    for i in range(len(data) + 1):
        chunk = data[:i]
        try:
            m = pb_parse(pb.ModelInferRequest, chunk)
        except DecodeError:
            with pytest.raises(CodecError):
                codec.decode_infer_request(chunk)
            continue
        assert_decodes_like_protobuf(chunk)


def test_decode_response_errors() -> None:
    out = ld(1, b"O") + ld(2, b"INT8") + ld(3, varint(1))
    with pytest.raises(CodecError, match=r"expected 2 raw_output_contents entries \(one per output\), got 1"):
        codec.decode_infer_response(ld(5, out) + ld(5, out) + ld(6, b"\x01"))
    with pytest.raises(CodecError, match="output 'O': contents and raw_output_contents cannot be mixed"):
        codec.decode_infer_response(ld(5, out + ld(5, vfield(2, 1))) + ld(6, b"\x01"))
    with pytest.raises(CodecError, match="output 'O': expected 1 bytes for INT8"):
        codec.decode_infer_response(ld(5, out) + ld(6, b"\x01\x02"))


# --------------------------------------------------------------------------- #
# BYTES framing on its own                                                     #
# --------------------------------------------------------------------------- #

def test_serialize_deserialize_bytes_tensor() -> None:
    values = [b"", b"\x00", "é", b"\xff" * 5, np.bytes_(b"np")]
    framed = codec.serialize_bytes_tensor(np.array(values, dtype=object))
    expected = b"".join(struct.pack("<I", len(v)) + v
                        for v in [b"", b"\x00", "é".encode(), b"\xff" * 5, b"np"])
    assert framed == expected
    from tritonclient.utils import serialize_byte_tensor
    assert framed == serialize_byte_tensor(np.array([v.encode() if isinstance(v, str) else bytes(v)
                                                     for v in values], dtype=object)).item()
    back = codec.deserialize_bytes_tensor(framed, 5)
    assert back.dtype == object and back.shape == (5,)
    assert back.tolist() == [b"", b"\x00", "é".encode(), b"\xff" * 5, b"np"]
    assert codec.deserialize_bytes_tensor(memoryview(bytearray(framed)), 5).tolist() == back.tolist()
    assert codec.deserialize_bytes_tensor(b"", 0).shape == (0,)
    assert codec.serialize_bytes_tensor(np.empty((0, 3), dtype=object)) == b""
    # 2-D, str and S arrays, plain lists
    assert codec.serialize_bytes_tensor(np.array([["a", "bc"]])) == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
    assert codec.serialize_bytes_tensor(np.array([b"a", b"bc"], dtype="S2")) == \
        b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
    assert codec.serialize_bytes_tensor([b"a", "b"]) == b"\x01\x00\x00\x00a\x01\x00\x00\x00b"


@pytest.mark.parametrize("data, count, match", [
    (b"\x00" * 8, 3, r"3 BYTES elements need at least 12 bytes, got 8"),
    (b"\x00" * 8, 1, r"4 bytes left over after 1 BYTES elements"),
    (b"\x05\x00\x00\x00abc", 1, r"element 0 declares 5 bytes but only 3 remain"),
    (b"\x00\x00\x00\x00\x00\x00", 1, r"2 bytes left over"),
    (b"\x01\x00\x00\x00a\x00\x00", 2, r"2 BYTES elements need at least 8 bytes, got 7"),
    (b"\x00\x00\x00\x00\x00\x00\x00", 1, r"3 bytes left over"),
    (b"", -1, r"negative BYTES element count"),
    (b"", 2**70, r"element count 1180591620717411303424 is out of range"),
    (b"\x00" * 8, 2**62, r"4611686018427387904 BYTES elements need at least 18446744073709551616 bytes"),
    (b"\xff\xff\xff\xff\x00\x00\x00\x00", 2, r"element 0 declares 4294967295 bytes"),
])
def test_deserialize_bytes_tensor_errors(data: bytes, count: int, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        codec.deserialize_bytes_tensor(data, count)


# --------------------------------------------------------------------------- #
# Encoding                                                                     #
# --------------------------------------------------------------------------- #

def test_encode_response_equals_protobuf_serialization() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    resp = InferResponse("model", "7", "req", {"p": "v"}, [
        InferOutput("O0", "FP32", (2, 3), a, {"binary_data_size": 24}),
        InferOutput("", "INT64", (0,), np.zeros(0, np.int64)),
        InferOutput("O2", "FP32", (1, -1), None),
    ])
    m = pb.ModelInferResponse(model_name="model", model_version="7", id="req")
    m.parameters["p"].string_param = "v"
    o = m.outputs.add(name="O0", datatype="FP32", shape=[2, 3])
    o.parameters["binary_data_size"].int64_param = 24
    m.outputs.add(name="", datatype="INT64", shape=[0])
    m.outputs.add(name="O2", datatype="FP32", shape=[1, -1])
    m.raw_output_contents.extend([a.tobytes(), b"", b""])
    assert codec.encode_infer_response(resp) == m.SerializeToString()
    assert codec.encode_infer_response(InferResponse("")) == b""


def test_encode_response_parts_concatenate_to_the_message_and_reference_large_outputs() -> None:
    big = np.arange(50_000, dtype=np.float32).reshape(1, -1)
    small = np.arange(4, dtype=np.int32)
    strided = np.arange(40_000, dtype=np.float64).reshape(200, 200).T  # not C-contiguous: the codec copies it
    swapped = np.arange(30_000, dtype=">i4")  # byte order swapped: the codec converts it
    resp = InferResponse("model", "3", "req", {"p": "v"}, [
        InferOutput("BIG", "FP32", (1, 50_000), big),
        InferOutput("SMALL", "INT32", (4,), small),
        InferOutput("SHM", "FP32", (2,), None),
        InferOutput("T", "FP64", (200, 200), strided),
        InferOutput("S", "BYTES", (2,), np.array([b"ab", b""], dtype=object)),
        InferOutput("SW", "INT32", (30_000,), swapped),
    ])
    whole = codec.encode_infer_response(resp)
    for min_ref in (0, 1, 65_536, 1 << 40):
        parts = codec.encode_infer_response_parts(resp, min_ref)
        assert b"".join(bytes(part) for part in parts) == whole
    parts = codec.encode_infer_response_parts(resp, 65_536)
    # no copy: the large C-contiguous output is sent from its own array; small ones are in the copied stretches
    sharing = [part for part in parts if np.shares_memory(np.frombuffer(part, np.uint8), big)]
    assert len(sharing) == 1 and len(sharing[0]) == big.nbytes
    assert all(type(part) in (bytes, memoryview) for part in parts)
    assert all(memoryview(part).format == "B" and memoryview(part).c_contiguous for part in parts)
    # nothing large: one bytes object, the message itself
    assert codec.encode_infer_response_parts(InferResponse("m", outputs=[
        InferOutput("SMALL", "INT32", (4,), small)])) == [codec.encode_infer_response(InferResponse("m", outputs=[
            InferOutput("SMALL", "INT32", (4,), small)]))]
    assert codec.encode_infer_response_parts(InferResponse("")) == [b""]
    with pytest.raises(ValueError):
        codec.encode_infer_response_parts(resp, -1)


def test_encode_non_contiguous_and_byte_swapped_arrays() -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    for arr in (base.T, base[:, ::2], base.astype(">i4"), np.asfortranarray(base)):
        out = InferOutput("O", "INT32", arr.shape, arr)
        m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(InferResponse("m", outputs=[out])))
        assert m.raw_output_contents[0] == np.ascontiguousarray(arr, dtype="<i4").tobytes()
    # a list is accepted as data and converted with the datatype's dtype
    out = InferOutput("O", "FP64", (2,), [1, 2])
    m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(InferResponse("m", outputs=[out])))
    assert m.raw_output_contents[0] == np.array([1.0, 2.0]).tobytes()
    # BF16 bits may come in a signed 16-bit array
    bits = np.array([0x3F80, -0x4000], dtype=np.int16)
    m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(
        InferResponse("m", outputs=[InferOutput("B", "BF16", (2,), bits)])))
    assert m.raw_output_contents[0] == bits.tobytes()


def test_large_tensor_round_trip() -> None:
    image = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
    req = _request([InferInput("INPUT0", "FP32", image.shape, image)])
    data = codec.encode_infer_request(req)
    assert pb_parse(pb.ModelInferRequest, data).raw_input_contents[0] == image.tobytes()
    got = codec.decode_infer_request(data).inputs[0].data
    np.testing.assert_array_equal(got, image)
    resp = codec.encode_infer_response(InferResponse("m", outputs=[InferOutput("O", "FP32", got.shape, got)]))
    assert pb_parse(pb.ModelInferResponse, resp).raw_output_contents[0] == image.tobytes()


@pytest.mark.parametrize("output, match", [
    (InferOutput("O", "FLOAT32", (1,), np.zeros(1, np.float32)), r"output 'O': unknown datatype 'FLOAT32'"),
    (InferOutput("O", "FP32", (2, 2), np.zeros(3, np.float32)), r"output 'O': shape has 4 elements but the data has 3"),
    (InferOutput("O", "FP32", (2,), np.zeros(2, np.float64)), r"output 'O': FP32 data must be float32, got float64"),
    (InferOutput("O", "BOOL", (2,), np.zeros(2, np.uint8)), r"output 'O': BOOL data must be bool, got uint8"),
    (InferOutput("O", "FP32", (2,), ["a", "b"]), r"output 'O': data is not FP32"),
    (InferOutput("O", "BYTES", (3,), np.array([b"a", b"b"], dtype=object)), r"output 'O': shape has 3 elements but the data has 2"),
    (InferOutput("O", "INT8", (-1,), np.zeros(1, np.int8)), r"output 'O': invalid shape \[-1\]"),
    (InferOutput("O", "INT64", (2**61 + 2,), np.zeros(2, np.int64)),        # 8 * count wraps to 16
     r"output 'O': shape has 2305843009213693954 elements but the data has 2"),
    (InferOutput("O", "INT8", (1.5,), np.zeros(1, np.int8)), r"output 'O': shape \(1.5,\) must hold integers"),
    (InferOutput("O", "INT8", (2**64,), None), r"output 'O': dimension 18446744073709551616 does not fit in int64"),
    (InferOutput(b"O", "INT8", (1,), np.zeros(1, np.int8)), r"output: name must be a str, got bytes"),
    (InferOutput("\ud800", "INT8", (1,), np.zeros(1, np.int8)), r"name cannot be encoded as UTF-8"),
])
def test_encode_errors(output: InferOutput, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        codec.encode_infer_response(InferResponse("m", outputs=[output]))


def test_encode_accepts_numpy_shape_elements() -> None:
    arr = np.zeros((2, 3), np.uint8)
    out = InferOutput("O", "UINT8", (np.int64(2), np.uint8(3)), arr)
    m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(InferResponse("m", outputs=[out])))
    assert list(m.outputs[0].shape) == [2, 3]


def test_encode_is_safe_with_duck_typed_objects() -> None:
    class Out:
        def __init__(self) -> None:
            self.name, self.datatype, self.shape = "O", "INT8", [2]
            self.data, self.parameters = np.array([1, 2], np.int8), {}

    class Resp:
        model_name, model_version, id, parameters = "m", "", "", {}
        outputs = [Out()]

    m = pb_parse(pb.ModelInferResponse, codec.encode_infer_response(Resp()))
    assert m.raw_output_contents[0] == b"\x01\x02"


def test_refcounts_do_not_leak() -> None:
    def fresh(text: str) -> str:
        return "".join([text, "-x"])       # a new str object that nothing else holds

    data = simple_request_bytes()
    name, key, value, model = fresh("out"), fresh("key"), fresh("value"), fresh("model")
    array = np.zeros((1, 16), np.int32)
    items = np.array([fresh("a").encode(), b"b"], dtype=object)
    good = InferResponse(model, parameters={key: value}, outputs=[
        InferOutput(name, "INT32", (1, 16), array, {key: value}),
        InferOutput(name, "BYTES", (2,), items)])
    bad = InferResponse(model, parameters={key: value}, outputs=[
        InferOutput(name, "INT32", (1, 16), array, {key: value}),
        InferOutput(name, "NOPE", (1,), array)])          # fails after the first output is planned
    watched = [data, name, key, value, model, array, items]

    def run() -> None:
        codec.decode_infer_request(data)
        codec.decode_infer_request(bytearray(data))
        codec.encode_infer_response(good)
        codec.encode_stream_response(good, value)
        codec.encode_infer_request(InferRequest(model, inputs=[InferInput(name, "INT32", (1, 16), array)],
                                                outputs=[RequestedOutput(name, {key: value})]))
        for call, arg in ((codec.decode_infer_request, data[:-3]), (codec.encode_infer_response, bad)):
            try:
                call(arg)
            except CodecError:
                pass

    for _ in range(50):
        run()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(500):
        run()
    assert [sys.getrefcount(o) for o in watched] == before


def test_fast_slot_layout_is_in_use() -> None:
    assert codec.FAST_SLOTS


def test_request_without_data_keeps_everything_but_the_input_arrays() -> None:
    """What the Core keeps of a request once its execution ended: the same header, every input's name,
    datatype, shape and parameters, no data; the request it was made from is not changed."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    wanted = [RequestedOutput("OUTPUT0", {"classification": 2})]
    request = InferRequest("simple", "1", "req-9", {"priority": UInt64(2)},
                           [InferInput("INPUT0", "INT32", (1, 16), a, {"p": 1}), InferInput("INPUT1", "INT32", [1, 16], a)],
                           wanted)
    copy = codec.request_without_data(request)
    assert type(copy) is InferRequest and copy is not request
    assert (copy.model_name, copy.model_version, copy.id) == ("simple", "1", "req-9")
    assert copy.parameters is request.parameters and copy.outputs is wanted
    assert [(t.name, t.datatype, tuple(t.shape), t.data, t.parameters) for t in copy.inputs] == [
        ("INPUT0", "INT32", (1, 16), None, {"p": 1}), ("INPUT1", "INT32", (1, 16), None, {})]
    assert all(type(t) is InferInput for t in copy.inputs)
    assert request.inputs[0].data is a and request.inputs[1].data is a  # the original keeps its arrays
    refs = sys.getrefcount(a)
    del copy
    assert sys.getrefcount(a) == refs


def test_split_rows_gives_the_views_numpy_slices_give_or_none_where_it_cannot() -> None:
    from fastoip._codec import split_rows

    batch = np.arange(30, dtype=np.float32).reshape(10, 3)
    views = split_rows(batch, [3, 0, 7])
    assert views is not None and [view.shape for view in views] == [(3, 3), (0, 3), (7, 3)]
    for view, expected in zip(views, (batch[0:3], batch[3:3], batch[3:10]), strict=True):
        np.testing.assert_array_equal(view, expected)
        assert view.dtype == batch.dtype and view.flags.c_contiguous and view.flags.writeable
        assert np.shares_memory(view, batch) or view.size == 0
    views[0][0, 0] = -1.0  # views, not copies
    assert batch[0, 0] == -1.0
    frozen = np.arange(8, dtype=np.int64).reshape(4, 2)
    frozen.flags.writeable = False
    assert not any(view.flags.writeable for view in split_rows(frozen, [1, 3]))  # type: ignore[union-attr]
    strings = np.array([b"a", b"bb", b"c"], dtype=object)
    (one, two) = split_rows(strings, [1, 2])  # type: ignore[misc]
    assert one.tolist() == [b"a"] and two.tolist() == [b"bb", b"c"]
    # what it does not split: numpy's own slicing then
    assert split_rows(batch.T, [1]) is None  # not C-contiguous
    assert split_rows(np.array(1.0), [1]) is None  # no rows
    assert split_rows(np.ma.masked_array(batch), [1]) is None  # a subclass
    with pytest.raises(ValueError, match="6 rows from row 5"):
        split_rows(batch, [5, 6])
    with pytest.raises(ValueError):
        split_rows(batch, [-1])


def test_gather_rows_copies_parts_in_order_or_refuses_without_writing() -> None:
    from fastoip._codec import gather_rows

    parts = [np.full((rows, 3), value, dtype=np.int32) for rows, value in ((1, 1), (2, 2), (1, 3))]
    out = np.zeros((4, 3), dtype=np.int32)
    assert gather_rows(parts, out)
    np.testing.assert_array_equal(out, np.concatenate(parts))
    untouched = np.zeros((4, 3), dtype=np.int32)
    refused = [
        (parts, np.zeros((5, 3), dtype=np.int32)),  # the parts do not fill it
        (parts, np.zeros((4, 3), dtype=np.int64)),  # another dtype
        (parts, np.zeros((2, 6), dtype=np.int32)),  # another row shape, same bytes
        ([np.zeros((4, 3), dtype=np.int32).T.copy().T], untouched),  # a part that is not C-contiguous
        ([np.zeros((4, 3), dtype=">i4")], untouched),  # another byte order
        ([[0, 0, 0]] * 4, untouched),  # not arrays
    ]
    for candidates, target in refused:
        assert not gather_rows(candidates, target)
    assert not untouched.any()
    strings = np.array([b"a"], dtype=object)
    assert not gather_rows([strings], np.empty(1, dtype=object))  # references are never copied as bytes
    read_only = np.zeros((1, 3), dtype=np.int32)
    read_only.flags.writeable = False
    assert not gather_rows(parts[:1], read_only)


def test_pack_inline_takes_only_small_numeric_arrays() -> None:
    from fastoip._codec import pack_inline, unpack_inline

    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    packed = pack_inline(small, 1024)
    assert packed is not None and packed[0] == "b" and packed[2] == "<f4" and packed[3] == (2, 3)
    assert isinstance(packed[1], bytearray) and bytes(packed[1]) == small.tobytes()
    np.testing.assert_array_equal(unpack_inline(packed), small)
    assert pack_inline(small, 24) is None  # 24 bytes: not fewer than the limit
    assert pack_inline(np.array([b"x"], dtype=object), 1024) is None  # objects are pickled
    assert pack_inline([1.0, 2.0], 1024) is None  # not an ndarray

"""Caps on decoded BYTES elements: a small request cannot expand into a huge graph of Python objects.

Each BYTES element becomes a Python bytes object (~50 bytes) for as little as 4 bytes on the wire, so the
elements of a request are counted before decoding (--max-bytes-elements, 2**24) and the memory they become is
charged while they are built (--max-bytes-memory, 256 MiB per tensor).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip import _codec
from fastoip._proto import grpc_service_pb2 as pb
from fastoip.errors import CodecError
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

LIMIT = 1000
CONFIG = 'max_batch_size: 0\ninput [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n' \
    'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("bytes-repo")
    write_model(root, "strings", identity_model_bytes(TensorProto.STRING, ["n"], batch=False), config=CONFIG)
    with ServerProcess(root, "--max-bytes-elements", str(LIMIT), http=True) as proc:
        yield proc


def _strings(count: int) -> np.ndarray:
    return np.array([b""] * count, dtype=np.object_)


@pytest.mark.parametrize("protocol", ["grpc", "http-binary", "http-json"])
def test_too_many_bytes_elements_are_refused(server: ServerProcess, protocol: str) -> None:
    module = tg if protocol == "grpc" else th
    client: tg.InferenceServerClient | th.InferenceServerClient = (
        tg.InferenceServerClient(server.grpc_url) if protocol == "grpc" else th.InferenceServerClient(server.http_url)
    )
    binary = {} if protocol == "grpc" else {"binary_data": protocol == "http-binary"}
    for count, allowed in ((LIMIT + 1, False), (LIMIT, True)):
        inp = module.InferInput("INPUT0", [count], "BYTES")
        inp.set_data_from_numpy(_strings(count), **binary)
        if allowed:
            assert client.infer("strings", [inp]).as_numpy("OUTPUT0").shape == (count,)
            continue
        with pytest.raises(InferenceServerException) as info:
            client.infer("strings", [inp])
        assert info.value.status() in ("StatusCode.INVALID_ARGUMENT", "400"), info.value
        assert "too many elements for BYTES tensors in one request" in info.value.message(), info.value
        assert f"limit of {LIMIT}" in info.value.message()


def test_the_defaults_take_many_small_elements_and_bound_their_memory(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Triton has no element limit (its QA sends 10,485,760 one-byte elements in one request); fastoip's defaults
    take a million and more, while the memory the elements become is charged as they are built."""
    assert _codec.max_bytes_elements() == _codec.DEFAULT_MAX_BYTES_ELEMENTS == 1 << 24
    assert _codec.max_bytes_memory() == _codec.DEFAULT_MAX_BYTES_MEMORY == 256 << 20
    root = tmp_path_factory.mktemp("bytes-default")
    write_model(root, "strings", identity_model_bytes(TensorProto.STRING, ["n"], batch=False), config=CONFIG)
    with ServerProcess(root) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        inp = tg.InferInput("INPUT0", [1 << 20], "BYTES")
        inp.set_data_from_numpy(_strings(1 << 20))
        assert client.infer("strings", [inp]).as_numpy("OUTPUT0").shape == (1 << 20,)
    # 2**20 elements of 100 bytes (~100 MB on the wire) would take ~160 MB of Python objects: over a 64 MiB budget.
    with ServerProcess(root, "--max-bytes-memory", str(64 << 20)) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        inp = tg.InferInput("INPUT0", [1 << 19], "BYTES")
        inp.set_data_from_numpy(np.array([b"x" * 100] * (1 << 19), dtype=np.object_))
        with pytest.raises(InferenceServerException, match="take more than this server's limit of 67108864 bytes"):
            client.infer("strings", [inp])
        inp = tg.InferInput("INPUT0", [3], "BYTES")
        inp.set_data_from_numpy(np.array([b"a", b"", b"cc"], dtype=np.object_))
        assert client.infer("strings", [inp]).as_numpy("OUTPUT0").tolist() == [b"a", b"", b"cc"]


def test_bytes_memory_is_charged_per_element_while_decoding() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[4])
    tensor.contents.bytes_contents.extend([b"a", b"", b"x" * 100, b"y" * 100])
    previous = _codec.max_bytes_memory()
    # 16 bytes of pointers per element; the two 100-byte objects take 144 bytes each (CPython shares b"" and b"a").
    needed = 4 * 16 + 2 * 144
    try:
        _codec.set_max_bytes_memory(needed - 1)
        with pytest.raises(CodecError, match="input 'INPUT0': its BYTES elements take more than"):
            _codec.decode_infer_request(request.SerializeToString())
        raw = b"".join(len(v).to_bytes(4, "little") + v for v in (b"a", b"", b"x" * 100, b"y" * 100))
        with pytest.raises(CodecError, match="take more than"):
            _codec.deserialize_bytes_tensor(raw, 4)
        _codec.set_max_bytes_memory(needed)
        assert _codec.decode_infer_request(request.SerializeToString()).inputs[0].data.tolist()[:2] == [b"a", b""]
        assert len(_codec.deserialize_bytes_tensor(raw, 4)) == 4
    finally:
        _codec.set_max_bytes_memory(previous)


def test_typed_bytes_contents_are_capped_too() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[5])
    tensor.contents.bytes_contents.extend([b""] * 5)
    previous = _codec.max_bytes_elements()
    _codec.set_max_bytes_elements(4)
    try:
        with pytest.raises(CodecError, match="too many elements for BYTES tensors in one request"):
            _codec.decode_infer_request(request.SerializeToString())
        _codec.set_max_bytes_elements(5)
        decoded = _codec.decode_infer_request(request.SerializeToString())
        assert decoded.inputs[0].data.tolist() == [b""] * 5
        # The limit is per request: two inputs of 3 are 6 elements.
        second = request.inputs.add(name="INPUT1", datatype="BYTES", shape=[3])
        second.contents.bytes_contents.extend([b"x"] * 3)
        request.inputs[0].ClearField("contents")
        request.inputs[0].shape[:] = [3]
        request.inputs[0].contents.bytes_contents.extend([b""] * 3)
        with pytest.raises(CodecError, match="too many elements for BYTES tensors in one request"):
            _codec.decode_infer_request(request.SerializeToString())
        # Shared-memory BYTES data is capped by the same limit, per tensor.
        with pytest.raises(CodecError, match="too many elements for a BYTES tensor: 6"):
            _codec.deserialize_bytes_tensor(b"\0\0\0\0" * 6, 6)
    finally:
        _codec.set_max_bytes_elements(previous)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_limit_counts_every_bytes_input_of_a_request(server: ServerProcess, protocol: str) -> None:
    module = tg if protocol == "grpc" else th
    client: tg.InferenceServerClient | th.InferenceServerClient = (
        tg.InferenceServerClient(server.grpc_url) if protocol == "grpc" else th.InferenceServerClient(server.http_url)
    )
    inputs = []
    for name in ("INPUT0", "INPUT1"):  # 600 + 600 > 1000, each alone within it
        inp = module.InferInput(name, [600], "BYTES")
        inp.set_data_from_numpy(_strings(600))
        inputs.append(inp)
    with pytest.raises(InferenceServerException) as info:
        client.infer("strings", inputs)
    assert info.value.status() in ("StatusCode.INVALID_ARGUMENT", "400"), info.value
    assert "too many elements for BYTES tensors in one request" in info.value.message(), info.value
    assert client.infer("strings", inputs[:1]).as_numpy("OUTPUT0").shape == (600,)

"""A cap on decoded BYTES elements: a small request cannot expand into a huge graph of Python objects.

Each BYTES element becomes a Python bytes object (40-60 bytes) for as little as 4 bytes on the wire:
one million empty strings (4 MB) cost 40-65 MB of RSS per call before the cap.
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


def test_the_default_refuses_a_million_empty_strings(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert _codec.max_bytes_elements() == _codec.DEFAULT_MAX_BYTES_ELEMENTS == 1 << 17
    root = tmp_path_factory.mktemp("bytes-default")
    write_model(root, "strings", identity_model_bytes(TensorProto.STRING, ["n"], batch=False), config=CONFIG)
    with ServerProcess(root) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        inp = tg.InferInput("INPUT0", [1 << 20], "BYTES")
        inp.set_data_from_numpy(_strings(1 << 20))
        with pytest.raises(InferenceServerException, match="too many elements for BYTES tensors in one request"):
            client.infer("strings", [inp])
        inp = tg.InferInput("INPUT0", [3], "BYTES")
        inp.set_data_from_numpy(np.array([b"a", b"", b"cc"], dtype=np.object_))
        assert client.infer("strings", [inp]).as_numpy("OUTPUT0").tolist() == [b"a", b"", b"cc"]


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

"""Differential: the native gRPC frontend answers byte-for-byte as the grpcio frontend (the reference).

The same raw request bytes go to two servers on the same repository over raw HTTP/2 connections; the
response messages must be identical bytes and the statuses identical (grpc-status and grpc-message).
Needs the native frontend; skipped without it.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from fastoip import _codec
from fastoip._proto import grpc_service_pb2 as pb
from fastoip._proto import health_pb2
from fastoip.demo import write_repository
from fastoip.types import InferInput, InferRequest, RequestedOutput
from h2raw import MODEL_INFER, SERVICE, CallResult, RawGrpcConnection, grpc_frame
from models import V2_TO_ONNX, datatype_sample, write_datatype_repository
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)


@dataclass
class Pair:
    reference: ServerProcess
    native: ServerProcess


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, native_frontend: str) -> Iterator[Pair]:
    root = write_repository(tmp_path_factory.mktemp("differential"))
    write_datatype_repository(root)
    with ServerProcess(root, grpc_frontend="grpcio") as reference, ServerProcess(
        root, grpc_frontend=native_frontend
    ) as native:
        yield Pair(reference, native)


def call(server: ServerProcess, method: str, payload: bytes, *, compressed: bool = False) -> CallResult:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        extra = (("grpc-encoding", "gzip"),) if compressed else ()
        stream_id = conn.start_call(method, extra=extra)
        body = grpc_frame(gzip.compress(payload), compressed=True) if compressed else grpc_frame(payload)
        conn.send_data(stream_id, body)
        result = conn.wait(stream_id, 60)
    assert result.finished, f"{method}: no answer within 60 s"
    return result


def assert_same_answer(pair: Pair, method: str, payload: bytes, *, compressed: bool = False,
                       same_message_text: bool = True) -> CallResult:
    want = call(pair.reference, method, payload, compressed=compressed)
    got = call(pair.native, method, payload, compressed=compressed)
    assert got.status == want.status, (got.status, got.message, want.status, want.message)
    if same_message_text:
        assert got.message == want.message
    assert got.messages == want.messages, "response payloads differ"
    assert got.headers.get("content-type", "").startswith("application/grpc")
    return want


# -- ModelInfer: valid requests -------------------------------------------------------------------
def infer_bytes(model: str, inputs: list[InferInput], **fields: object) -> bytes:
    return _codec.encode_infer_request(InferRequest(model, inputs=inputs, **fields))  # type: ignore[arg-type]


def simple(a: np.ndarray, b: np.ndarray, **fields: object) -> bytes:
    return infer_bytes(
        "simple", [InferInput("INPUT0", "INT32", a.shape, a), InferInput("INPUT1", "INT32", b.shape, b)], **fields
    )


ONES = np.ones((1, 16), np.int32)
RNG = np.random.default_rng(12)
VALID = {
    "simple": simple(np.arange(16, dtype=np.int32).reshape(1, 16), ONES),
    "simple-batch-5": simple(*RNG.integers(-9, 9, (2, 5, 16), dtype=np.int32)),
    "simple-id-version-output": simple(
        ONES, ONES, id="req-42", model_version="1", outputs=[RequestedOutput("OUTPUT1")]
    ),
    "mlp": infer_bytes("mlp", [InferInput("INPUT0", "FP32", (3, 256), RNG.standard_normal((3, 256), np.float32))]),
    "string": infer_bytes(
        "string_identity",
        [InferInput("INPUT0", "BYTES", (1, 3), np.array([[b"", b"\x00\xff", "é".encode()]], dtype=object))],
    ),
}


def typed_contents_request() -> bytes:
    request = pb.ModelInferRequest(model_name="simple", id="typed")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    return request.SerializeToString()


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_infer_is_byte_identical(pair: Pair, case: str) -> None:
    assert assert_same_answer(pair, MODEL_INFER, VALID[case]).status == 0


def test_typed_contents_is_byte_identical(pair: Pair) -> None:
    assert assert_same_answer(pair, MODEL_INFER, typed_contents_request()).status == 0


@pytest.mark.parametrize("datatype", sorted(V2_TO_ONNX))
def test_every_datatype_is_byte_identical(pair: Pair, datatype: str) -> None:
    data = datatype_sample(datatype)
    if datatype == "BF16":  # carried as raw 16-bit patterns: the upper halves of the FP32 values
        data = (data.view(np.uint32) >> 16).astype(np.uint16)
    payload = infer_bytes(f"identity_{datatype.lower()}", [InferInput("INPUT0", datatype, data.shape, data)])
    assert assert_same_answer(pair, MODEL_INFER, payload).status == 0


def test_gzip_request_is_byte_identical(pair: Pair) -> None:
    assert assert_same_answer(pair, MODEL_INFER, VALID["mlp"], compressed=True).status == 0


# -- ModelInfer: errors ---------------------------------------------------------------------------
GOOD = np.arange(16, dtype="<i4").tobytes()


def raw_request(model: str, inputs: Sequence[tuple[str, str, list[int], bytes | None]]) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw is not None:
            request.raw_input_contents.append(raw)
    return request.SerializeToString()


def mixed_contents() -> bytes:
    request = pb.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(GOOD)
    return request.SerializeToString()


BOTH = [("INPUT0", "INT32", [1, 16], GOOD), ("INPUT1", "INT32", [1, 16], GOOD)]
ERRORS = {
    "unknown-model": raw_request("nope", BOTH),
    "unknown-version": pb.ModelInferRequest(model_name="simple", model_version="7").SerializeToString(),
    "wrong-name": raw_request("simple", [("INPUTX", "INT32", [1, 16], GOOD), BOTH[1]]),
    "wrong-datatype": raw_request("simple", [("INPUT0", "FP32", [1, 16], GOOD), BOTH[1]]),
    "wrong-shape": raw_request(
        "simple", [("INPUT0", "INT32", [1, 8], GOOD[:32]), ("INPUT1", "INT32", [1, 8], GOOD[:32])]
    ),
    "byte-size": raw_request("simple", [("INPUT0", "INT32", [1, 16], GOOD[:60]), BOTH[1]]),
    "missing-input": raw_request("simple", [BOTH[0]]),
    "batch-too-big": raw_request(
        "simple", [("INPUT0", "INT32", [65, 16], GOOD * 65), ("INPUT1", "INT32", [65, 16], GOOD * 65)]
    ),
    "truncated": raw_request("simple", BOTH)[:-7],
    "garbage-varint": b"\xff" * 11,
    "garbage": bytes(range(256)) * 3,
    "mixed-contents": mixed_contents(),
    "empty": b"",
    "non-utf8-name": raw_request("sim\xe9ple", BOTH),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_are_identical(pair: Pair, case: str) -> None:
    assert assert_same_answer(pair, MODEL_INFER, ERRORS[case]).status != 0


def test_unknown_method_is_unimplemented_on_both(pair: Pair) -> None:
    # The status must match; the wording of a transport-level error is the transport's own.
    result = assert_same_answer(pair, SERVICE + "NoSuchMethod", b"", same_message_text=False)
    assert result.status == 12


# -- the other RPCs, where the answer is deterministic -------------------------------------------------
UNARY_CASES = {
    "ServerLive": pb.ServerLiveRequest(),
    "ServerReady": pb.ServerReadyRequest(),
    "ModelReady": pb.ModelReadyRequest(name="simple"),
    "ModelReady-missing": pb.ModelReadyRequest(name="nope"),
    "ServerMetadata": pb.ServerMetadataRequest(),
    "ModelMetadata": pb.ModelMetadataRequest(name="mlp"),
    "ModelMetadata-missing": pb.ModelMetadataRequest(name="nope"),
    "ModelConfig": pb.ModelConfigRequest(name="simple"),
    "ModelConfig-missing": pb.ModelConfigRequest(name="nope"),
    "RepositoryIndex": pb.RepositoryIndexRequest(),
    "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest(),
    "SystemSharedMemoryStatus-missing": pb.SystemSharedMemoryStatusRequest(name="nope"),
}


@pytest.mark.parametrize("case", sorted(UNARY_CASES))
def test_unary_rpcs_are_identical(pair: Pair, case: str) -> None:
    method = SERVICE + case.split("-")[0]
    assert_same_answer(pair, method, UNARY_CASES[case].SerializeToString())


@pytest.mark.parametrize("service", ["", "simple", "nope"])
def test_health_check_is_identical(pair: Pair, service: str) -> None:
    request = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    expected = 5 if service == "nope" else 0  # an unknown service is NOT_FOUND (grpc health spec)
    assert assert_same_answer(pair, "/grpc.health.v1.Health/Check", request).status == expected


# -- ModelStreamInfer ---------------------------------------------------------------------------
def test_stream_answers_are_identical(pair: Pair) -> None:
    """Responses may come in any order: the sets of response messages must be equal, byte for byte."""
    payloads = [VALID["simple"], ERRORS["wrong-datatype"], VALID["mlp"], ERRORS["garbage"], VALID["string"],
                ERRORS["unknown-model"], typed_contents_request()]
    body = b"".join(grpc_frame(p) for p in payloads)

    def stream(server: ServerProcess) -> CallResult:
        with RawGrpcConnection(server.grpc_port) as conn:
            conn.handshake()
            stream_id = conn.start_call(SERVICE + "ModelStreamInfer")
            conn.send_data(stream_id, body)
            return conn.wait(stream_id, 60)

    want, got = stream(pair.reference), stream(pair.native)
    assert want.status == got.status == 0, (want.message, got.message)
    assert len(want.messages) == len(payloads)
    assert sorted(got.messages) == sorted(want.messages)


def test_both_servers_still_serve(pair: Pair) -> None:
    for server in (pair.reference, pair.native):
        assert server.proc is not None and server.proc.poll() is None
        assert call(server, MODEL_INFER, VALID["simple"]).status == 0

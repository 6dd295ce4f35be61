"""End to end over gRPC: a real fastoip process, tritonclient.grpc and the project's own stubs."""

from __future__ import annotations

import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from fastoip._proto import grpc_service_pb2 as pb
from fastoip._proto import grpc_service_pb2_grpc as pb_grpc
from fastoip._proto import health_pb2, health_pb2_grpc
from models import datatype_sample, identity_model_bytes, write_datatype_repository, write_model
from serverproc import ServerProcess
from simple_model import simple_inputs


@pytest.fixture(scope="module")
def server(frontend_server: ServerProcess) -> ServerProcess:
    """This module runs against every selected gRPC frontend (conftest's ``grpc_frontend``)."""
    return frontend_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> tg.InferenceServerClient:
    return tg.InferenceServerClient(server.grpc_url)


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> pb_grpc.GRPCInferenceServiceStub:
    channel = grpc.insecure_channel(server.grpc_url)
    return pb_grpc.GRPCInferenceServiceStub(channel)


def assert_simple_works(client: tg.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    result = client.infer("simple", simple_inputs(tg, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# -- health and metadata --------------------------------------------------------------
def test_health(client: tg.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "7")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client: tg.InferenceServerClient) -> None:
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "fastoip"
    assert meta["version"]
    assert "statistics" in meta["extensions"]
    assert "model_configuration" in meta["extensions"]


def test_model_metadata_has_batch_dim(client: tg.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple", as_json=True)
    assert meta["name"] == "simple"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]),
        ("INPUT1", "INT32", ["-1", "16"]),
    ]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_model_config(client: tg.InferenceServerClient) -> None:
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["name"] == "mlp"
    assert config["max_batch_size"] == 64
    assert "dynamic_batching" in config
    assert config["input"][0]["dims"] == ["256"]
    auto = client.get_model_config("identity_fp32", as_json=True)["config"]
    assert auto["max_batch_size"] == 4  # auto-completed as Triton: dynamic first dim, default-max-batch-size 4
    assert auto["input"][0]["data_type"] == "TYPE_FP32"


def test_unknown_model_metadata_is_not_found(client: tg.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no_such_model")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.value.message()


# -- inference --------------------------------------------------------------------------
def test_infer_simple(client: tg.InferenceServerClient) -> None:
    assert_simple_works(client)


def test_infer_batch_and_requested_output(client: tg.InferenceServerClient) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (5, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (5, 16), dtype=np.int32)
    result = client.infer(
        "simple", simple_inputs(tg, a, b), outputs=[tg.InferRequestedOutput("OUTPUT1")], request_id="req-7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    assert result.get_response().id == "req-7"
    assert result.get_response().model_version == "1"


def test_infer_mlp_matches_onnxruntime(client: tg.InferenceServerClient, demo_repo: Path) -> None:
    import onnxruntime as ort

    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    inp = tg.InferInput("INPUT0", [3, 256], "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-5)


def test_large_tensor_round_trip(client: tg.InferenceServerClient) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224)).astype(np.float32)
    inp = tg.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("image_identity", [inp]).as_numpy("OUTPUT0"), x)


def test_bytes_round_trip_is_bit_exact(client: tg.InferenceServerClient) -> None:
    values = np.array([[b"", b"\x00", b"\xff\xfe\x00", "héllo".encode(), b"plain"]], dtype=object)
    inp = tg.InferInput("INPUT0", list(values.shape), "BYTES")
    inp.set_data_from_numpy(values)
    got = client.infer("string_identity", [inp]).as_numpy("OUTPUT0")
    assert got.tolist() == values.tolist()


# -- every datatype, through ONNX identity models -------------------------------------------
@pytest.fixture(scope="module")
def datatype_server(tmp_path_factory: pytest.TempPathFactory, grpc_frontend: str):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("datatypes")
    names = write_datatype_repository(root)
    with ServerProcess(root, grpc_frontend=grpc_frontend) as proc:
        yield proc, names


@pytest.mark.parametrize(
    "datatype",
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"],
)
def test_every_datatype_round_trips(datatype_server, datatype: str) -> None:  # type: ignore[no-untyped-def]
    proc, names = datatype_server
    client = tg.InferenceServerClient(proc.grpc_url)
    if not client.is_model_ready(names[datatype]):
        index = client.get_model_repository_index(as_json=True)["models"]
        reason = [m for m in index if m["name"] == names[datatype]]
        pytest.fail(f"{names[datatype]} not ready: {reason}")
    data = datatype_sample(datatype)
    if datatype == "BF16":
        import ml_dtypes  # tritonclient >= 2.67 carries BF16 as ml_dtypes.bfloat16

        data = data.astype(ml_dtypes.bfloat16)
    inp = tg.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    got = client.infer(names[datatype], [inp]).as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    elif datatype == "FP16":
        assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()  # bit-exact: NaN, Inf, -0.0
    elif datatype == "BF16":
        assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()  # bit-exact
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


# -- the project's own stubs: every RPC answers ----------------------------------------------
def test_stub_health_metadata_and_infer(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="simple")).ready
    assert stub.ServerMetadata(pb.ServerMetadataRequest()).name == "fastoip"
    assert stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp")).inputs[0].shape == [-1, 256]
    assert stub.ModelConfig(pb.ModelConfigRequest(name="simple")).config.max_batch_size == 64
    request = pb.ModelInferRequest(model_name="simple", id="x")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    response = stub.ModelInfer(request)
    assert response.id == "x"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == [2 * i for i in range(16)]
    assert np.frombuffer(response.raw_output_contents[1], "<i4").tolist() == [0] * 16


def test_stub_statistics_and_index(stub: pb_grpc.GRPCInferenceServiceStub, client: tg.InferenceServerClient) -> None:
    assert_simple_works(client)
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="simple")).model_stats
    assert stats[0].name == "simple" and stats[0].inference_stats.success.count >= 1
    assert stats[0].execution_count >= 1
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest()).models
    assert {m.name for m in index} >= {"simple", "mlp", "identity_fp32", "image_identity", "string_identity"}
    assert all(m.state == "READY" for m in index)


def test_grpc_health_service(server: ServerProcess) -> None:
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.grpc_url))
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest()).status == serving
    assert health.Check(health_pb2.HealthCheckRequest(service="simple")).status == serving
    # The health protocol: an unknown service is NOT_FOUND (SERVICE_UNKNOWN is for Watch only).
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nope" in (info.value.details() or "")
    assert health.Check(health_pb2.HealthCheckRequest(service="simple")).status == serving


# -- bad input: the right status, a message naming the problem, and the server stays up ----------
def raw_request(**fields) -> bytes:  # type: ignore[no-untyped-def]
    request = pb.ModelInferRequest(model_name=fields.pop("model", "simple"))
    for name, datatype, shape, raw in fields.pop("inputs"):
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw is not None:
            request.raw_input_contents.append(raw)
    return request.SerializeToString()


GOOD = np.arange(16, dtype="<i4").tobytes()


@pytest.mark.parametrize(
    "payload, code, words",
    [
        (raw_request(model="nope", inputs=[("INPUT0", "INT32", [1, 16], GOOD)]), "NOT_FOUND", ["nope"]),
        (
            raw_request(inputs=[("INPUTX", "INT32", [1, 16], GOOD), ("INPUT1", "INT32", [1, 16], GOOD)]),
            "INVALID_ARGUMENT",
            ["INPUTX"],
        ),
        (
            raw_request(inputs=[("INPUT0", "FP32", [1, 16], GOOD), ("INPUT1", "INT32", [1, 16], GOOD)]),
            "INVALID_ARGUMENT",
            ["INPUT0", "FP32", "INT32"],
        ),
        (
            raw_request(inputs=[("INPUT0", "INT32", [1, 8], GOOD[:32]), ("INPUT1", "INT32", [1, 8], GOOD[:32])]),
            "INVALID_ARGUMENT",
            ["INPUT0", "16"],
        ),
        (
            raw_request(inputs=[("INPUT0", "INT32", [1, 16], GOOD[:60]), ("INPUT1", "INT32", [1, 16], GOOD)]),
            "INVALID_ARGUMENT",
            ["INPUT0", "64", "60"],
        ),
        (raw_request(inputs=[("INPUT0", "INT32", [1, 16], GOOD)]), "INVALID_ARGUMENT", ["INPUT1"]),
        (
            raw_request(inputs=[("INPUT0", "INT32", [65, 16], GOOD * 65), ("INPUT1", "INT32", [65, 16], GOOD * 65)]),
            "INVALID_ARGUMENT",
            ["batch", "64"],
        ),
        (raw_request(inputs=[("INPUT0", "INT32", [1, 16], GOOD), ("INPUT1", "INT32", [1, 16], GOOD)])[:-7], "INVALID_ARGUMENT", []),
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "INVALID_ARGUMENT", []),
        (bytes(range(256)) * 3, "INVALID_ARGUMENT", []),
    ],
    ids=["unknown-model", "wrong-name", "wrong-datatype", "wrong-shape", "byte-size", "missing-input",
         "batch-too-big", "truncated", "garbage-varint", "garbage"],
)
def test_bad_input_gets_clear_error(server: ServerProcess, client, payload: bytes, code: str, words: list) -> None:  # type: ignore[no-untyped-def]
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as err:
        call(payload, timeout=10)
    assert err.value.code().name == code, err.value.details()
    for word in words:
        assert word in err.value.details()
    assert_simple_works(client)


def test_mixed_raw_and_typed_contents_rejected(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    request = pb.ModelInferRequest(model_name="simple")
    first = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    first.contents.int_contents.extend(range(16))
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(GOOD)
    call = grpc.insecure_channel(server.grpc_url).unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as err:
        call(request.SerializeToString(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in err.value.details()
    assert_simple_works(client)


# -- repository behaviour: versions, policy, a model that fails to load ---------------------------------
def test_versions_policy_and_failed_model(tmp_path: Path, grpc_frontend: str) -> None:
    data = identity_model_bytes(1, [4], "versioned")
    for version in (1, 2, 3):
        write_model(tmp_path, "latest_only", data, version)
        write_model(
            tmp_path, "all_versions", data, version,
            config='name: "all_versions"\nmax_batch_size: 8\nversion_policy { all { } }\n',
        )
    write_model(tmp_path, "broken", b"this is not an onnx model")
    with ServerProcess(tmp_path, grpc_frontend=grpc_frontend) as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        assert client.is_server_live()
        assert not client.is_server_ready()  # strict readiness: one model failed
        assert client.get_model_metadata("latest_only", as_json=True)["versions"] == ["3"]
        assert not client.is_model_ready("latest_only", "2")
        assert client.get_model_metadata("all_versions", as_json=True)["versions"] == ["1", "2", "3"]
        x = np.ones((1, 4), np.float32)
        inp = tg.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("all_versions", [inp], model_version="2")
        assert result.get_response().model_version == "2"
        assert client.infer("all_versions", [inp]).get_response().model_version == "3"
        assert not client.is_model_ready("broken")
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "onnxruntime could not load" in index["broken"]["reason"]
        with pytest.raises(InferenceServerException) as err:
            client.infer("broken", [inp])
        assert err.value.status() == "StatusCode.UNAVAILABLE"


def test_bf16_bits_helper_matches_tritonclient() -> None:
    from fastoip.datatypes import bf16_bits_from_float32, float32_from_bf16_bits

    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    expected = [struct.unpack("<H", struct.pack("<f", v)[2:4])[0] for v in values]
    assert bf16_bits_from_float32(values).tolist() == expected
    np.testing.assert_array_equal(float32_from_bf16_bits(bf16_bits_from_float32(values)), values)

"""tritonclient.http (sync and aio) against fastoip's HTTP endpoint, and parity with tritonclient.grpc.

One server serves an identity model per V2 datatype (``tests/models.py``:
``identity_<datatype>``, INPUT0 -> OUTPUT0, dims [4], BYTES [-1]); another the
demo models (their ``identity_fp32`` has other dims, so they cannot share a
repository).  Every datatype goes through with ``binary_data`` True and
False, on the sync and the asyncio client.  FP16 and BF16 have no JSON form:
with binary_data=False the server answers 400 for FP16 and tritonclient
itself refuses BF16.  onnxruntime 1.31 CPU serves Identity for every ONNX
type, so nothing is skipped here; a model that does not load would be skipped
with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from models import V2_TO_ONNX, write_datatype_repository
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

DATATYPES = list(V2_TO_ONNX)
BINARY_ONLY = {"FP16", "BF16"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The datatype server: identity_<datatype> for every V2 datatype."""
    root = tmp_path_factory.mktemp("datatype-repo")
    write_datatype_repository(root)
    with ServerProcess(root, http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def demo_server(demo_repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess):  # type: ignore[no-untyped-def]
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess):  # type: ignore[no-untyped-def]
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def demo_client(demo_server: ServerProcess):  # type: ignore[no-untyped-def]
    c = httpclient.InferenceServerClient(demo_server.http_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def demo_grpc_client(demo_server: ServerProcess):  # type: ignore[no-untyped-def]
    c = grpcclient.InferenceServerClient(demo_server.grpc_url)
    yield c
    c.close()


def model_for(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def ready_or_skip(client: httpclient.InferenceServerClient, model: str) -> None:
    if not client.is_model_ready(model):
        reason = next((e.get("reason", "") for e in client.get_model_repository_index() if e["name"] == model), "")
        pytest.skip(f"onnxruntime CPU cannot serve {model}: {reason}")


def sample(datatype: str, seed: int = 0) -> np.ndarray:
    """A [2, 4] tensor (BYTES: [2, 3]) of ``datatype`` that includes the type's extremes."""
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        return np.array([[b"alpha", "wörld".encode(), b""], [b"x" * 100, b"tab\tsep", "日本".encode()]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False, True, True], [False, False, True, False]])
    if datatype == "BF16":
        return rng.standard_normal((2, 4)).astype(ml_dtypes.bfloat16)
    dtype = np.dtype({"FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}.get(datatype, datatype.lower()))
    if dtype.kind == "f":
        values = rng.standard_normal((2, 4)).astype(dtype)
        values[0, 0] = np.finfo(dtype).max
        values[0, 1] = np.finfo(dtype).tiny
        return values
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, size=(2, 4), dtype=dtype, endpoint=True)
    values[0, 0], values[0, 1] = info.min, info.max
    return values


def normalized(array: np.ndarray, datatype: str) -> Any:
    """What to compare: BYTES as a list of bytes (JSON results come back as str)."""
    if datatype == "BYTES":
        return [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)]
    return array


def assert_same(got: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert got is not None
    assert tuple(got.shape) == tuple(expected.shape), (got.shape, expected.shape)
    if datatype == "BYTES":
        assert normalized(got, datatype) == normalized(expected, datatype)
    else:
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        assert got.tobytes() == expected.tobytes()  # bit-exact


def http_request(module: Any, data: np.ndarray, datatype: str, binary: bool) -> tuple[list, list]:
    inp = module.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    return [inp], [module.InferRequestedOutput("OUTPUT0", binary_data=binary)]


def infer_aio(url: str, model: str, inputs: list, outputs: list | None, **kwargs: Any) -> Any:
    async def run() -> Any:
        async with aiohttpclient.InferenceServerClient(url) as c:
            return await c.infer(model, inputs, outputs=outputs, **kwargs)

    return asyncio.run(run())


# --------------------------------------------------------------------------- #
# Every datatype, binary and JSON, sync and aio                               #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("flavor", ["sync", "aio"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_every_datatype(server: ServerProcess, client: httpclient.InferenceServerClient, datatype: str,
                                 binary: bool, flavor: str) -> None:
    model = model_for(datatype)
    ready_or_skip(client, model)
    data = sample(datatype)
    if not binary and datatype == "BF16":
        with pytest.raises(InferenceServerException, match="binary"):
            http_request(httpclient, data, datatype, binary)  # tritonclient refuses BF16 as JSON itself
        return
    inputs, outputs = http_request(aiohttpclient if flavor == "aio" else httpclient, data, datatype, binary)
    if flavor == "aio":
        run = lambda: infer_aio(server.http_url, model, inputs, outputs)  # noqa: E731
    else:
        run = lambda: client.infer(model, inputs, outputs=outputs)  # noqa: E731
    if not binary and datatype in BINARY_ONLY:
        with pytest.raises(InferenceServerException) as error:
            run()
        assert error.value.status() == "400"
        assert datatype in error.value.message() and "INPUT0" in error.value.message()
        return
    result = run()
    assert_same(result.as_numpy("OUTPUT0"), data, datatype)
    response = result.get_response()
    assert response["model_name"] == model and response["model_version"] == "1"


@pytest.mark.parametrize("datatype", DATATYPES)
def test_no_requested_outputs_come_back_binary(server: ServerProcess, client: httpclient.InferenceServerClient,
                                               datatype: str) -> None:
    """Without outputs tritonclient sets binary_data_output=true: every output is binary."""
    model = model_for(datatype)
    ready_or_skip(client, model)
    data = sample(datatype, seed=1)
    inputs, _ = http_request(httpclient, data, datatype, True)
    result = client.infer(model, inputs, request_id="no-outputs")
    assert_same(result.as_numpy("OUTPUT0"), data, datatype)
    out = result.get_output("OUTPUT0")
    assert "binary_data_size" in out["parameters"] and "data" not in out
    assert result.get_response()["id"] == "no-outputs"
    result = infer_aio(server.http_url, model, inputs, None)
    assert_same(result.as_numpy("OUTPUT0"), data, datatype)


@pytest.mark.parametrize("datatype", sorted(BINARY_ONLY))
def test_binary_only_output_as_json_is_400(client: httpclient.InferenceServerClient, datatype: str) -> None:
    model = model_for(datatype)
    ready_or_skip(client, model)
    inputs, _ = http_request(httpclient, sample(datatype), datatype, True)
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert error.value.status() == "400"
    assert "OUTPUT0" in error.value.message() and datatype in error.value.message()


# --------------------------------------------------------------------------- #
# BYTES: empty, NUL and non-UTF-8 elements                                    #
# --------------------------------------------------------------------------- #

AWKWARD_BYTES = np.array([[b"", b"\x00", b"a\x00b", b"\xff\xfe\xfd", "héllo".encode(), b"\x80" * 300]], dtype=object)


@pytest.mark.parametrize("flavor", ["sync", "aio"])
def test_bytes_empty_nul_non_utf8_binary(server: ServerProcess, demo_server: ServerProcess, flavor: str) -> None:
    module = aiohttpclient if flavor == "aio" else httpclient
    inputs, outputs = http_request(module, AWKWARD_BYTES, "BYTES", True)
    for url, model in ((server.http_url, "identity_bytes"), (demo_server.http_url, "string_identity")):
        if flavor == "aio":
            result = infer_aio(url, model, inputs, outputs)
        else:
            with httpclient.InferenceServerClient(url) as c:
                result = c.infer(model, inputs, outputs=outputs)
        got = result.as_numpy("OUTPUT0")
        assert got.shape == AWKWARD_BYTES.shape
        assert list(got.reshape(-1)) == list(AWKWARD_BYTES.reshape(-1))


def test_non_utf8_bytes_output_as_json_is_a_clear_400(client: httpclient.InferenceServerClient) -> None:
    inputs, _ = http_request(httpclient, AWKWARD_BYTES, "BYTES", True)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity_bytes", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert error.value.status() == "400"
    assert "OUTPUT0" in error.value.message() and "UTF-8" in error.value.message()
    # The server keeps serving.
    inputs, outputs = http_request(httpclient, AWKWARD_BYTES, "BYTES", True)
    assert list(client.infer("identity_bytes", inputs, outputs=outputs).as_numpy("OUTPUT0").reshape(-1)) == list(
        AWKWARD_BYTES.reshape(-1)
    )


# --------------------------------------------------------------------------- #
# HTTP and gRPC give identical outputs                                        #
# --------------------------------------------------------------------------- #


def grpc_infer(grpc_client: grpcclient.InferenceServerClient, model: str, named: dict[str, tuple[np.ndarray, str]],
               outputs: list[str]) -> dict[str, np.ndarray]:
    inputs = []
    for name, (data, datatype) in named.items():
        inp = grpcclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    result = grpc_client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


def http_infer(client: httpclient.InferenceServerClient, model: str, named: dict[str, tuple[np.ndarray, str]],
               outputs: list[str], binary: bool = True) -> dict[str, np.ndarray]:
    inputs = []
    for name, (data, datatype) in named.items():
        inp = httpclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data, binary_data=binary)
        inputs.append(inp)
    result = client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


@pytest.mark.parametrize("datatype", DATATYPES)
def test_http_and_grpc_agree_on_every_datatype(client: httpclient.InferenceServerClient,
                                               grpc_client: grpcclient.InferenceServerClient, datatype: str) -> None:
    model = model_for(datatype)
    ready_or_skip(client, model)
    data = AWKWARD_BYTES if datatype == "BYTES" else sample(datatype, seed=2)
    named = {"INPUT0": (data, datatype)}
    over_http = http_infer(client, model, named, ["OUTPUT0"])["OUTPUT0"]
    over_grpc = grpc_infer(grpc_client, model, named, ["OUTPUT0"])["OUTPUT0"]
    assert_same(over_http, over_grpc, datatype)
    assert_same(over_http, data, datatype)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_and_grpc_agree_on_demo_models(demo_client: httpclient.InferenceServerClient,
                                            demo_grpc_client: grpcclient.InferenceServerClient, binary: bool) -> None:
    client, grpc_client = demo_client, demo_grpc_client
    rng = np.random.default_rng(3)
    cases = [
        ("simple", {"INPUT0": (rng.integers(-1000, 1000, (3, 16), dtype=np.int32), "INT32"),
                    "INPUT1": (rng.integers(-1000, 1000, (3, 16), dtype=np.int32), "INT32")}, ["OUTPUT0", "OUTPUT1"]),
        ("identity_fp32", {"INPUT0": (rng.standard_normal((2, 16)).astype(np.float32), "FP32")}, ["OUTPUT0"]),
        ("mlp", {"INPUT0": (rng.standard_normal((4, 256)).astype(np.float32), "FP32")}, ["OUTPUT0"]),
        ("string_identity", {"INPUT0": (np.array([[b"one", b"two"]], dtype=object), "BYTES")}, ["OUTPUT0"]),
    ]
    if binary:  # 602,112 bytes an item: JSON would be slow for nothing
        cases.append(("image_identity", {"INPUT0": (rng.standard_normal((2, 3, 224, 224)).astype(np.float32), "FP32")},
                      ["OUTPUT0"]))
    for model, named, outputs in cases:
        over_http = http_infer(client, model, named, outputs, binary)
        over_grpc = grpc_infer(grpc_client, model, named, outputs)
        for name in outputs:
            datatype = "BYTES" if over_grpc[name].dtype == object else "x"
            assert_same(over_http[name], over_grpc[name], datatype)
    simple = cases[0][1]
    sums = http_infer(client, "simple", simple, ["OUTPUT0"], binary)["OUTPUT0"]
    assert np.array_equal(sums, simple["INPUT0"][0] + simple["INPUT1"][0])


# --------------------------------------------------------------------------- #
# Compression, server and model APIs                                          #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("request_algorithm,response_algorithm", [("gzip", "gzip"), ("deflate", "deflate"),
                                                                   ("gzip", None), (None, "deflate")])
def test_compression(demo_server: ServerProcess, demo_client: httpclient.InferenceServerClient,
                     request_algorithm: str | None, response_algorithm: str | None) -> None:
    server, client = demo_server, demo_client
    data = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)
    inputs, outputs = http_request(httpclient, data, "FP32", True)
    result = client.infer("identity_fp32", inputs, outputs=outputs, request_compression_algorithm=request_algorithm,
                          response_compression_algorithm=response_algorithm)
    assert_same(result.as_numpy("OUTPUT0"), data, "FP32")
    result = infer_aio(server.http_url, "identity_fp32", inputs, outputs,
                       request_compression_algorithm=request_algorithm, response_compression_algorithm=response_algorithm)
    assert_same(result.as_numpy("OUTPUT0"), data, "FP32")


def test_server_and_model_apis(demo_client: httpclient.InferenceServerClient) -> None:
    client = demo_client
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("nope")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "fastoip" and "statistics" in metadata["extensions"]
    model = client.get_model_metadata("simple", "1")
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [256]
    assert "dynamic_batching" in config
    client.infer("simple", [_int32_input("INPUT0"), _int32_input("INPUT1")])
    stats = client.get_inference_statistics("simple")
    assert stats["model_stats"][0]["name"] == "simple" and stats["model_stats"][0]["inference_count"] >= 1
    assert len(client.get_inference_statistics()["model_stats"]) == 5
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["simple"]["state"] == "READY"
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("nope")
    assert error.value.status() == "404" and "nope" in error.value.message()


def _int32_input(name: str) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, [1, 16], "INT32")
    inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inp


@pytest.mark.parametrize("flavor", ["sync", "aio"])
def test_load_and_unload_with_tritonclient(tmp_path: Path, flavor: str) -> None:
    from fastoip.demo import write_repository

    root = write_repository(tmp_path / "repo", names=["identity_fp32"])
    override = json.dumps({"name": "identity_fp32", "platform": "onnxruntime_onnx", "max_batch_size": 2})
    with ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "*", http=True) as proc:
        if flavor == "sync":
            c = httpclient.InferenceServerClient(proc.http_url)
            c.unload_model("identity_fp32")
            assert not c.is_model_ready("identity_fp32")
            c.load_model("identity_fp32", config=override)
            assert c.is_model_ready("identity_fp32")
            assert c.get_model_config("identity_fp32")["max_batch_size"] == 2
            c.close()
        else:
            async def run() -> None:
                async with aiohttpclient.InferenceServerClient(proc.http_url) as c:
                    await c.unload_model("identity_fp32")
                    assert not await c.is_model_ready("identity_fp32")
                    await c.load_model("identity_fp32", config=override)
                    assert await c.is_model_ready("identity_fp32")
                    assert (await c.get_model_config("identity_fp32"))["max_batch_size"] == 2

            asyncio.run(run())


def test_many_concurrent_aio_requests(demo_server: ServerProcess) -> None:
    """Requests in flight on many keep-alive connections at once; each gets its own answer."""
    server = demo_server
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(64)]

    async def run() -> list:
        async with aiohttpclient.InferenceServerClient(server.http_url, conn_limit=16) as c:
            async def one(x: np.ndarray) -> np.ndarray:
                inp = aiohttpclient.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                return (await c.infer("mlp", [inp])).as_numpy("OUTPUT0")

            return await asyncio.gather(*(one(x) for x in batches))

    results = asyncio.run(run())
    c = httpclient.InferenceServerClient(server.http_url)
    try:
        for x, got in zip(batches, results, strict=False):
            inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            expected = c.infer("mlp", [inp]).as_numpy("OUTPUT0")
            assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
    finally:
        c.close()

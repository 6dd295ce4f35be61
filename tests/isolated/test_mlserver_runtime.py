"""MLServer runtimes (``mlserver.MLModel`` subclasses) and MLServer's layouts, served unchanged by a real server.

The runtimes are written here the way MLServer's docs write them; requests are encoded with mlserver's own
codecs and sent over HTTP (JSON) and gRPC (tritonclient, including a stream), and the answers decoded
with the same codecs.  model-settings.json validation and the missing-extra message need no mlserver.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastoip

try:
    import mlserver  # noqa: F401
    from mlserver.codecs import Base64Codec, DatetimeCodec, NumpyCodec, PandasCodec, StringCodec
    from mlserver.types import InferenceRequest, InferenceResponse
except ImportError:
    HAS_MLSERVER = False
else:
    HAS_MLSERVER = True

needs_mlserver = pytest.mark.skipif(
    not HAS_MLSERVER, reason="mlserver is not installed (pip install 'fastoip[mlserver]')"
)

JSON_RUNTIME = '''
import json
from mlserver import MLModel, types
from mlserver.codecs import StringCodec


class JsonHelloWorldModel(MLModel):
    async def load(self) -> bool:
        self.greeting = "Hello from the server."
        return True

    async def predict(self, payload: types.InferenceRequest) -> types.InferenceResponse:
        request = {i.name: json.loads("".join(self.decode(i, default_codec=StringCodec))) for i in payload.inputs}
        answer = json.dumps({"request": request, "server_response": self.greeting}).encode("UTF-8")
        return types.InferenceResponse(
            id=payload.id, model_name=self.name, model_version=self.version,
            outputs=[types.ResponseOutput(name="echo_response", shape=[len(answer)], datatype="BYTES",
                                          data=[answer], parameters=types.Parameters(content_type="str"))],
        )
'''

SUM_RUNTIME = '''
import mlserver
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class SumModel(MLModel):
    async def load(self) -> bool:
        uri = await get_model_uri(self.settings)
        with open(uri) as f:
            self.offset = float(f.read())
        self.scale = self.settings.parameters.extra["scale"]
        self.prefix = self.settings.parameters.extra.get("prefix", "sum")
        mlserver.register(f"{self.prefix}_calls", "predict calls of the sum model")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        total = x.sum(axis=-1, keepdims=True) * self.scale + self.offset
        mlserver.log(**{f"{self.prefix}_calls": 1, f"{self.prefix}_rows": len(x)})
        return InferenceResponse(model_name=self.name, model_version=self.version,
                                 outputs=[NumpyCodec.encode_output("total", total.astype(np.float32))])
'''

STREAM_RUNTIME = '''
from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceResponse


class Counter(MLModel):
    async def predict_stream(self, payloads):
        async for payload in payloads:
            word = StringCodec.decode_input(payload.inputs[0])[0]
            for i in range(3):
                yield InferenceResponse(model_name=self.name,
                                        outputs=[StringCodec.encode_output("out", [f"{word}-{i}"])])
'''

ECHO_RUNTIME = '''
import json

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, Parameters, RequestOutput


class Echo(MLModel):
    """Decodes the request as its content types say and encodes the decoded value back (a codec round trip)."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        # MLServer's content-type example prints each input this way: its numeric data must be plain lists.
        json.dumps([i.dict() for i in payload.inputs if i.datatype != "BYTES"])
        if payload.parameters is not None and payload.parameters.content_type:
            decoded = self.decode_request(payload)
            if hasattr(decoded, "dtypes"):  # mlserver 1.7's PandasCodec needs pandas 3's str columns as object
                decoded = decoded.astype({c: object for c, t in decoded.dtypes.items() if t.kind not in "biuf"})
            return self.encode_response(decoded)
        outputs = []
        for i in payload.inputs:
            content_type = i.parameters.content_type if i.parameters else None
            wanted = RequestOutput(name=i.name, parameters=Parameters(content_type=content_type))
            outputs.append(self.encode(self.decode(i), wanted))
        return InferenceResponse(model_name=self.name, outputs=outputs)
'''

ROWS_RUNTIME = '''
import asyncio

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, Parameters


class Rows(MLModel):
    """Doubles x and says how many rows the call it ran in had (several when requests were merged)."""

    async def load(self) -> bool:
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()  # bound to the loop the runtime lives on
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        assert asyncio.get_running_loop() is self.loop
        async with self.lock:
            await asyncio.sleep(0)
        x = NumpyCodec.decode_input(payload.inputs[0])
        rows = NumpyCodec.encode_output("rows", np.full((len(x), 1), len(x), dtype=np.int32))
        if len(x) > 1:  # a per-row parameter, as MLServer's batch split reads them
            rows.parameters = Parameters(content_type="np", tag=[f"row{i}" for i in range(len(x))])
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("y", x * 2), rows])
'''

CRASHY_RUNTIME = '''
import os

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceResponse


class Crashy(MLModel):
    """Answers its process id; "exit" ends its process, "raise" fails the request."""

    async def predict(self, payload):
        word = StringCodec.decode_input(payload.inputs[0])[0]
        if word == "exit":
            os._exit(3)
        if word == "raise":
            raise ValueError("asked to fail")
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output("pid", np.array([os.getpid()], dtype=np.int64))])
'''

PLAIN_IMPORT = '''
from mlserver import MLModel


class Plain(MLModel):
    pass
'''


def settings(**fields: Any) -> str:
    return json.dumps(fields)


def write_layout(root: Path) -> Path:
    """MLServer's layouts in one repository: settings at the root, nested folders, a Triton-level folder."""
    root.mkdir(parents=True)
    (root / "models.py").write_text(JSON_RUNTIME)
    (root / "model-settings.json").write_text(settings(name="json-hello", implementation="models.JsonHelloWorldModel"))
    in_workers = {"fastoip_hosting": "process"}
    (root / "json-worker").mkdir()
    (root / "json-worker" / "models.py").write_text(JSON_RUNTIME)
    (root / "json-worker" / "model-settings.json").write_text(
        settings(name="json-worker", implementation="models.JsonHelloWorldModel", parameters=in_workers))
    for name, folder, hosting, prefix in (("summer", "sum", {}, "sum"), ("summer-w", "sum-w", in_workers, "wsum")):
        nested = root / "group" / folder
        nested.mkdir(parents=True)
        (nested / "runtime.py").write_text(SUM_RUNTIME)
        (nested / "offset.txt").write_text("0.5")
        (nested / "model-settings.json").write_text(settings(
            name=name, implementation="runtime.SumModel", parallel_workers=2,
            parameters={"uri": "./offset.txt", "version": "3", "extra": {"scale": 2.0, "prefix": prefix}, **hosting},
            inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
        ))
    # a Triton-config model beside them keeps Triton's checks
    from onnx import TensorProto

    from models import identity_model_bytes, write_model

    write_model(root, "triton-text", identity_model_bytes(TensorProto.STRING, [1]),
                config='platform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    for name, source, cls, parameters in (
        ("stream", STREAM_RUNTIME, "Counter", {}), ("echo", ECHO_RUNTIME, "Echo", {}),
        ("stream-w", STREAM_RUNTIME, "Counter", in_workers), ("echo-w", ECHO_RUNTIME, "Echo", in_workers),
        ("crashy", CRASHY_RUNTIME, "Crashy", in_workers),
    ):
        (root / name).mkdir()
        (root / name / "runtime.py").write_text(source)
        (root / name / "model-settings.json").write_text(
            settings(name=name, implementation=f"runtime.{cls}", parameters=parameters))
    x = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    for name, extra in (("batched", {"max_batch_size": 4, "max_batch_time": 5.0}),
                        ("unbatched", {"max_batch_size": 4, "max_batch_time": 0}),
                        ("shared-loop", {"parameters": {"fastoip_event_loop": "shared"}}),
                        ("batched-w", {"max_batch_size": 4, "max_batch_time": 5.0, "parameters": in_workers})):
        (root / name).mkdir()
        (root / name / "runtime.py").write_text(ROWS_RUNTIME)
        (root / name / "model-settings.json").write_text(
            settings(name=name, implementation="runtime.Rows", inputs=x, **extra))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if not HAS_MLSERVER:
        pytest.skip("mlserver is not installed")
    root = write_layout(tmp_path_factory.mktemp("mlserver") / "repository")
    with fastoip.Server(root, metrics=True) as server:
        yield server


def post(server: fastoip.Server, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(server: fastoip.Server, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def infer(server: fastoip.Server, model: str, request: InferenceRequest) -> InferenceResponse:
    # as MLServer's REST clients send it: pydantic's JSON (bytes as UTF-8 strings)
    status, doc = post(server, f"/v2/models/{model}/infer", request.model_dump_json(exclude_none=True).encode())
    assert status == 200, doc
    return InferenceResponse.model_validate(doc)


@needs_mlserver
def test_layouts_load_every_model(server: fastoip.Server) -> None:
    status, index = post(server, "/v2/repository/index", {})
    assert status == 200
    states = {entry["name"]: entry.get("state") for entry in index}
    assert states == {"json-hello": "READY", "summer": "READY", "stream": "READY", "echo": "READY",
                      "triton-text": "READY", "batched": "READY", "unbatched": "READY", "shared-loop": "READY",
                      "json-worker": "READY", "summer-w": "READY", "stream-w": "READY", "echo-w": "READY",
                      "crashy": "READY", "batched-w": "READY"}
    assert get(server, "/v2/health/ready") == (200, {"ready": True})


@needs_mlserver
@pytest.mark.parametrize("model", ["json-hello", "json-worker"])
def test_custom_json_runtime_with_its_readme_request(server: fastoip.Server, model: str) -> None:
    text = json.dumps({"name": "Foo Bar", "message": "Hello from Client (REST)!"})
    # MLServer's README sends shape [len(text)] with one element
    body = {"inputs": [{"name": "echo_request", "shape": [len(text)], "datatype": "BYTES", "data": [text]}]}
    status, doc = post(server, f"/v2/models/{model}/infer", body)
    assert status == 200, doc
    answer = json.loads(doc["outputs"][0]["data"][0])
    assert answer == {"request": {"echo_request": json.loads(text)}, "server_response": "Hello from the server."}
    assert doc["outputs"][0]["parameters"]["content_type"] == "str"


@needs_mlserver
def test_custom_json_runtime_with_its_readme_grpc_request(server: fastoip.Server) -> None:
    import grpc
    from mlserver import types
    from mlserver.grpc import converters
    from mlserver.grpc import dataplane_pb2 as pb

    text = json.dumps({"name": "Foo Bar", "message": "Hello from Client (gRPC)!"}).encode()
    request = types.InferenceRequest(inputs=[types.RequestInput(
        name="echo_request", shape=[len(text)], datatype="BYTES", data=[text],
        parameters=types.Parameters(content_type="str"))])
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        answer = infer(converters.ModelInferRequestConverter.from_types(request, model_name="json-hello",
                                                                        model_version=None), timeout=10)
        response = converters.ModelInferResponseConverter.to_types(answer)
        assert json.loads(StringCodec.decode_output(response.outputs[0])[0])["request"]["echo_request"]["name"] == (
            "Foo Bar")
        # the same shape to a model with a config.pbtxt: Triton's check stands
        triton = converters.ModelInferRequestConverter.from_types(request, model_name="triton-text",
                                                                  model_version=None)
        with pytest.raises(grpc.RpcError) as refused:
            infer(triton, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@needs_mlserver
@pytest.mark.parametrize("model", ["summer", "summer-w"])
def test_settings_uri_version_extra_and_parallel_workers(server: fastoip.Server, model: str) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    request = InferenceRequest(inputs=[NumpyCodec.encode_input("x", x)])
    response = infer(server, model, request)
    total = NumpyCodec.decode_output(response.outputs[0])
    np.testing.assert_allclose(total, x.sum(axis=-1, keepdims=True) * 2.0 + 0.5)
    assert response.model_version == "3"  # parameters.version
    status, config = get(server, f"/v2/models/{model}/config")
    assert sum(group["count"] for group in config["instance_group"]) == 2  # parallel_workers


def worker_processes() -> list[int]:
    """This process's Python worker processes (pids)."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] != me:
                continue
            if b"fastoip.pyworker" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def crashy(server: fastoip.Server, word: str) -> tuple[int, Any]:
    request = InferenceRequest(inputs=[StringCodec.encode_input("w", [word])])
    return post(server, "/v2/models/crashy/infer", request.model_dump_json(exclude_none=True).encode())


@needs_mlserver
def test_runtimes_in_worker_processes(server: fastoip.Server) -> None:
    # json-worker, echo-w, stream-w, crashy, batched-w: one worker each; summer-w: parallel_workers 2
    assert len(worker_processes()) == 7
    status, doc = crashy(server, "pid")
    assert status == 200, doc
    pid = doc["outputs"][0]["data"][0]
    assert pid in worker_processes() and pid != os.getpid()


@needs_mlserver
def test_runtime_error_in_a_worker_fails_its_request(server: fastoip.Server) -> None:
    status, doc = crashy(server, "raise")
    assert status == 500
    assert doc["error"] == "model 'crashy': predict failed: ValueError: asked to fail"


@needs_mlserver
def test_crashed_runtime_worker_fails_its_request_and_restarts(server: fastoip.Server) -> None:
    status, doc = crashy(server, "pid")
    assert status == 200, doc
    before = doc["outputs"][0]["data"][0]
    status, doc = crashy(server, "exit")
    assert status == 500
    assert "'crashy'" in doc["error"] and "exited with code 3" in doc["error"], doc
    status, doc = crashy(server, "pid")  # a new worker
    assert status == 200, doc
    assert doc["outputs"][0]["data"][0] != before
    assert get(server, "/v2/models/crashy/ready")[0] == 200


@needs_mlserver
@pytest.mark.parametrize(("model", "prefix"), [("summer", "sum"), ("summer-w", "wsum")])
def test_custom_metrics_reach_metrics_endpoint(server: fastoip.Server, model: str, prefix: str) -> None:
    x = np.ones((4, 2), dtype=np.float32)
    infer(server, model, InferenceRequest(inputs=[NumpyCodec.encode_input("x", x)]))
    with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    assert f'{prefix}_calls_count{{model_name="{model}",model_version="3"}}' in text
    assert f'{prefix}_rows_sum{{model_name="{model}",model_version="3"}}' in text


@needs_mlserver
@pytest.mark.parametrize("model", ["stream", "stream-w"])
def test_predict_stream_over_grpc(server: fastoip.Server, model: str) -> None:
    # MLServer's own gRPC stubs (tritonclient.grpc cannot be imported beside mlserver: both register the
    # 'inference' protobuf package in the default descriptor pool)
    import grpc
    from mlserver.grpc import dataplane_pb2 as pb
    from mlserver.grpc.converters import ModelInferResponseConverter

    request = pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="in", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"tick"]))])
    # MLServer's own proto answers ModelStreamInfer with bare ModelInferResponses; Triton's (and fastoip's)
    # wrap each in a ModelStreamInferResponse: read them with fastoip's message (its own descriptor pool)
    from fastoip._proto import grpc_service_pb2 as triton_pb

    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=triton_pb.ModelStreamInferResponse.FromString,
        )
        got = []
        for answer in stream(iter([request]), timeout=10):
            assert not answer.error_message, answer.error_message
            inner = pb.ModelInferResponse.FromString(answer.infer_response.SerializeToString())
            response = ModelInferResponseConverter.to_types(inner)
            got.extend(StringCodec.decode_output(response.outputs[0]))
    assert got == ["tick-0", "tick-1", "tick-2"]


def sse_events(server: fastoip.Server, path: str, body: Any) -> tuple[int, list[Any]]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            text = answer.read().decode()
            return answer.status, [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    except urllib.error.HTTPError as error:
        return error.code, [json.loads(error.read())]


@needs_mlserver
@pytest.mark.parametrize("model", ["stream", "stream-w"])
def test_generate_stream_takes_mlserver_v2_requests(server: fastoip.Server, model: str) -> None:
    # MLServer's streaming example posts an InferenceRequest to generate_stream and reads V2 responses
    request = InferenceRequest(inputs=[StringCodec.encode_input("in", ["tick"], use_bytes=False)],
                               outputs=[{"name": "out"}])
    status, events = sse_events(server, f"/v2/models/{model}/generate_stream", request.model_dump(exclude_none=True))
    assert status == 200, events
    responses = [InferenceResponse.model_validate(event) for event in events]
    assert [StringCodec.decode_output(r.outputs[0])[0] for r in responses] == ["tick-0", "tick-1", "tick-2"]
    assert all(r.model_name == model for r in responses)


@needs_mlserver
def test_generate_takes_mlserver_v2_requests(server: fastoip.Server) -> None:
    x = np.array([[1.5, 2.5]], dtype=np.float64)
    request = InferenceRequest(inputs=[NumpyCodec.encode_input("a", x)])
    status, doc = post(server, "/v2/models/echo/generate", request.model_dump(exclude_none=True))
    assert status == 200, doc
    np.testing.assert_array_equal(NumpyCodec.decode_output(InferenceResponse.model_validate(doc).outputs[0]), x)


@needs_mlserver
@pytest.mark.parametrize("model", ["echo", "echo-w"])
@pytest.mark.parametrize("codec", ["str", "np", "base64", "datetime"])
def test_input_codecs_round_trip(server: fastoip.Server, codec: str, model: str) -> None:
    import datetime

    values: dict[str, Any] = {
        "str": (StringCodec, ["héllo", "world"]),
        "np": (NumpyCodec, np.array([[1.5, 2.5], [3.5, 4.5]], dtype=np.float64)),
        "base64": (Base64Codec, [b"\x00\x01binary", b"more"]),
        "datetime": (DatetimeCodec, [datetime.datetime(2026, 11, 27, 5, 0, 1)]),
    }
    codec_class, value = values[codec]
    request = InferenceRequest(inputs=[codec_class.encode_input("a", value)])
    response = infer(server, model, request)
    back = codec_class.decode_output(response.outputs[0])
    if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(back, value)
    else:
        assert list(back) == value


@needs_mlserver
@pytest.mark.parametrize("model", ["echo", "echo-w"])
def test_pandas_codec_round_trip(server: fastoip.Server, model: str) -> None:
    import pandas as pd

    # an object column: mlserver 1.7's PandasCodec does not know pandas 3's string dtype (a client-side limit)
    frame = pd.DataFrame({"a": [1, 2, 3], "b": pd.Series(["x", "y", "z"], dtype=object), "c": [0.5, 1.5, 2.5]})
    request = PandasCodec.encode_request(frame)
    response = infer(server, model, request)
    back = PandasCodec.decode_response(response)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)  # strings come back as pandas 3's str dtype
    assert back["b"].tolist() == ["x", "y", "z"] and back["a"].dtype == frame["a"].dtype


@needs_mlserver
def test_string_codec_shape_is_accepted(server: fastoip.Server) -> None:
    # StringCodec sends shape [N, 1]; a Triton-config model would refuse it, MLServer takes it
    request = InferenceRequest(inputs=[StringCodec.encode_input("a", ["one", "two"], use_bytes=False)])
    assert list(request.inputs[0].shape) == [2, 1]
    response = infer(server, "echo", request)
    assert StringCodec.decode_output(response.outputs[0]) == ["one", "two"]


@needs_mlserver
@pytest.mark.parametrize("model", ["echo", "echo-w"])
def test_bare_string_bytes_data_is_one_element(server: fastoip.Server, model: str) -> None:
    # MLServer's content-type example sends BYTES "data" as a bare string (its TensorData takes any value)
    body = {"inputs": [
        {"name": "a", "datatype": "BYTES", "shape": [1], "data": "hello world 😁",
         "parameters": {"content_type": "str"}},
    ]}
    status, doc = post(server, f"/v2/models/{model}/infer", body)
    assert status == 200, doc
    assert doc["outputs"][0]["data"] == ["hello world 😁"]
    # a model with a config.pbtxt keeps Triton's rule: 'data' is a list
    body["inputs"][0]["name"] = "INPUT0"
    status, doc = post(server, "/v2/models/triton-text/infer", body)
    assert status == 400 and "'data' must be a list, got a string" in doc["error"]


# -- no server needed, and no mlserver: settings validation and the missing extra ------------------------


def load_error(root: Path, name: str) -> str:
    with fastoip.Server(root, grpc=False) as server:
        index = json.loads(urllib.request.urlopen(
            urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"),
            timeout=10).read())
    return next(entry["reason"] for entry in index if entry["name"] == name)


@pytest.mark.parametrize(("fields", "words"), [
    ({"max_batch_size": "eight"}, "'max_batch_size'"),
    ({"paralel_workers": 2}, "'paralel_workers': unknown key"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "dtype": "x"}]}, "'inputs.0.dtype': unknown key"),
    ({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [-1]}]}, "unknown datatype 'FLOAT'"),
])
def test_model_settings_are_validated(tmp_path: Path, fields: dict, words: str) -> None:
    model = tmp_path / "repo" / "bad"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("import fastoip\n\nclass M(fastoip.Model):\n    def predict(self, x):\n"
                                         "        return x\n")
    (model / "model-settings.json").write_text(json.dumps({"name": "bad", **fields}))
    reason = load_error(tmp_path / "repo", "bad")
    assert "model-settings.json is not valid" in reason or "unknown datatype" in reason
    assert words in reason


@pytest.mark.skipif(HAS_MLSERVER, reason="checks the message given where mlserver is not installed")
def test_without_mlserver_the_error_names_the_extra(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "plain"
    model.mkdir(parents=True)
    (model / "runtime.py").write_text(PLAIN_IMPORT)
    (model / "model-settings.json").write_text(settings(name="plain", implementation="runtime.Plain"))
    assert "pip install 'fastoip[mlserver]'" in load_error(tmp_path / "repo", "plain")


def rows_request(x: np.ndarray, request_id: str) -> InferenceRequest:
    return InferenceRequest(id=request_id, inputs=[NumpyCodec.encode_input("x", x)])


@needs_mlserver
def test_adaptive_batching_merges_and_splits(server: fastoip.Server) -> None:
    # max_batch_size 4, max_batch_time 5 s: four requests sent at once run as one predict call of 4 rows
    # (the batch is full: nobody waits the 5 s), and each gets its own rows, id and row parameters back
    from concurrent.futures import ThreadPoolExecutor

    xs = [np.full((1, 2), i, dtype=np.float32) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: infer(server, "batched", rows_request(xs[i], f"r{i}")), range(4)))
    for i, response in enumerate(answers):
        assert response.id == f"r{i}"
        np.testing.assert_array_equal(NumpyCodec.decode_output(response.outputs[0]), xs[i] * 2)
        rows = response.outputs[1]
        assert NumpyCodec.decode_output(rows).tolist() == [[4]]  # it ran in a call of 4 rows
        assert rows.shape == [1, 1]
        assert rows.parameters.tag.startswith("row")  # a per-row list parameter: this request's element
    tags = sorted(response.outputs[1].parameters.tag for response in answers)
    assert tags == ["row0", "row1", "row2", "row3"]
    status, config = get(server, "/v2/models/batched/config")
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5_000_000


@needs_mlserver
def test_adaptive_batching_in_a_worker_runs_each_request_alone(server: fastoip.Server) -> None:
    # the batcher gathers the four (a full batch) and hands them to the worker as one batch; there each runs its
    # own predict (no merge in a worker), and each gets its own answer and id
    from concurrent.futures import ThreadPoolExecutor

    xs = [np.full((1, 2), i, dtype=np.float32) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: infer(server, "batched-w", rows_request(xs[i], f"r{i}")), range(4)))
    for i, response in enumerate(answers):
        assert response.id == f"r{i}"
        np.testing.assert_array_equal(NumpyCodec.decode_output(response.outputs[0]), xs[i] * 2)
        assert NumpyCodec.decode_output(response.outputs[1]).tolist() == [[1]]  # a predict call of its own


@needs_mlserver
def test_max_batch_time_zero_does_not_batch(server: fastoip.Server) -> None:
    status, config = get(server, "/v2/models/unbatched/config")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config  # as MLServer: no batching
    response = infer(server, "unbatched", rows_request(np.ones((1, 2), dtype=np.float32), "one"))
    assert NumpyCodec.decode_output(response.outputs[1]).tolist() == [[1]]


@needs_mlserver
@pytest.mark.parametrize("model", ["unbatched", "shared-loop"])
def test_runtime_keeps_its_event_loop(server: fastoip.Server, model: str) -> None:
    # the runtime's load() and every predict() see the same running loop (its asyncio.Lock works), with the
    # instance's own loop (default) and with the backend's shared loop
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(
            lambda i: infer(server, model, rows_request(np.full((1, 2), i, dtype=np.float32), str(i))), range(8)))
    assert [float(NumpyCodec.decode_output(a.outputs[0])[0, 0]) for a in answers] == [2.0 * i for i in range(8)]


@needs_mlserver
def test_unknown_event_loop_mode_is_a_load_error(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    (root / "m").mkdir(parents=True)
    (root / "m" / "runtime.py").write_text(ROWS_RUNTIME)
    (root / "m" / "model-settings.json").write_text(
        settings(name="m", implementation="runtime.Rows", parameters={"fastoip_event_loop": "mine"}))
    reason = load_error(root, "m")
    assert "fastoip_event_loop" in reason and "'mine'" in reason


@needs_mlserver
def test_unknown_hosting_is_a_load_error(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    (root / "m").mkdir(parents=True)
    (root / "m" / "runtime.py").write_text(ROWS_RUNTIME)
    (root / "m" / "model-settings.json").write_text(
        settings(name="m", implementation="runtime.Rows", parameters={"fastoip_hosting": "thread"}))
    reason = load_error(root, "m")
    assert "fastoip_hosting" in reason and "'thread'" in reason


FAILING_LOAD = '''
import os

from mlserver import MLModel


class Failing(MLModel):
    async def load(self) -> bool:
        if self.settings.parameters.extra.get("exit"):
            os._exit(3)
        raise RuntimeError("no weights here")
'''


@needs_mlserver
@pytest.mark.parametrize(("extra", "words"), [
    ({}, "RuntimeError: no weights here"),
    ({"exit": True}, "its Python worker process exited with code 3 while loading"),
])
def test_a_runtime_failing_to_load_in_a_worker_is_a_load_error(tmp_path: Path, extra: dict, words: str) -> None:
    root = tmp_path / "repository"
    (root / "m").mkdir(parents=True)
    (root / "m" / "runtime.py").write_text(FAILING_LOAD)
    (root / "m" / "model-settings.json").write_text(settings(
        name="m", implementation="runtime.Failing", parameters={"fastoip_hosting": "process", "extra": extra}))
    reason = load_error(root, "m")
    assert "model 'm'" in reason and words in reason, reason

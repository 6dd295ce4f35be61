"""KServe's V1 protocol and health bodies over plain HTTP, against a real server (``fastoip.Server``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

import fastoip
from fastoip.demo import write_repository
from models import identity_model_bytes, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = write_repository(tmp_path_factory.mktemp("v1") / "repository", ["simple"])
    write_model(root, "ident", identity_model_bytes(TensorProto.FLOAT, [3]))
    write_model(root, "unbatched", identity_model_bytes(TensorProto.FLOAT, [2, 2], batch=False),
                config='platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    write_model(root, "text", identity_model_bytes(TensorProto.STRING, [1]))
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not onnx")
    with fastoip.Server(root, grpc=False) as server:
        yield server


def call(server: fastoip.Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_server_health_bodies_are_kserves(server: fastoip.Server) -> None:
    assert call(server, "GET", "/v2/health/live") == (200, {"live": True})
    assert call(server, "GET", "/") == (200, {"status": "alive"})


def test_models_and_model_ready(server: fastoip.Server) -> None:
    status, doc = call(server, "GET", "/v1/models")
    assert status == 200 and {"simple", "ident", "unbatched", "text", "broken"} <= set(doc["models"])
    status, doc = call(server, "GET", "/v1/models/simple")  # KServe's fields (OpenAI's beside them: test_openai.py)
    assert status == 200 and doc["name"] == "simple" and doc["ready"] is True
    assert call(server, "GET", "/v1/models/nope") == (404, {"error": "Model with name nope does not exist."})
    assert call(server, "GET", "/v1/models/broken") == (503, {"error": "Model with name broken is not ready."})


def test_instances_of_one_input(server: fastoip.Server) -> None:
    rows = [[1.0, 2.0, 3.0], [4.5, 5.5, 6.5]]
    assert call(server, "POST", "/v1/models/ident:predict", {"instances": rows}) == (200, {"predictions": rows})
    # "inputs" is read the same way (KServe prefers it when both are there)
    assert call(server, "POST", "/v1/models/ident:predict", {"inputs": rows, "instances": "ignored"}) == (
        200, {"predictions": rows})


def test_named_instances_and_columnar_inputs(server: fastoip.Server) -> None:
    a, b = np.arange(32).reshape(2, 16), np.ones((2, 16), dtype=int)
    rows = [{"INPUT0": a[i].tolist(), "INPUT1": b[i].tolist()} for i in range(2)]
    status, doc = call(server, "POST", "/v1/models/simple:predict", {"instances": rows})
    assert status == 200
    assert [row["OUTPUT0"] for row in doc["predictions"]] == (a + b).tolist()
    assert [row["OUTPUT1"] for row in doc["predictions"]] == (a - b).tolist()
    status, columnar = call(server, "POST", "/v1/models/simple:predict",
                            {"inputs": {"INPUT0": a.tolist(), "INPUT1": b.tolist()}})
    assert (status, columnar) == (200, doc)


def test_a_model_that_does_not_batch_takes_one_instance(server: fastoip.Server) -> None:
    one = [[[1.0, 2.0], [3.0, 4.0]]]
    assert call(server, "POST", "/v1/models/unbatched:predict", {"instances": one}) == (200, {"predictions": one})


def test_strings(server: fastoip.Server) -> None:
    rows = [["héllo"], ["world"]]
    assert call(server, "POST", "/v1/models/text:predict", {"instances": rows}) == (200, {"predictions": rows})


@pytest.mark.parametrize(("model", "body", "status", "words"), [
    ("ident", {"rows": []}, 400, 'Expected "instances" or "inputs"'),
    ("ident", {"instances": {"INPUT0": [1]}}, 400, '"instances" to be a list'),
    ("ident", {"instances": []}, 400, "empty"),
    ("ident", {"instances": [["a", "b", "c"]]}, 400, "INPUT0"),
    ("ident", {"instances": [[1.0, 2.0]]}, 400, "INPUT0"),
    ("ident", b"{not json", 400, ""),
    ("simple", {"instances": [[1] * 16]}, 400, "2 inputs (INPUT0, INPUT1)"),
    ("simple", {"instances": [{"INPUT0": [1] * 16, "NOPE": [1] * 16}]}, 400, "no input 'NOPE'"),
    ("nope", {"instances": [[1]]}, 404, "Model with name nope does not exist."),
    ("broken", {"instances": [[1]]}, 503, "Model with name broken is not ready."),
])
def test_errors_are_kserves(server: fastoip.Server, model: str, body: Any, status: int, words: str) -> None:
    got, doc = call(server, "POST", f"/v1/models/{model}:predict", body)
    assert got == status and words in doc["error"], doc
    assert call(server, "GET", "/v1/models/simple")[0] == 200  # still serving


def test_wrong_method_is_405(server: fastoip.Server) -> None:
    assert call(server, "GET", "/v1/models/ident:predict")[0] == 405


def test_openapi_documents_v1(server: fastoip.Server) -> None:
    status, doc = call(server, "GET", "/v2/docs/openapi.json")
    assert status == 200 and "post" in doc["paths"]["/v1/models/{model_name}:predict"]


def test_explain_is_kserves_answer_without_an_explainer(server: fastoip.Server) -> None:
    # KServe's Model.explain with no explainer_host: 501 "Could not find explainer_host." (after readiness)
    body = {"instances": [[1.0, 2.0, 3.0]]}
    assert call(server, "POST", "/v1/models/ident:explain", body) == (501, {"error": "Could not find explainer_host."})
    missing = {"error": "Model with name nope does not exist."}
    assert call(server, "POST", "/v1/models/nope:explain", body) == (404, missing)
    assert call(server, "POST", "/v1/models/broken:explain", body)[0] == 503
    status, doc = call(server, "POST", "/v1/models/ident:explain", b"{not json")
    assert status == 400 and "error" in doc
    assert call(server, "GET", "/v1/models/ident")[0] == 200  # the server stays up

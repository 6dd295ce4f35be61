"""The REST API's OpenAPI document: made from the route table, valid OpenAPI 3.1, and true of real answers."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
from openapi_schema_validator import validate as validate_instance
from openapi_spec_validator import validate as validate_document

import fastoip
from fastoip.demo import write_repository
from fastoip.server.http import openapi
from fastoip.server.http.endpoints import HttpFrontend
from fastoip.server.http.router import Request, Response

pytestmark = pytest.mark.timeout(120)

SAMPLES = {"model_name": "some_model", "model_version": "3", "region_name": "some_region"}


@pytest.fixture(scope="module")
def frontend() -> HttpFrontend:
    return HttpFrontend(None, 1024)  # type: ignore[arg-type]  # routing and documenting never call the Core


@pytest.fixture(scope="module")
def document(frontend: HttpFrontend) -> dict[str, Any]:
    return openapi.openapi_document(frontend)


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate_document(document)


def test_every_route_is_documented_and_nothing_else(frontend: HttpFrontend, document: dict[str, Any]) -> None:
    routed = {(route.method.lower(), route.path) for route in frontend.routes()}
    documented = {(method, path) for path, methods in document["paths"].items() for method in methods}
    assert routed == documented
    assert ("post", "/v2/models/{model_name}/versions/{model_version}/infer") in documented
    assert ("get", "/v2/docs/openapi.json") in documented
    assert len(documented) >= 39


def test_each_path_template_routes_back_to_its_handler(frontend: HttpFrontend) -> None:
    for route in frontend.routes():
        concrete = re.sub(r"{(\w+)}", lambda m: SAMPLES[m[1]], route.path)
        handler, args = frontend.route(route.method, concrete)
        assert handler == route.handler, (route.method, route.path)
        for name in re.findall(r"{(\w+)}", route.path):
            assert SAMPLES[name] in args, (route.path, args)


def test_an_undocumented_route_is_refused_by_name() -> None:
    class WithExtra(HttpFrontend):
        def __init__(self) -> None:
            super().__init__(None, 1024)  # type: ignore[arg-type]
            self.fixed_paths["/v2/secret"] = {"GET": self.secret}

        async def secret(self, request: Request) -> Response:
            raise NotImplementedError

    with pytest.raises(ValueError, match=r"GET /v2/secret \(secret\)"):
        openapi.openapi_document(WithExtra())


# -- the document against a real server's answers -------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = write_repository(tmp_path_factory.mktemp("openapi") / "repository", ["simple"])
    with fastoip.Server(root, grpc=False) as server:
        yield server


def call(server: fastoip.Server, method: str, path: str, body: Any = None) -> tuple[int, str, bytes]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["content-type"] or "", answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-type"] or "", error.read()


def response_schema(document: dict[str, Any], method: str, template: str, status: str) -> dict[str, Any]:
    answer = document["paths"][template][method.lower()]["responses"][status]
    return {**answer["content"]["application/json"]["schema"], "components": document["components"]}


CASES = [
    ("GET", "/v2", "/v2", None),
    ("GET", "/v2/models/simple", "/v2/models/{model_name}", None),
    ("GET", "/v2/models/simple/versions/1/config", "/v2/models/{model_name}/versions/{model_version}/config", None),
    ("GET", "/v2/models/simple/stats", "/v2/models/{model_name}/stats", None),
    ("GET", "/v2/models/stats", "/v2/models/stats", None),
    ("POST", "/v2/repository/index", "/v2/repository/index", {}),
    ("GET", "/v2/systemsharedmemory/status", "/v2/systemsharedmemory/status", None),
    ("GET", "/v2/trace/setting", "/v2/trace/setting", None),
    ("GET", "/v2/logging", "/v2/logging", None),
    ("POST", "/v2/models/simple/infer", "/v2/models/{model_name}/infer", {
        "id": "one",
        "inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                   for i in (0, 1)],
        "outputs": [{"name": "OUTPUT0"}],
    }),
]


@pytest.mark.parametrize(("method", "path", "template", "body"), CASES, ids=[case[1] for case in CASES])
def test_real_answers_match_the_documented_schemas(
    server: fastoip.Server, method: str, path: str, template: str, body: Any
) -> None:
    (status, content_type, payload) = call(server, "GET", "/v2/docs/openapi.json")
    assert status == 200 and content_type == "application/json"
    document = json.loads(payload)
    status, content_type, payload = call(server, method, path, body)
    assert status == 200, payload
    validate_instance(json.loads(payload), response_schema(document, method, template, "200"))


def test_errors_match_the_documented_error_schema(server: fastoip.Server) -> None:
    document = json.loads(call(server, "GET", "/v2/docs/openapi.json")[2])
    status, _, payload = call(server, "GET", "/v2/models/nope")
    assert status == 404
    validate_instance(json.loads(payload), response_schema(document, "GET", "/v2/models/{model_name}", "default"))
    status, _, payload = call(server, "POST", "/v2/models/simple/infer", {"inputs": "no"})
    assert status == 400
    validate_instance(
        json.loads(payload), response_schema(document, "POST", "/v2/models/{model_name}/infer", "default")
    )


def test_the_served_document_is_the_generated_one(server: fastoip.Server, document: dict[str, Any]) -> None:
    status, _, payload = call(server, "GET", "/v2/docs/openapi.json")
    assert status == 200 and json.loads(payload) == json.loads(json.dumps(document))


def test_the_docs_page_points_at_the_document(server: fastoip.Server) -> None:
    status, content_type, payload = call(server, "GET", "/v2/docs")
    assert status == 200 and content_type.startswith("text/html")
    page = payload.decode()
    assert 'url: "/v2/docs/openapi.json"' in page and "swagger-ui" in page
    status, _, payload = call(server, "POST", "/v2/docs")
    assert status == 405 and b"allowed: GET" in payload


def test_infer_request_example_validates(document: dict[str, Any]) -> None:
    request = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0],
                           "parameters": {"binary_data_size": 8}}],
               "parameters": {"binary_data_output": True}}
    schema = {"$ref": "#/components/schemas/InferenceRequest", "components": document["components"]}
    validate_instance(request, schema)
    with pytest.raises(Exception, match="'inputs' is a required property"):
        validate_instance({"id": "x"}, schema)
    np.testing.assert_array_equal(np.array(request["inputs"][0]["data"]), [1.0, 2.0])



def test_the_docs_page_works_offline(server: fastoip.Server) -> None:
    """Everything the page loads comes from this server (air-gapped clusters): no external host in it."""
    page = call(server, "GET", "/v2/docs")[2].decode()
    assert "http://" not in page and "https://" not in page
    for asset, media in (("/v2/docs/swagger-ui-bundle.js", "application/javascript"),
                         ("/v2/docs/swagger-ui.css", "text/css")):
        assert f'"{asset}"' in page
        status, content_type, payload = call(server, "GET", asset)
        assert status == 200 and content_type.startswith(media), (asset, status, payload[:200])
        assert len(payload) > 10_000
    assert b"SwaggerUIBundle" in call(server, "GET", "/v2/docs/swagger-ui-bundle.js")[2]

"""Triton's restricted APIs: ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

Parsing and error texts are Triton's (``command_line_parser.cc``); refusals are HTTP 403 and gRPC
UNAVAILABLE with Triton's messages, tested with tritonclient's ``headers=`` on HTTP and on both gRPC
frontends.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from fastoip._proto import health_pb2
from fastoip.cli import serve_options
from fastoip.server import restricted
from fastoip.triton_flags import FlagError
from serverproc import ServerProcess
from simple_model import simple_inputs

pytestmark = pytest.mark.timeout(120)

INFER_KEY = {"infer-key": "s3cret"}
GRPC_INFER_KEY = {"triton-grpc-protocol-infer-key": "s3cret"}
GRPC_HEALTH_KEY = {"triton-grpc-protocol-health-key": "ok"}


# -- parsing -------------------------------------------------------------------------------------
def test_flags_parse_as_triton_parses_them() -> None:
    options = serve_options([
        "--http-restricted-api=inference,model-config:infer-key=s3cret=x",
        "--http-restricted-api", "health:health-key=ok",
        "--grpc-restricted-protocol=shared-memory,model-repository:admin-key=adm",
    ])
    http = options.http_restricted
    assert http is not None and set(http.by_category) == {"inference", "model-config", "health"}
    assert http.by_category["inference"] == restricted.Restriction("infer-key", "s3cret=x")  # value: after the 1st '='
    grpc_features = options.grpc_restricted
    assert grpc_features is not None
    assert grpc_features.by_category["model-repository"].header == "triton-grpc-protocol-admin-key"
    assert not serve_options([]).http_restricted  # nothing restricted by default


@pytest.mark.parametrize(("flag", "message"), [
    ("--http-restricted-api=inference", "--http-restricted-api option format is "
                                        "'<config name>:<setting>=<value>'. Got inference"),
    ("--http-restricted-api=inference:key", "option format is"),
    ("--http-restricted-api=:key=value", "option format is"),
    ("--http-restricted-api=inference:key=", "option format is"),
    ("--grpc-restricted-protocol=inference:=value", "--grpc-restricted-protocol option format is"),
    ("--http-restricted-api=infer:key=value", "unknown restricted api 'infer'"),
    ("--grpc-restricted-protocol=health,,metadata:key=value", "unknown restricted protocol ''"),
])
def test_malformed_restrictions_are_refused_with_tritons_words(flag: str, message: str) -> None:
    with pytest.raises(FlagError, match=None) as info:
        serve_options([flag])
    assert message in str(info.value)


def test_a_group_may_be_restricted_once() -> None:
    with pytest.raises(FlagError) as info:
        serve_options(["--http-restricted-api=health:a=1", "--http-restricted-api=metadata,health:b=2"])
    assert str(info.value) == "restricted api 'health' can not be specified in multiple config groups"


def test_every_grpc_method_has_a_group() -> None:
    from fastoip.server.grpc.service import UNARY

    assert set(UNARY) | {"ModelInfer", "ModelStreamInfer", "Check"} == set(restricted.GRPC_METHOD_CATEGORIES)


# -- HTTP --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server(demo_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, "--http-restricted-api=inference,model-config:infer-key=s3cret",
                       "--http-restricted-api=health:health-key=ok", http=True) as proc:
        yield proc


def test_http_restricted_endpoints_need_their_header(http_server: ServerProcess) -> None:
    client = th.InferenceServerClient(http_server.http_url)
    try:
        with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'infer-key'"):
            client.infer("simple", simple_inputs(th))
        with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
            client.infer("simple", simple_inputs(th), headers={"infer-key": "wrong"})
        result = client.infer("simple", simple_inputs(th), headers=INFER_KEY)
        assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
        with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
            client.get_model_config("simple")
        assert client.get_model_config("simple", headers={"Infer-Key": "s3cret"})["name"] == "simple"
        # tritonclient.http reads health answers as true/false (the 403 body is checked below)
        assert not client.is_server_ready() and not client.is_model_ready("simple")
        assert client.is_server_ready(headers={"health-key": "ok"})
        assert client.is_model_ready("simple", headers={"health-key": "ok"})
        # groups not named stay open
        assert client.get_server_metadata()["name"] == "fastoip"
        assert client.get_model_metadata("simple")["name"] == "simple"
        assert client.get_inference_statistics("simple")["model_stats"]
    finally:
        client.close()


def test_http_refusal_is_403_json_before_the_method_is_checked(http_server: ServerProcess) -> None:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", http_server.http_port, timeout=10)
    try:
        conn.request("POST", "/v2/health/live")  # wrong method too: Triton checks the restriction first
        response = conn.getresponse()
        assert response.status == 403
        assert json.loads(response.read()) == {"error": "This API is restricted, expecting header 'health-key'"}
        conn.request("POST", "/v2/health/live", headers={"health-key": "ok"})
        response = conn.getresponse()
        assert response.status == 405
        response.read()
    finally:
        conn.close()


# -- gRPC, both frontends ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grpc_server(demo_repo: Path, grpc_frontend: str) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, "--grpc-restricted-protocol=inference:infer-key=s3cret",
                       "--grpc-restricted-protocol=health:health-key=ok", grpc_frontend=grpc_frontend) as proc:
        yield proc


def _assert_unavailable(exc: InferenceServerException, header: str) -> None:
    assert exc.status() == "StatusCode.UNAVAILABLE"
    assert exc.message() == f"This protocol is restricted, expecting header '{header}'"


def test_grpc_restricted_methods_need_their_metadata(grpc_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(grpc_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", simple_inputs(tg))
        _assert_unavailable(info.value, "triton-grpc-protocol-infer-key")
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", simple_inputs(tg), headers={"triton-grpc-protocol-infer-key": "nope"})
        _assert_unavailable(info.value, "triton-grpc-protocol-infer-key")
        with pytest.raises(InferenceServerException):
            client.infer("simple", simple_inputs(tg), headers={"infer-key": "s3cret"})  # without Triton's prefix
        result = client.infer("simple", simple_inputs(tg), headers=GRPC_INFER_KEY)
        assert result.as_numpy("OUTPUT1").tolist() == [list(range(-1, 15))]

        with pytest.raises(InferenceServerException) as info:
            client.is_server_live()
        _assert_unavailable(info.value, "triton-grpc-protocol-health-key")
        assert client.is_server_ready(headers=GRPC_HEALTH_KEY)
        assert client.is_model_ready("simple", headers=GRPC_HEALTH_KEY)
        # open groups
        assert client.get_server_metadata().name == "fastoip"
        assert client.get_model_config("simple").config.name == "simple"
    finally:
        client.close()


def _stream(client: tg.InferenceServerClient, headers: dict | None) -> object:
    results: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: results.put(error if error is not None else result),
                        headers=headers)
    try:
        try:
            client.async_stream_infer("simple", simple_inputs(tg))
        except InferenceServerException:  # the server ended the stream already; the callback has why
            pass
        return results.get(timeout=15)
    finally:
        client.stop_stream()


def test_grpc_restricted_stream(grpc_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(grpc_server.grpc_url)
    try:
        refused = _stream(client, None)
        assert isinstance(refused, InferenceServerException)
        _assert_unavailable(refused, "triton-grpc-protocol-infer-key")
        answered = _stream(client, GRPC_INFER_KEY)
        assert not isinstance(answered, Exception)
        assert answered.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]  # type: ignore[attr-defined]
    finally:
        client.close()


def test_grpc_health_check_is_in_the_health_group(grpc_server: ServerProcess) -> None:
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            check(health_pb2.HealthCheckRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        answer = check(health_pb2.HealthCheckRequest(), timeout=10, metadata=list(GRPC_HEALTH_KEY.items()))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# -- every endpoint and RPC is in its group ----------------------------------------------------------------
def _one_key_per_group(flag: str) -> list[str]:
    return [f"{flag}={group}:key-{group}=v" for group in restricted.CATEGORIES]


HTTP_ENDPOINTS = [
    ("GET", "/v2", "metadata"),
    ("GET", "/v2/health/live", "health"),
    ("GET", "/v2/health/ready", "health"),
    ("GET", "/v2/models/simple", "metadata"),
    ("GET", "/v2/models/simple/versions/1", "metadata"),
    ("GET", "/v2/models/simple/ready", "health"),
    ("POST", "/v2/models/simple/infer", "inference"),
    ("POST", "/v2/models/simple/versions/1/infer", "inference"),
    ("GET", "/v2/models/simple/config", "model-config"),
    ("GET", "/v2/models/simple/stats", "statistics"),
    ("GET", "/v2/models/stats", "statistics"),
    ("GET", "/v2/trace/setting", "trace"),
    ("POST", "/v2/models/simple/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/logging", "logging"),
    ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("POST", "/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
    ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/models/simple/load", "model-repository"),
    ("POST", "/v2/repository/models/simple/unload", "model-repository"),
]


@pytest.fixture(scope="module")
def all_groups_http(demo_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *_one_key_per_group("--http-restricted-api"), http=True) as proc:
        yield proc


def test_every_http_endpoint_is_in_tritons_group(all_groups_http: ServerProcess) -> None:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", all_groups_http.http_port, timeout=10)
    try:
        for method, path, group in HTTP_ENDPOINTS:
            conn.request(method, path, body=b"{}" if method == "POST" else None)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 403, (method, path, body)
            assert json.loads(body)["error"] == f"This API is restricted, expecting header 'key-{group}'", path
            conn.request("GET", "/v2/models/simple/config", headers={"key-model-config": "v"})  # a good request
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def all_groups_grpc(demo_repo: Path, grpc_frontend: str) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *_one_key_per_group("--grpc-restricted-protocol"),
                       grpc_frontend=grpc_frontend) as proc:
        yield proc


def test_every_grpc_method_is_in_tritons_group(all_groups_grpc: ServerProcess) -> None:
    from fastoip.server.grpc.service import HEALTH_SERVICE, SERVICE

    with grpc.insecure_channel(all_groups_grpc.grpc_url) as channel:
        for method, group in restricted.GRPC_METHOD_CATEGORIES.items():
            path = f"/{HEALTH_SERVICE if method == 'Check' else SERVICE}/{method}"
            header = f"triton-grpc-protocol-key-{group}"
            if method == "ModelStreamInfer":
                call = channel.stream_stream(path)
                with pytest.raises(grpc.RpcError) as info:
                    list(call(iter([b""]), timeout=10))
            else:
                with pytest.raises(grpc.RpcError) as info:
                    channel.unary_unary(path)(b"", timeout=10)
            error = info.value
            assert error.code() == grpc.StatusCode.UNAVAILABLE, method  # type: ignore[attr-defined]
            assert error.details() == f"This protocol is restricted, expecting header '{header}'"  # type: ignore[attr-defined]
        # with its key a call gets past the check (ServerLive answers; the health group has its own key)
        live = channel.unary_unary(f"/{SERVICE}/ServerLive")(b"", timeout=10,
                                                               metadata=[("triton-grpc-protocol-key-health", "v")])
        assert live == b"\x08\x01"  # ServerLiveResponse(live=true)


@pytest.mark.parametrize(("values", "allowed"), [(("wrong", "s3cret"), False), (("s3cret", "wrong"), True)])
def test_grpc_duplicate_restriction_headers_read_the_same_on_both_frontends(
    grpc_server: ServerProcess, values: tuple[str, str], allowed: bool
) -> None:
    """Issue 27: the native frontend read the last of two such headers, grpcio the first; both read the first."""
    from h2raw import MODEL_INFER, RawGrpcConnection, grpc_frame, simple_request_bytes

    header = "triton-grpc-protocol-infer-key"
    with RawGrpcConnection(grpc_server.grpc_port) as conn:
        conn.handshake()
        stream_id = conn.start_call(MODEL_INFER, extra=tuple((header, value) for value in values))
        conn.send_data(stream_id, grpc_frame(simple_request_bytes()))
        result = conn.wait(stream_id, 20)
    if allowed:
        assert result.status == 0, (result.status, result.message)
    else:
        assert result.status == 14 and "expecting header" in result.message, (result.status, result.message)

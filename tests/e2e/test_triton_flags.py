"""Every ``tritonserver`` flag is accepted by ``fastoip serve``: honoured where fastoip has the mechanism,
otherwise taken with one start-log line saying it has no effect (never silently ignored).

Honoured, end to end on real servers: --grpc-infer-response-compression-level (the response carries
grpc-encoding and a compressed message tritonclient reads), --grpc-http2-max-pings-without-data,
--http-header-forward-pattern / --grpc-header-forward-pattern (headers become request parameters a Python
model sees), --pinned-memory-pool-byte-size (Triton's nv_pinned_memory_pool_* gauges), --exit-on-error,
--response-cache-byte-size.
"""

from __future__ import annotations

import json
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastoip.cli import serve_options
from fastoip.demo import write_repository
from fastoip.server.grpc import protocol as wire
from fastoip.triton_flags import NO_EFFECT, FlagError
from h2raw import MODEL_INFER, RawGrpcConnection, grpc_frame, simple_request_bytes
from serverproc import ServerProcess
from simple_model import ZERO_TO_15, simple_inputs

pytestmark = pytest.mark.timeout(120)

#: The flags Triton's command line has that fastoip had refused, each with a value Triton takes.
TRITON_FLAGS = [
    "--exit-on-error=false", "--model-load-thread-count=4", "--pinned-memory-pool-byte-size=268435456",
    "--cuda-memory-pool-byte-size=0:67108864", "--http-thread-count=8",  # honoured: the JSON decoding workers
    "--grpc-infer-response-compression-level=none", "--reuse-grpc-port=false", "--buffer-manager-thread-count=0",
    "--grpc-infer-allocation-pool-size=8", "--min-supported-compute-capability=6.0",
    "--grpc-http2-max-pings-without-data=2", "--http-header-forward-pattern=x-.*", "--host-policy=gpu_0,numa-node=0",
    "--rate-limit=off", "--rate-limit=OFF", "--model-namespacing=false", "--allow-sagemaker=false",
    "--allow-vertex-ai=false", "--allow-client-shm=true", "--backend-directory=/opt/tritonserver/backends",
    "--repoagent-directory=/opt/tritonserver/repoagents", "--model-load-retry-count=0",
    "--grpc-keepalive-permit-without-calls=true", "--grpc-http2-min-recv-ping-interval-without-data=300000",
    "--grpc-http2-max-ping-strikes=2", "--enable-peer-access=true", "--allow-gpu-metrics=false",
    "--allow-cpu-metrics=true", "--metrics-interval-ms=2000", "--response-cache-byte-size=1024",
    "--grpc-header-forward-pattern=x-.*", "--reuse-http-port=false", "--cuda-virtual-address-size=0:1024",
    "--model-load-gpu-limit=0:0.9",
]

INFO = """
    import json
    import fastoip

    class Params(fastoip.Model):
        def predict(self, inputs, parameters):
            return [json.dumps(parameters)]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("flags"))
    folder = root / "params" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(INFO))
    (root / "params" / "config.pbtxt").write_text(textwrap.dedent("""
        backend: "python"
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """))
    return root


@pytest.mark.parametrize("flag", TRITON_FLAGS)
def test_every_triton_flag_is_accepted(repo: Path, flag: str) -> None:
    options = serve_options([f"--model-store={repo}", flag])
    name = flag.split("=", 1)[0]
    if name in NO_EFFECT:
        assert options.no_effect_flags == (f"{name} has no effect in fastoip: {NO_EFFECT[name][1]}",)
    else:
        assert options.no_effect_flags == ()


@pytest.mark.parametrize(("flag", "words"), [
    ("--rate-limit=execution_count", "--rate-limit=execution_count is not supported by fastoip"),
    ("--model-namespacing=true", "--model-namespacing=true is not supported by fastoip"),
    ("--allow-sagemaker=true", "the SageMaker frontend is not implemented"),
    ("--allow-client-shm=false", "client shared memory cannot be turned off"),
    ("--http-header-forward-pattern=(", "invalid regular expression"),
    ("--pinned-memory-pool-byte-size=-1", "must be >= 0"),
    ("--model-load-thread-count=0", "must be >= 1"),
])
def test_values_asking_for_what_fastoip_lacks_are_refused(repo: Path, flag: str, words: str) -> None:
    with pytest.raises(FlagError, match=words):
        serve_options([f"--model-store={repo}", flag])


def test_honoured_flags_reach_the_server_options(repo: Path) -> None:
    options = serve_options([
        f"--model-store={repo}", "--grpc-infer-response-compression-level=HIGH",
        "--grpc-http2-max-pings-without-data=0", "--grpc-keepalive-permit-without-calls=false",
        "--http-header-forward-pattern=x-fwd", "--grpc-header-forward-pattern=x-g", "--exit-on-error=true",
        "--pinned-memory-pool-byte-size=1048576", "--response-cache-byte-size=4096", "--model-load-thread-count=2",
    ])
    assert options.repository.load_threads == 2
    assert serve_options([f"--model-store={repo}"]).repository.load_threads == 4  # Triton's default
    native = options.grpc_native
    assert native is not None
    assert native.response_compression_level == "high"
    assert native.max_pings_without_data == 0 and native.keepalive_without_calls is False
    assert native.forward_header_pattern == "x-g" and options.http_forward_pattern == "x-fwd"
    assert options.exit_on_error and options.pinned_pool_bytes == 1048576
    assert options.cache_size_bytes == 4096  # Triton: --cache-config local,size=4096


@pytest.mark.parametrize(("level", "accept", "chosen"), [
    ("none", b"identity,deflate,gzip", None),
    ("low", b"identity,deflate,gzip", b"gzip"),
    ("medium", b"identity,deflate,gzip", b"deflate"),
    ("high", b"identity,deflate,gzip", b"deflate"),
    ("high", b"identity,gzip", b"gzip"),
    ("low", b"identity", None),
    ("low", None, None),
])
def test_compression_algorithm_for_level_as_grpc_core(level: str, accept: bytes | None, chosen: bytes | None) -> None:
    assert wire.response_encoding(level, accept) == chosen


# -- real servers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(repo: Path, native_frontend: str) -> Iterator[ServerProcess]:
    flags = ["--grpc-infer-response-compression-level=low", "--http-header-forward-pattern=^x-fwd-",
             "--grpc-header-forward-pattern=^x-grpc-", "--pinned-memory-pool-byte-size=1048576",
             "--buffer-manager-thread-count=4"]
    with ServerProcess(repo, *flags, http=True, metrics=True, grpc_frontend=native_frontend) as proc:
        yield proc


def test_infer_responses_are_compressed_at_the_level_asked(server: ServerProcess) -> None:
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        stream = conn.start_call(extra=(("grpc-accept-encoding", "identity,deflate,gzip"),))
        conn.send_data(stream, grpc_frame(simple_request_bytes()))
        result = conn.wait(stream)
    assert result.status == 0 and result.headers.get("grpc-encoding") == "gzip"
    assert result.data[0] == 1  # the message's compressed flag
    # A client that accepts no compression gets identity.
    with RawGrpcConnection(server.grpc_port) as conn:
        conn.handshake()
        result = conn.unary(MODEL_INFER, simple_request_bytes())
    assert result.status == 0 and "grpc-encoding" not in result.headers and result.data[0] == 0
    # tritonclient (grpcio) reads the compressed responses.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    out = client.infer("simple", simple_inputs(grpcclient, ZERO_TO_15, ZERO_TO_15)).as_numpy("OUTPUT0")
    assert out.tolist() == [list(range(0, 32, 2))]


def test_http_headers_matching_the_pattern_become_request_parameters(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    result = client.infer("params", [inp], headers={"X-Fwd-Tenant": "blue", "X-Other": "no"})
    seen = json.loads(result.as_numpy("OUT")[0])
    assert seen.get("x-fwd-tenant") == "blue" and "x-other" not in seen


def test_grpc_metadata_matching_the_pattern_become_request_parameters(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    result = client.infer("params", [inp], headers={"x-grpc-user": "ann", "x-fwd-tenant": "no"})
    seen = json.loads(result.as_numpy("OUT")[0])
    assert seen.get("x-grpc-user") == "ann" and "x-fwd-tenant" not in seen


def test_pinned_memory_pool_metrics(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("nv_pinned")}
    assert samples == {"nv_pinned_memory_pool_total_bytes": 1048576.0, "nv_pinned_memory_pool_used_bytes": 0.0}


def test_a_flag_without_effect_is_said_so_in_the_log(server: ServerProcess) -> None:
    assert any("--buffer-manager-thread-count has no effect in fastoip" in line for line in server.lines)


def test_keepalive_pings_stop_at_max_pings_without_data(repo: Path, native_frontend: str) -> None:
    flags = ["--grpc-keepalive-time=300", "--grpc-http2-max-pings-without-data=1"]
    with ServerProcess(repo, *flags, grpc_frontend=native_frontend) as proc, \
            RawGrpcConnection(proc.grpc_port, timeout=0.5) as conn:
        conn.handshake()
        ends = time.monotonic() + 3.0
        while time.monotonic() < ends and not conn.closed:
            conn.receive_once(ends)
        assert conn.pings_received == 1, "one keepalive PING, then none until the server sends data"


def test_exit_on_error_stops_a_start_with_a_broken_model(tmp_path: Path) -> None:
    write_repository(tmp_path)
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    proc = ServerProcess(tmp_path, "--exit-on-error=true")
    with pytest.raises(Exception):  # noqa: B017 - the launcher's own error type; the output is checked below
        proc.start(timeout=60)
    proc.stop()
    assert any("failed to load all models" in line and "broken" in line for line in proc.lines)


def test_exit_on_error_stops_a_start_whose_startup_model_is_not_there(tmp_path: Path) -> None:
    """tritonserver's words: its start-up poll of a --load-model the repository does not hold fails."""
    write_repository(tmp_path)
    proc = ServerProcess(tmp_path, "--exit-on-error=true", "--model-control-mode=explicit", "--load-model=simple",
                         "--load-model=nonexistent_model", "--load-model=..")
    with pytest.raises(Exception):  # noqa: B017 - the launcher's own error type; the output is checked below
        proc.start(timeout=60)
    proc.stop()
    output = "".join(proc.lines)
    assert "failed to poll model 'nonexistent_model': model not found in any model repository" in output
    assert "failed to poll model '..': model not found in any model repository" in output  # never looked up


@pytest.mark.parametrize("beside_an_empty_one", [False, True])
def test_exit_on_error_false_serves_a_server_that_failed_to_initialize(
    tmp_path: Path, beside_an_empty_one: bool
) -> None:
    """Triton's qa/L0_lifecycle test_parse_error_noexit: a --model-repository that does not exist (alone, or beside
    an empty one) with --exit-on-error=false: up, not live, not ready, server metadata answered; the rest
    Unavailable "Server not ready" (Triton's SERVER_FAILED_TO_INITIALIZE)."""
    from fastoip import __version__

    missing = tmp_path / "xyzx"
    empty = tmp_path / "models"
    empty.mkdir()
    extra = [f"--model-repository={empty}"] if beside_an_empty_one else []
    with ServerProcess(missing, *extra, "--exit-on-error=false", "--strict-readiness=false", "--id=triton",
                       http=True, metrics=True) as proc:
        grpc = grpcclient.InferenceServerClient(proc.grpc_url)
        http = httpclient.InferenceServerClient(proc.http_url)
        for client in (grpc, http):
            assert not client.is_server_live() and not client.is_server_ready()
        metadata = grpc.get_server_metadata()
        assert (metadata.name, metadata.version) == ("triton", __version__)
        assert http.get_server_metadata()["name"] == "triton"
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(np.zeros((1, 16), np.int32))
        assert not http.is_model_ready("simple")  # (tritonclient's HTTP client reads the status only: 503)
        for call in (lambda: grpc.is_model_ready("simple"),
                     lambda: grpc.get_model_metadata("simple"), lambda: http.get_model_config("simple"),
                     lambda: grpc.get_model_repository_index(), lambda: http.get_inference_statistics(),
                     lambda: grpc.infer("simple", inputs)):
            with pytest.raises(InferenceServerException, match="Server not ready"):
                call()
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10) as answer:
            assert answer.status == 200
    assert any(f"failed to stat file {missing}" in line for line in proc.lines)


def test_log_switches_are_independent_as_tritons(repo: Path, tmp_path: Path) -> None:
    """Triton's qa/L0_logging: --log-info=false beside --log-verbose=1 reads back as such (HTTP and gRPC), verbose
    lines (each HTTP request) are written and info lines are not; each switch is set on its own at run time."""
    log_file = tmp_path / "server.log"
    with ServerProcess(repo, f"--log-file={log_file}", "--log-info=false", "--log-verbose=1", http=True) as proc:
        http = httpclient.InferenceServerClient(proc.http_url)
        grpc = grpcclient.InferenceServerClient(proc.grpc_url)
        expected = {"log_file": str(log_file), "log_info": False, "log_warning": True, "log_error": True,
                    "log_verbose_level": 1, "log_format": "default"}
        assert http.get_log_settings() == expected
        settings = grpc.get_log_settings(as_json=True)["settings"]
        assert {key: next(iter(value.values())) for key, value in settings.items()} == {
            **expected, "log_verbose_level": 1}
        assert http.is_server_ready()
        logged = log_file.read_text()
        assert "HTTP request: GET /v2/logging" in logged and "HTTP request: GET /v2/health/ready" in logged
        assert " INFO " not in logged  # "model 'identity' ready" and the rest are info lines
        grpc.update_log_settings({"log_warning": False})
        assert http.update_log_settings({"log_info": True, "log_verbose_level": 0}) == {
            **expected, "log_info": True, "log_warning": False, "log_verbose_level": 0}
        http.get_log_settings()
        assert log_file.read_text().count("HTTP request:") == 3  # GET, GET, POST; not the last GET: verbose is off
    assert log_file.read_text().count("Waiting for in-flight requests to complete.") == 1  # info is on again

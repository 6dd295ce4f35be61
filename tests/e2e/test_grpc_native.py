"""The native gRPC frontend (libnghttp2 on uvloop): a real ``fastoip serve --grpc-frontend native`` and real clients.

The gRPC suite at large runs on both frontends elsewhere; these tests cover what
this transport does itself: dispatch of every RPC, streaming with many requests
in flight, deadlines and cancellation reaching the Core, compressed requests,
malformed and oversized messages, and the frontend line the server prints.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
from tritonclient.utils import InferenceServerException

from fastoip._proto import grpc_service_pb2 as pb
from fastoip._proto import health_pb2
from fastoip.server.grpc.service import HEALTH_UNARY, UNARY
from models import SLOW_CONFIG, slow_model_bytes, write_model
from serverproc import ServerProcess, wait_until
from simple_model import simple_inputs

pytest.importorskip("fastoip.server.grpc._http2", reason="the native gRPC frontend was not built (libnghttp2-dev)")


@pytest.fixture(scope="module")
def native(demo_repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(demo_repo, "--grpc-frontend", "native", "--grpc-max-message-size", str(1 << 20)) as proc:
        yield proc


def assert_simple(client: tg.InferenceServerClient, offset: int = 0) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16) + offset
    b = np.full((1, 16), 3, dtype=np.int32)
    result = client.infer("simple", simple_inputs(tg, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_server_says_which_frontend_runs(native: ServerProcess) -> None:
    assert any("fastoip: grpc frontend native" in line for line in native.lines), native.lines


def test_unary_infer_tritonclient(native: ServerProcess) -> None:
    client = tg.InferenceServerClient(native.grpc_url)
    for offset in range(20):
        assert_simple(client, offset)


def test_unary_infer_grpc_aio_many_concurrent(native: ServerProcess) -> None:
    async def run() -> None:
        client = tga.InferenceServerClient(native.grpc_url)
        try:
            async def one(offset: int) -> None:
                a = np.full((1, 16), offset, dtype=np.int32)
                b = np.ones((1, 16), dtype=np.int32)
                result = await client.infer("simple", simple_inputs(tg, a, b))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

            await asyncio.gather(*(one(i) for i in range(200)))
            assert await client.is_server_live()
        finally:
            await client.close()

    asyncio.run(run())


def test_every_rpc_is_answered(native: ServerProcess) -> None:
    """Each of the service's unary RPCs and grpc.health.v1 reaches its translator (no UNIMPLEMENTED)."""
    channel = grpc.insecure_channel(native.grpc_url)
    answered = {}
    methods = [("inference.GRPCInferenceService", name, types) for name, types in UNARY.items()]
    methods += [("grpc.health.v1.Health", name, types) for name, types in HEALTH_UNARY.items()]
    for service, name, (request_type, response_type) in methods:
        call = channel.unary_unary(f"/{service}/{name}", request_serializer=request_type.SerializeToString,
                                   response_deserializer=response_type.FromString)
        try:
            call(request_type(), timeout=30)
            answered[name] = "OK"
        except grpc.RpcError as exc:
            answered[name] = exc.code().name
    assert len(answered) == 19
    assert "UNIMPLEMENTED" not in answered.values() and "UNKNOWN" not in answered.values(), answered
    for name in ("ServerLive", "ServerReady", "ServerMetadata", "RepositoryIndex", "ModelStatistics",
                 "SystemSharedMemoryStatus", "TraceSetting", "LogSettings", "Check"):
        assert answered[name] == "OK", answered
    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                               request_serializer=pb.ServerLiveRequest.SerializeToString,
                               response_deserializer=pb.ServerLiveResponse.FromString)
    assert live(pb.ServerLiveRequest()).live
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
    assert check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")(b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel.close()


def test_stream_many_requests_in_flight(native: ServerProcess) -> None:
    client = tg.InferenceServerClient(native.grpc_url)
    answers: queue.SimpleQueue[tuple[object, object]] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    count = 300
    try:
        for i in range(count):
            a = np.full((1, 16), i, dtype=np.int32)
            client.async_stream_infer("simple", simple_inputs(tg, a, np.zeros((1, 16), np.int32)), request_id=str(i))
        client.async_stream_infer("no_such_model", simple_inputs(tg, a, a), request_id="bad")
        seen = {}
        for _ in range(count + 1):
            result, error = answers.get(timeout=60)
            if error is not None:
                assert isinstance(error, InferenceServerException)
                seen["bad"] = error.message()
                continue
            request_id = result.get_response().id  # type: ignore[attr-defined]
            seen[request_id] = result.as_numpy("OUTPUT0")[0, 0]  # type: ignore[attr-defined]
    finally:
        client.stop_stream()
    assert {str(i) for i in range(count)} | {"bad"} == set(seen)
    assert all(seen[str(i)] == i for i in range(count))
    assert "no_such_model" in seen["bad"]


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("native-slow")
    # ~1.2 s an item here (0.38 s per 48 layers on one thread), one at a time: the requests that follow wait in
    # the queue, past their 0.2 s deadline and the cancel at ~0.5 s, while the first runs.
    write_model(root, "slow_cancel", slow_model_bytes(rows=1024, layers=144),
                config=SLOW_CONFIG)
    with ServerProcess(root, "--grpc-frontend", "native") as proc:
        yield proc


def one(x: float) -> list[tg.InferInput]:
    inp = tg.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[x]], np.float32))
    return [inp]


def executions(client: tg.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("execution_count", 0))


def wait_idle(client: tg.InferenceServerClient, model: str, expected: int) -> None:
    wait_until(lambda: executions(client, model) >= expected, timeout=60, interval=0.1)


def test_deadline_and_cancel_reach_the_queue(slow: ServerProcess) -> None:
    """A queued request whose deadline passes, and one whose client cancels, never run."""
    client = tg.InferenceServerClient(slow.grpc_url)
    before = executions(client, "slow_cancel")
    first: queue.SimpleQueue[object] = queue.SimpleQueue()
    client.async_infer("slow_cancel", one(1.0), callback=lambda result, error: first.put(error or result))
    time.sleep(0.1)  # the first is running; what follows waits in the queue
    with pytest.raises(InferenceServerException) as info:
        client.infer("slow_cancel", one(2.0), client_timeout=0.2)
    assert "DEADLINE_EXCEEDED" in str(info.value.status())

    channel = grpc.insecure_channel(slow.grpc_url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    request = pb.ModelInferRequest(model_name="slow_cancel")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(3.0)
    future = infer.future(request.SerializeToString())
    time.sleep(0.2)
    future.cancel()
    assert not isinstance(first.get(timeout=60), InferenceServerException)
    # Wait long enough for a second execution to have happened if either request had stayed queued.
    time.sleep(1.5)
    wait_idle(client, "slow_cancel", before + 1)
    assert executions(client, "slow_cancel") == before + 1
    channel.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(native: ServerProcess, algorithm: str) -> None:
    client = tg.InferenceServerClient(native.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", simple_inputs(tg, a, a), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_malformed_request_is_invalid_argument_and_server_stays_up(native: ServerProcess) -> None:
    channel = grpc.insecure_channel(native.grpc_url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        infer(b"\x0a\xff\xff\xff\xff\x0f")  # field 1, a length far past the end
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ModelInferRequest" in (info.value.details() or "")
    channel.close()
    assert_simple(tg.InferenceServerClient(native.grpc_url))


def test_message_over_the_limit_is_resource_exhausted(native: ServerProcess) -> None:
    client = tg.InferenceServerClient(native.grpc_url)
    big = tg.InferInput("INPUT0", [1, 1 << 19], "FP32")  # 2 MB: over the 1 MB limit this server runs with
    big.set_data_from_numpy(np.zeros((1, 1 << 19), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp32", [big])
    assert "RESOURCE_EXHAUSTED" in str(info.value.status())
    assert "message larger than max" in info.value.message()
    assert_simple(client)


def test_not_http2_is_dropped_and_server_stays_up(native: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", native.grpc_port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while True:  # the server answers with a GOAWAY at most, then closes
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert b"HTTP/1.1 200" not in data
    assert_simple(tg.InferenceServerClient(native.grpc_url))


def test_sigterm_drains_calls_in_flight(tmp_path: Path) -> None:
    """SIGTERM: unary calls and a stream in flight are all answered, then the process exits."""
    write_model(tmp_path, "slow", slow_model_bytes(rows=1024, layers=24),
                config=SLOW_CONFIG)
    with ServerProcess(tmp_path, "--grpc-frontend", "native", "--exit-timeout", "60") as proc:
        answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        client = tg.InferenceServerClient(proc.grpc_url)
        for k in range(4):
            client.async_infer("slow", one(k), callback=lambda result, error: answers.put(error or result))
        streamer = tg.InferenceServerClient(proc.grpc_url)
        streamer.start_stream(callback=lambda result, error: answers.put(error or result))
        for k in range(3):
            streamer.async_stream_infer("slow", one(k))
        time.sleep(0.3)
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        got = [answers.get(timeout=60) for _ in range(7)]
        streamer.stop_stream()
        assert not [g for g in got if isinstance(g, Exception)], got
        assert proc.proc.wait(60) == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_tls_with_alpn_h2(demo_repo: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    with ServerProcess(demo_repo, "--grpc-frontend", "native", "--grpc-use-ssl", "--grpc-server-cert", str(cert),
                       "--grpc-server-key", str(key)) as proc:
        client = tg.InferenceServerClient(f"localhost:{proc.grpc_port}", ssl=True, root_certificates=str(cert))
        assert client.is_server_live()
        assert_simple(client)
        with pytest.raises(InferenceServerException):  # plaintext h2c is not spoken on a TLS port
            tg.InferenceServerClient(proc.grpc_url).is_server_live(client_timeout=5)


def test_max_connection_age_rotates_connections_without_failing_calls(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, "--grpc-frontend", "native", "--grpc-max-connection-age", "300",
                       "--log-level", "DEBUG") as proc:
        client = tg.InferenceServerClient(proc.grpc_url)
        until = time.monotonic() + 1.5
        calls = 0
        while time.monotonic() < until:
            assert_simple(client, calls)
            calls += 1
            time.sleep(0.02)
        goaways = sum("reached --grpc-max-connection-age" in line for line in proc.lines)
    assert calls > 10
    assert goaways >= 2, goaways  # the client reconnected after the first GOAWAY, and that one aged too


# -- the gRPC-over-HTTP/2 rules on their own (pure functions, no server) ----------------------------------
def test_grpc_timeout_parsing() -> None:
    from fastoip.server.grpc import protocol as wire

    assert wire.parse_timeout(b"100m") == 100_000_000
    assert wire.parse_timeout(b"5S") == 5_000_000_000
    assert wire.parse_timeout(b"1H") == 3600 * 10**9
    assert wire.parse_timeout(b"99999999n") == 99_999_999
    for bad in (b"", b"m", b"123456789S", b"10x", b"-1S", b"1.5S"):
        assert wire.parse_timeout(bad) is None, bad


def test_grpc_message_is_percent_encoded() -> None:
    from fastoip.server.grpc import protocol as wire

    assert wire.percent_encode("plain text: ok") == b"plain text: ok"
    assert wire.percent_encode("100% sure") == b"100%25 sure"
    assert wire.percent_encode("caf\u00e9\n") == b"caf%C3%A9%0A"
    assert wire.trailers_only(3, "x")[-2:] == [(b"grpc-status", b"3"), (b"grpc-message", b"x")]


def test_decompression_is_bounded() -> None:
    import gzip
    import zlib

    from fastoip.server.grpc import protocol as wire

    data = b"abc" * 1000
    assert wire.decompress(gzip.compress(data), b"gzip", 10_000) == data
    assert wire.decompress(zlib.compress(data), b"deflate", 10_000) == data
    bomb = gzip.compress(b"\0" * 10_000_000)
    with pytest.raises(wire.DecompressError) as info:
        wire.decompress(bomb, b"gzip", 1_000_000)
    assert info.value.code == wire.RESOURCE_EXHAUSTED
    with pytest.raises(wire.DecompressError) as info:
        wire.decompress(data, b"snappy", 10_000)
    assert info.value.code == wire.UNIMPLEMENTED
    with pytest.raises(wire.DecompressError):
        wire.decompress(b"not gzip at all", b"gzip", 10_000)


def test_without_the_extension_serve_falls_back_to_grpcio() -> None:
    """A build without libnghttp2: `fastoip serve` says so and serves gRPC with grpcio."""
    import sys

    script = ("import sys; sys.modules['fastoip.server.grpc._http2'] = None; from fastoip.cli import main; "
              "sys.exit(main(['serve', '--grpc-port', '0', '--http-port', '-1', '--metrics-port', '-1']))")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "grpc listening on" in line:
                break
        port = int(lines[-1].rsplit(":", 1)[1])
        assert tg.InferenceServerClient(f"127.0.0.1:{port}").is_server_live()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            # read what it still writes: a server blocked on a full pipe never exits
            lines.append(proc.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave a server behind; the test still fails
            raise
    text = "".join(lines)
    assert "fastoip: grpc frontend grpcio" in text
    # a WARNING at every start, naming the slower frontend and the fix
    warning = next(line for line in text.splitlines() if "the native one, which was not built" in line)
    assert " WARNING " in warning and "several times slower" in warning and "libnghttp2-dev" in warning

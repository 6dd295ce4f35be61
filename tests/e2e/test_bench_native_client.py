"""``fastoip bench``'s native gRPC client (nghttp2 driven from C) against real fastoip servers.

Each test runs the same load through the native client and a grpcio client and
expects the same accounting: every request sent ends as a success or a counted
status, the same statuses for the same fault, the same checks of the answers.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastoip.bench.cli import main as bench_main
from fastoip.bench.generators import make_generator, resolve_client
from fastoip.bench.inputs import encode_grpc, make_requests, plan_model
from fastoip.bench.load import LoadSpec, Sample
from fastoip.bench.measure import MeasureOptions, measure_level
from fastoip.bench.nativeload import NativeGrpcLoad, native_connections
from fastoip.bench.verify import ResponseCheck

pytest.importorskip("fastoip._codec", reason="the native codec is not built (setup.py build_ext --inplace)")
pytest.importorskip("fastoip.bench._h2client", reason="the native bench client is not built (no libnghttp2 headers)")

from serverproc import ServerProcess  # noqa: E402

Capture = pytest.CaptureFixture[str]
FAST = ["-p", "300", "-r", "3", "--warmup-ms", "200", "--quiet"]


def meta(name: str, dims: list[int], datatype: str = "INT32") -> dict:
    return {
        "name": name,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [-1, *dims]}],
        "outputs": [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, *dims]}],
    }


CONFIG = {"max_batch_size": 64, "inputs": {}, "dynamic_batching": False, "sequence_batching": False,
          "decoupled": False}


def identity_spec(port: int, client: str, name: str = "identity_fp32", dims: tuple[int, ...] = (16,),
                  expected_ok: bool = True) -> LoadSpec:
    plan = plan_model(meta(name, list(dims), "FP32"), CONFIG, 1, {})
    request = encode_grpc(plan, make_requests(plan, "random", 0)[0])
    outputs = plan.outputs
    if not expected_ok:  # a check that expects another shape: every answer is a bad response
        outputs = plan_model(meta(name, [d + 1 for d in dims], "FP32"), CONFIG, 1, {}).outputs
    return LoadSpec("grpc", "127.0.0.1", port, [request], ResponseCheck("grpc", set(), outputs), client=client)


def run_fixed(spec: LoadSpec, concurrency: int, seconds: float) -> tuple[Sample, int]:
    """Load for ``seconds``, stop (drain), and everything recorded: (sample, requests sent)."""
    generator = make_generator(spec, "concurrency", concurrency)
    try:
        generator.start_concurrency(concurrency)
        time.sleep(seconds)
        generator.stop(5.0)
        sample = generator.cut(0, 2**62)
    finally:
        generator.close()
    return sample, sample.sent


def test_auto_picks_native_where_it_can() -> None:
    spec = LoadSpec("grpc", "127.0.0.1", 1, [b""], ResponseCheck("grpc", set(), []))
    assert resolve_client(spec, "concurrency", 1) == "native"
    assert resolve_client(spec, "concurrency", 64) == "native"
    assert resolve_client(spec, "rate", 100) == "aio"  # no request-rate mode in the native client
    streaming = LoadSpec("grpc", "h", 1, [b""], spec.check, streaming=True)
    assert resolve_client(streaming, "concurrency", 8) == "native-stream"
    assert resolve_client(dataclasses.replace(streaming, client="aio"), "concurrency", 8) == "aio-stream"
    assert resolve_client(LoadSpec("grpc", "h", 1, [b""], spec.check, compression="gzip"), "concurrency", 8) == "aio"


def test_the_default_layout_is_the_one_the_server_serves_best() -> None:
    """Small unary calls share a connection (100 in flight each at most); 64 KiB requests or more get one
    connection per call, up to 16; streams share connections as small unary calls do, 64 KiB messages or more
    on streams keep min(C, 4) (benchmarks/RESULTS.md, 2026-11-27)."""
    assert [native_connections(c, 200) for c in (1, 64, 100, 101, 1000)] == [1, 1, 1, 2, 10]
    assert [native_connections(c, 602_000) for c in (1, 4, 16, 64)] == [1, 4, 16, 16]
    assert native_connections(64, 64 * 1024 - 1) == 1 and native_connections(64, 64 * 1024) == 16
    assert [native_connections(c, 200, streaming=True) for c in (1, 64, 100, 101)] == [1, 1, 1, 2]
    assert [native_connections(c, 602_000, streaming=True) for c in (1, 4, 64)] == [1, 4, 4]


@pytest.mark.parametrize("model, dims, concurrency, connections, streaming",
                         [("identity_fp32", (16,), 64, 1, False), ("image_identity", (3, 224, 224), 4, 4, False),
                          ("identity_fp32", (16,), 64, 1, True)],
                         ids=["small-one-connection", "large-one-each", "streams-one-connection"])
def test_the_native_client_opens_its_default_connections(server: ServerProcess, model: str, dims: tuple[int, ...],
                                                         concurrency: int, connections: int, streaming: bool) -> None:
    spec = (stream_spec(server.grpc_port, "native") if streaming
            else identity_spec(server.grpc_port, "native", name=model, dims=dims))
    generator = make_generator(spec, "concurrency", concurrency)
    assert isinstance(generator, NativeGrpcLoad)
    try:
        generator.start_concurrency(concurrency)
        assert generator.connections == connections
        time.sleep(0.5)
        generator.stop(5.0)
        sample = generator.cut(0, 2**62)
    finally:
        generator.close()
    assert sample.sent >= concurrency and sample.errors == {} and len(sample.lat_ns) == sample.sent


@pytest.mark.parametrize("client", ["native", "future"])
def test_every_request_is_accounted_for(server: ServerProcess, client: str) -> None:
    spec = identity_spec(server.grpc_port, client)
    sample, sent = run_fixed(spec, 8, 0.6)
    assert sent > 50
    assert sample.errors == {}
    assert len(sample.lat_ns) == sent  # each one answered, checked and recorded once
    assert len(sample.end_ns) == sent and np.all(sample.lat_ns > 0)


@pytest.mark.parametrize("client", ["native", "aio"])
def test_unknown_model_counts_not_found(server: ServerProcess, client: str) -> None:
    spec = identity_spec(server.grpc_port, client, name="nope")
    sample, sent = run_fixed(spec, 4, 0.4)
    assert sent > 10 and len(sample.lat_ns) == 0
    assert sample.errors == {"NOT_FOUND": sent}


@pytest.mark.parametrize("client", ["native", "future"])
def test_wrong_answers_count_bad_response(server: ServerProcess, client: str) -> None:
    spec = identity_spec(server.grpc_port, client, expected_ok=False)
    sample, sent = run_fixed(spec, 2, 0.3)
    assert sent > 5 and len(sample.lat_ns) == 0
    assert sample.errors == {"BAD_RESPONSE": sent}


def test_large_messages_both_ways(server: ServerProcess) -> None:
    """602 KB requests and answers: flow control in both directions, every answer checked."""
    spec = identity_spec(server.grpc_port, "native", name="image_identity", dims=(3, 224, 224))
    sample, sent = run_fixed(spec, 4, 0.8)
    assert sent >= 4 and sample.errors == {}
    assert len(sample.lat_ns) == sent


def test_windows_are_cut_by_end_time(server: ServerProcess) -> None:
    spec = identity_spec(server.grpc_port, "native")
    generator = make_generator(spec, "concurrency", 4)
    try:
        result = measure_level(generator, "concurrency", 4, 1, MeasureOptions(window_ms=200, warmup_ms=100,
                                                                              max_trials=3))
    finally:
        generator.close()
    for window in result.windows:
        assert window.sample.errors == {}
        assert np.all((window.sample.end_ns >= window.start_ns) & (window.sample.end_ns < window.end_ns))
        assert window.successes > 0


def test_server_killed_mid_run_counts_unavailable(demo_repo: Path) -> None:
    with ServerProcess(demo_repo, http=False) as proc:
        spec = identity_spec(proc.grpc_port, "native")
        generator = make_generator(spec, "concurrency", 4)
        # (1 s in, of up to 10 windows of 300 ms: under make test's load the first successes came after 0.4 s)
        killer = threading.Timer(1.0, proc.signal, args=(signal.SIGKILL,))
        killer.start()
        try:
            result = measure_level(generator, "concurrency", 4, 1,
                                   MeasureOptions(window_ms=300, warmup_ms=100, max_trials=10,
                                                  stability_pct=0.0))  # (never stable: it runs past the kill)
        finally:
            killer.cancel()
            generator.close()
        errors: dict = {}
        for window in result.windows:
            for status, count in window.sample.errors.items():
                errors[status] = errors.get(status, 0) + count
        assert errors.get("UNAVAILABLE", 0) > 0, errors
        assert sum(w.successes for w in result.windows) > 0
        proc.wait(10)


def test_cli_native_equals_grpcio(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    """The same command with --grpc-client native and future: same CSV columns, both error free, verified."""
    rows = {}
    for client in ("native", "future"):
        out_json, out_csv = tmp_path / f"{client}.json", tmp_path / f"{client}.csv"
        rc = bench_main([f"grpc://{server.grpc_url}", "-m", "simple", "--concurrency-range", "2", "--verify",
                         "--grpc-client", client, "--json", str(out_json), "-f", str(out_csv), *FAST])
        capsys.readouterr()
        assert rc == 0
        rows[client] = json.loads(out_json.read_text())["results"][0]
        assert out_csv.read_text().splitlines()[0] == (tmp_path / "native.csv").read_text().splitlines()[0]
    for client, row in rows.items():
        assert row["client"] == client and row["errors"] == {} and row["requests"] > 0
    assert rows["native"].keys() == rows["future"].keys()


@pytest.mark.parametrize("streaming", [False, True])
def test_request_timeout_counts_deadline_exceeded(streaming: bool) -> None:
    """A peer that accepts and never answers: each call ends DEADLINE_EXCEEDED after --request-timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)
        while conn.recv(65536):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    spec = stream_spec(port, "native") if streaming else identity_spec(port, "native")
    spec.timeout_s = 0.2
    try:
        sample, sent = run_fixed(spec, 2, 0.7)
    finally:
        for conn in accepted:
            conn.close()
        listener.close()
    assert sent >= 4 and len(sample.lat_ns) == 0
    assert sample.errors == {"DEADLINE_EXCEEDED": sent}


@pytest.mark.parametrize("extra", [["--request-rate-range", "100"], ["--grpc-compression-algorithm", "gzip"]])
def test_native_where_it_cannot_carry_the_load_is_refused(capsys: Capture, extra: list[str]) -> None:
    with pytest.raises(SystemExit) as info:  # a usage error, as every bad flag combination
        bench_main(["grpc://127.0.0.1:1", "-m", "simple", "--grpc-client", "native", *extra, *FAST])
    assert info.value.code == 2
    assert "--grpc-client native carries closed-loop load" in capsys.readouterr().err


def stream_spec(port: int, client: str, name: str = "identity_fp32") -> LoadSpec:
    plan = plan_model(meta(name, [16], "FP32"), CONFIG, 1, {})
    request = encode_grpc(plan, make_requests(plan, "random", 0)[0])
    return LoadSpec("grpc", "127.0.0.1", port, [request], ResponseCheck("grpc-stream", set(), plan.outputs),
                    client=client, streaming=True)


@pytest.mark.parametrize("client", ["native", "aio"])
def test_streaming_every_request_is_accounted_for(server: ServerProcess, client: str) -> None:
    spec = stream_spec(server.grpc_port, client)
    assert resolve_client(spec, "concurrency", 4) == f"{client}-stream"
    sample, sent = run_fixed(spec, 4, 0.6)
    assert sent > 20 and sample.errors == {}
    assert len(sample.lat_ns) == sent


@pytest.mark.parametrize("client", ["native", "aio"])
def test_streaming_in_band_errors_count_stream_error(server: ServerProcess, client: str) -> None:
    """ModelStreamInfer reports a bad request in the stream (error_message), and the stream goes on."""
    spec = stream_spec(server.grpc_port, client, name="nope")
    sample, sent = run_fixed(spec, 2, 0.4)
    assert sent > 5 and len(sample.lat_ns) == 0
    assert sample.errors == {"STREAM_ERROR": sent}

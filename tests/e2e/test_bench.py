"""``fastoip bench``: end to end against real server processes, plus its pure parts.

Windows are short (-p 300, at most 3 windows a level), so the whole file runs
in well under two minutes.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastoip.bench import BenchError, Target
from fastoip.bench.cli import main as bench_main
from fastoip.bench.cli import parse_range
from fastoip.bench.generators import make_generator
from fastoip.bench.inputs import encode_grpc, file_requests, make_requests, parse_shape_arg, plan_model
from fastoip.bench.load import LoadSpec, Sample
from fastoip.bench.measure import LevelResult, MeasureOptions, Window, is_stable, latency_summary, measure_level
from fastoip.bench.nativeload import native_available
from fastoip.bench.report import CSV_COLUMNS, LATENCY_KEYS, compare, validate
from fastoip.bench.verify import ResponseCheck

codec = pytest.importorskip("fastoip._codec", reason="the native codec is not built (setup.py build_ext --inplace)")

from serverproc import ServerProcess  # noqa: E402
from simple_model import SIMPLE_METADATA  # noqa: E402

Capture = pytest.CaptureFixture[str]  # the type of the capsys fixture
FAST = ["-p", "300", "-r", "3", "--warmup-ms", "200", "--quiet"]
SIMPLE_CONFIG = {
    "max_batch_size": 64,
    "inputs": {},
    "dynamic_batching": False,
    "sequence_batching": False,
    "decoupled": False,
}


def run_bench(args: list[str], capsys: Capture) -> tuple[int, str, str]:
    rc = bench_main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def load_json(path: Path) -> dict:
    document = json.loads(path.read_text())
    assert validate(document) == [], validate(document)
    return document


def assert_good_row(row: dict) -> None:
    assert row["throughput_infer_per_s"] > 0
    assert row["requests"] > 0
    assert row["errors"] == {}
    lat = row["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
    assert lat["avg"] > 0


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- end to end: fastoip
def test_concurrency_mode_json_and_csv(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    rc, stdout, _ = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "simple",
            "--concurrency-range",
            "1:4:3",
            "--verify",
            "--json",
            str(out_json),
            "-f",
            str(out_csv),
            "--fastoip-csv",  # fastoip's columns; perf_analyzer's layout: tests/test_bench_perf_analyzer.py
            *FAST,
        ],
        capsys,
    )
    assert rc == 0
    assert "simple" in stdout and "c=4" in stdout
    document = load_json(out_json)
    assert document["tool"] == "fastoip bench" and document["protocol"] == "grpc" and document["model"] == "simple"
    assert document["error"] is None and document["batch_size"] == 1
    rows = document["results"]
    assert [r["concurrency"] for r in rows] == [1, 4]
    # auto: the native client where built, else future below concurrency 8
    assert [r["client"] for r in rows] == ["native" if native_available() else "future"] * 2
    for row in rows:
        assert_good_row(row)
        assert row["mode"] == "concurrency" and row["request_rate"] is None and row["target"] == "server"
        # fastoip lists "statistics": the server-side split is there and saw our requests.
        assert row["server"] is not None
        assert row["server"]["requests"] >= row["requests"] * 0.9
        assert row["server"]["compute_infer_us"] > 0
        # "simple" batches (Triton's auto-complete gives it a dynamic batcher): one request alone is a batch of 1
        assert row["server"]["avg_batch_size"] >= 1.0
        if row["concurrency"] == 1:
            assert row["server"]["avg_batch_size"] == pytest.approx(1.0)
    with open(out_csv, newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        csv_rows = list(reader)
    assert len(csv_rows) == 2
    for csv_row, row in zip(csv_rows, rows, strict=True):
        assert int(csv_row["concurrency"]) == row["concurrency"]
        assert float(csv_row["throughput_infer_per_s"]) == pytest.approx(row["throughput_infer_per_s"])
        assert float(csv_row["latency_p99_us"]) >= float(csv_row["latency_p50_us"]) > 0
        assert csv_row["errors_total"] == "0" and csv_row["request_rate"] == ""
        assert csv_row["stable"] in ("True", "False")


@pytest.mark.parametrize("client", ["auto", "future"])
def test_request_rate_mode(server: ServerProcess, tmp_path: Path, capsys: Capture, client: str) -> None:
    out_json = tmp_path / "rate.json"
    rc, stdout, _ = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "simple",
            "--request-rate-range",
            "200",
            "--request-distribution",
            "poisson",
            "--grpc-client",
            client,
            "--json",
            str(out_json),
            *FAST,
        ],
        capsys,
    )
    assert rc == 0
    (row,) = load_json(out_json)["results"]
    assert row["mode"] == "request_rate" and row["request_rate"] == 200.0 and row["concurrency"] is None
    assert row["client"] == ("aio" if client == "auto" else client)  # auto: aio in request-rate mode
    assert_good_row(row)
    assert 100 < row["throughput_req_per_s"] < 300  # open loop: the schedule, not the server, sets the rate
    assert "r=200/s" in stdout


def test_batch_size_and_mlp_verify(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "mlp.json"
    rc, _, err = run_bench(
        [f"grpc://{server.grpc_url}", "-m", "mlp", "-b", "4", "--verify", "--json", str(out_json), *FAST], capsys
    )
    assert rc == 0, err
    assert "outputs match the reference" not in err  # --quiet
    (row,) = load_json(out_json)["results"]
    assert_good_row(row)
    assert row["batch_size"] == 4
    assert row["throughput_infer_per_s"] == pytest.approx(4 * row["throughput_req_per_s"])
    assert row["server"]["avg_batch_size"] >= 4.0


def test_bytes_model_and_input_file(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT0": list(range(16)), "INPUT1": {"content": [1] * 16, "shape": [16]}},
                    {"INPUT0": [5] * 16, "INPUT1": list(range(16))},
                ]
            }
        )
    )
    rc, _, err = run_bench(
        [f"grpc://{server.grpc_url}", "-m", "simple", "--input-data", str(data), "--verify", "--concurrency-range", "2",
         *FAST],
        capsys,
    )
    assert rc == 0, err
    rc, _, err = run_bench(
        [f"grpc://{server.grpc_url}", "-m", "string_identity", "--shape", "INPUT0:3", "--string-length", "7",
         "--verify", *FAST],
        capsys,
    )
    assert rc == 0, err
    # A -1 dim without --shape is a clear failure before any load.
    rc, _, err = run_bench([f"grpc://{server.grpc_url}", "-m", "string_identity", *FAST], capsys)
    assert rc == 1 and "--shape INPUT0:" in err


def test_unknown_model_is_a_clear_failure(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "nope.json"
    rc, _, err = run_bench([f"grpc://{server.grpc_url}", "-m", "nope", "--json", str(out_json), *FAST], capsys)
    assert rc == 1
    assert "model 'nope' not found" in err and "NOT_FOUND" in err
    document = load_json(out_json)
    assert document["error"]["stage"] == "metadata" and document["error"]["status"] == "NOT_FOUND"
    assert document["results"] == []


def test_errors_are_counted_by_status_under_load(server: ServerProcess) -> None:
    """Requests for a model the server does not have: every one fails, counted as NOT_FOUND."""
    plan = plan_model({**SIMPLE_METADATA, "name": "nope"}, SIMPLE_CONFIG, 1, {})
    request = encode_grpc(plan, make_requests(plan, "zero", 0)[0])
    host, port = server.grpc_url.split(":")
    for client in ("future", "aio"):
        spec = LoadSpec("grpc", host, int(port), [request], ResponseCheck("grpc", set(), []), client=client)
        options = MeasureOptions(window_ms=200, warmup_ms=50, max_trials=3)
        generator = make_generator(spec)
        try:
            result = measure_level(generator, "concurrency", 2, 1, options)
        finally:
            generator.close()
        row = result.to_dict()
        assert row["requests"] == 0 and row["throughput_req_per_s"] == 0
        assert set(row["errors"]) == {"NOT_FOUND"} and row["errors"]["NOT_FOUND"] > 0
        assert row["stable"] is False and row["latency_us"]["p99"] is None


def test_server_down_fails_cleanly(tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "down.json"
    started = time.monotonic()
    rc, _, err = run_bench([f"grpc://127.0.0.1:{closed_port()}", "-m", "simple", "--json", str(out_json), *FAST],
                           capsys)
    assert time.monotonic() - started < 20
    assert rc == 1 and "UNAVAILABLE" in err
    assert load_json(out_json)["error"]["status"] == "UNAVAILABLE"


def test_server_killed_mid_run_counts_unavailable(demo_repo: Path) -> None:
    """The load keeps going when the server dies: failures are counted, nothing hangs."""
    with ServerProcess(demo_repo) as proc:
        meta = dict(SIMPLE_METADATA)
        plan = plan_model(meta, SIMPLE_CONFIG, 1, {})
        tensors = make_requests(plan, "random", 0)[0]
        request = encode_grpc(plan, tensors)
        spec = LoadSpec("grpc", "127.0.0.1", proc.grpc_port, [request], ResponseCheck("grpc", set(), plan.outputs))
        generator = make_generator(spec)
        killer = threading.Timer(0.5, proc.signal, args=(signal.SIGKILL,))
        killer.start()
        started = time.monotonic()
        try:
            result = measure_level(
                generator, "concurrency", 4, 1, MeasureOptions(window_ms=300, warmup_ms=100, max_trials=10)
            )
        finally:
            killer.cancel()
            generator.close()
        assert time.monotonic() - started < 15
        errors: dict = {}
        for window in result.windows:
            for status, count in window.sample.errors.items():
                errors[status] = errors.get(status, 0) + count
        assert errors.get("UNAVAILABLE", 0) > 0, errors
        assert sum(w.successes for w in result.windows) > 0  # it measured before the kill
        proc.wait(10)


def test_streaming(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "stream.json"
    rc, _, err = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "simple",
            "--streaming",
            "--verify",
            "--concurrency-range",
            "1,3",
            "--json",
            str(out_json),
            *FAST,
        ],
        capsys,
    )
    assert rc == 0, err
    document = load_json(out_json)
    assert document["client"]["kind"] == ("native-stream" if native_available() else "aio-stream")
    for row in document["results"]:
        assert_good_row(row)


def test_streaming_and_shared_memory_fail_clearly_where_missing(server: ServerProcess, capsys: Capture) -> None:
    """A server without ModelStreamInfer (a bare grpcio server here) or shared memory: a clear message."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from fastoip.bench.probe import _grpc_stream_probe

    bare = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    try:
        with pytest.raises(BenchError, match="does not implement ModelStreamInfer") as info:
            _grpc_stream_probe(Target("grpc", "127.0.0.1", port), b"", 5.0)
        assert info.value.status == "UNIMPLEMENTED"
    finally:
        bare.stop(None)
    # The ceiling server lists no extensions at all.
    from fastoip.bench.ceiling import ceiling_argv, write_response_file
    from fastoip.bench.local import ChildServer

    response_file = write_response_file(b"")
    ceiling = ChildServer(ceiling_argv("grpc", response_file)).start(30)
    try:
        rc, _, err = run_bench(
            [f"grpc://127.0.0.1:{ceiling.ports['grpc']}", "-m", "simple", "--shared-memory", "system", *FAST], capsys
        )
        assert rc == 1 and "does not list the 'system_shared_memory' extension" in err
    finally:
        ceiling.stop()
        os.unlink(response_file)
    rc, _, err = run_bench([f"grpc://{server.grpc_url}", "-m", "simple", "--shared-memory", "cuda", *FAST], capsys)
    assert rc == 1 and "cuda_shared_memory" in err


def test_system_shared_memory(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    """Inputs and outputs in /dev/shm regions; --verify reads the outputs back; regions are cleaned up."""
    before = set(os.listdir("/dev/shm"))
    out_json = tmp_path / "shm.json"
    rc, _, err = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "simple",
            "--shared-memory",
            "system",
            "--verify",
            "-b",
            "2",
            "--concurrency-range",
            "1,3",
            "--json",
            str(out_json),
            *FAST,
        ],
        capsys,
    )
    assert rc == 0, err
    for row in load_json(out_json)["results"]:
        assert_good_row(row)
    rc, _, err = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "string_identity",
            "--shape",
            "INPUT0:2",
            "--verify",
            "--shared-memory",
            "system",
            *FAST,
        ],
        capsys,
    )
    assert rc == 0, err
    # this process's regions only: other test runs on the machine share /dev/shm
    ours = f"bench_fastoip-{os.getpid()}-"
    assert not [name for name in set(os.listdir("/dev/shm")) - before if name.startswith(ours)]


def test_ceiling_and_other_clients(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "ceiling.json"
    rc, stdout, err = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "simple",
            "--ceiling",
            "--concurrency-range",
            "2",
            "--grpc-client",
            "aio",
            "--json",
            str(out_json),
            *FAST,
        ],
        capsys,
    )
    assert rc == 0, err
    rows = load_json(out_json)["results"]
    assert [r["target"] for r in rows] == ["server", "ceiling"]
    assert {r["client"] for r in rows} == {"aio"}
    for row in rows:
        assert_good_row(row)
    assert rows[1]["server"] is None  # the ceiling has no statistics
    assert "ceiling" in stdout


def test_processes(server: ServerProcess, tmp_path: Path, capsys: Capture) -> None:
    out_json = tmp_path / "procs.json"
    rc, _, err = run_bench(
        [
            f"grpc://{server.grpc_url}",
            "-m",
            "identity_fp32",
            "--processes",
            "2",
            "--concurrency-range",
            "1,8",
            "--json",
            str(out_json),
            *FAST,
        ],
        capsys,
    )
    assert rc == 0, err
    document = load_json(out_json)
    assert document["client"]["processes"] == 2
    expected = ["native", "native"] if native_available() else ["future", "aio"]
    assert [r["client"] for r in document["results"]] == expected
    for row in document["results"]:
        assert_good_row(row)


def test_no_url_starts_and_stops_its_own_server(tmp_path: Path) -> None:
    out_json = tmp_path / "local.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastoip.cli",
            "bench",
            "--local-server",
            "-m",
            "simple",
            "--concurrency-range",
            "1:2:1",
            "--json",
            str(out_json),
            *FAST,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "simple" in proc.stdout and "c=2" in proc.stdout
    document = load_json(out_json)
    assert [r["concurrency"] for r in document["results"]] == [1, 2]
    for row in document["results"]:
        assert_good_row(row)
        assert row["server_cpu_percent"] is not None and row["other_cpu_percent"] is not None
    local = document["local_server"]
    assert local["pid"] > 0
    assert not pid_alive(local["pid"]), "the local server outlived the bench"
    assert document["url"].startswith("grpc://127.0.0.1:")


# --------------------------------------------------------------------------- HTTP and streaming generators
def test_http_generator_against_the_http_ceiling(tmp_path: Path) -> None:
    from fastoip.bench.ceiling import ceiling_argv, write_response_file
    from fastoip.bench.inputs import encode_http
    from fastoip.bench.local import ChildServer

    body = b'{"outputs":[]}'
    response = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    response_file = write_response_file(response)
    ceiling = ChildServer(ceiling_argv("http", response_file), want=("http",)).start(30)
    try:
        plan = plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 1, {})
        address = f"127.0.0.1:{ceiling.ports['http']}"
        for binary in (True, False):
            request = encode_http(plan, make_requests(plan, "random", 0)[0], address, binary)
            spec = LoadSpec(
                "http", "127.0.0.1", ceiling.ports["http"], [request], ResponseCheck("http", {len(body)}, [])
            )
            for mode, level in (("concurrency", 4), ("request_rate", 300.0)):
                generator = make_generator(spec)
                result = measure_level(
                    generator, mode, level, 1, MeasureOptions(window_ms=200, warmup_ms=50, max_trials=3)
                )
                row = result.to_dict()
                assert row["requests"] > 0 and row["errors"] == {}, row
    finally:
        ceiling.stop()
        os.unlink(response_file)
    # A dead HTTP port: connection failures are counted, nothing hangs.
    spec = LoadSpec("http", "127.0.0.1", closed_port(), [b"GET / HTTP/1.1\r\n\r\n"], ResponseCheck("http", set(), []))
    result = measure_level(
        make_generator(spec), "concurrency", 2, 1, MeasureOptions(window_ms=100, warmup_ms=0, max_trials=3)
    )
    assert result.to_dict()["errors"].get("CONNECTION_REFUSED", 0) > 0


def test_streaming_generator_against_the_ceiling(tmp_path: Path) -> None:
    from fastoip.bench.ceiling import ceiling_argv, write_response_file
    from fastoip.bench.local import ChildServer
    from fastoip.types import InferOutput, InferResponse

    plan = plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 1, {})
    tensors = make_requests(plan, "random", 0)[0]
    request = encode_grpc(plan, tensors)
    outputs = [
        InferOutput("OUTPUT0", "INT32", (1, 16), tensors["INPUT0"] + tensors["INPUT1"]),
        InferOutput("OUTPUT1", "INT32", (1, 16), tensors["INPUT0"] - tensors["INPUT1"]),
    ]
    response_file = write_response_file(codec.encode_infer_response(InferResponse("simple", "1", outputs=outputs)))
    ceiling = ChildServer(ceiling_argv("grpc", response_file)).start(30)
    try:
        spec = LoadSpec(
            "grpc",
            "127.0.0.1",
            ceiling.ports["grpc"],
            [request],
            ResponseCheck("grpc-stream", set(), plan.outputs),
            streaming=True,
        )
        generator = make_generator(spec)
        result = measure_level(
            generator, "concurrency", 3, 1, MeasureOptions(window_ms=200, warmup_ms=50, max_trials=3)
        )
        generator.close()
        row = result.to_dict()
        assert row["requests"] > 0 and row["errors"] == {}, row
    finally:
        ceiling.stop()
        os.unlink(response_file)


def test_http_against_fastoip(demo_repo: Path, tmp_path: Path, capsys: Capture) -> None:
    with ServerProcess(demo_repo, http=True) as proc:
        for binary in ("--http-binary", "--no-http-binary"):
            out_json = tmp_path / "http.json"
            rc, _, err = run_bench(
                [
                    f"http://{proc.http_url}",
                    "-m",
                    "simple",
                    "--verify",
                    binary,
                    "--concurrency-range",
                    "2",
                    "--json",
                    str(out_json),
                    *FAST,
                ],
                capsys,
            )
            assert rc == 0, err
            (row,) = load_json(out_json)["results"]
            assert_good_row(row)


# --------------------------------------------------------------------------- compare
def test_compare_prints_ratios(tmp_path: Path, capsys: Capture) -> None:
    def document(throughput: float, p99: float) -> dict:
        row = {
            "model": "simple",
            "target": "server",
            "mode": "concurrency",
            "concurrency": 8,
            "request_rate": None,
            "throughput_infer_per_s": throughput,
            "latency_us": {k: p99 for k in LATENCY_KEYS},
        }
        return {"results": [row]}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(document(1000.0, 2000.0)))
    b.write_text(json.dumps(document(2500.0, 1000.0)))
    assert bench_main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "2.50x" in out and "0.50x" in out and "c=8" in out
    assert compare(str(a), str(tmp_path / "missing.json")) == 1


# --------------------------------------------------------------------------- pure parts
def test_parse_range_and_target() -> None:
    assert parse_range("1:8:2", int, "-c") == [1, 3, 5, 7]
    assert parse_range("4", int, "-c") == [4]
    assert parse_range("1,8,64", int, "-c") == [1, 8, 64]
    assert parse_range("100:300:100", float, "-r") == [100.0, 200.0, 300.0]
    for bad in ("0", "8:1", "a", "1:2:0"):
        with pytest.raises(BenchError):
            parse_range(bad, int, "-c")
    assert Target.parse("localhost") == Target("http", "localhost", 8000)  # perf_analyzer's default protocol
    assert Target.parse("localhost", "grpc") == Target("grpc", "localhost", 8001)
    assert Target.parse("http://h:9") == Target("http", "h", 9)
    assert Target.parse("h:7", "http").url == "http://h:7"
    assert Target.parse("grpc://[::1]:5").address == "[::1]:5"
    assert parse_shape_arg("INPUT0:3,4") == ("INPUT0", [3, 4])
    with pytest.raises(BenchError):
        parse_shape_arg("INPUT0")


def test_batch_rule() -> None:
    plan = plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 8, {})
    assert plan.batched and [t.shape for t in plan.inputs] == [[8, 16], [8, 16]]
    assert plan.outputs[0].shape == [8, 16]
    with pytest.raises(BenchError, match="max_batch_size"):
        plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 65, {})
    no_batch = {**SIMPLE_CONFIG, "max_batch_size": 0}
    with pytest.raises(BenchError, match="does not support batching"):
        plan_model(SIMPLE_METADATA, no_batch, 2, {})
    plan = plan_model(SIMPLE_METADATA, no_batch, 1, {"INPUT0": [2, 16], "INPUT1": [2, 16]})
    assert not plan.batched and plan.inputs[0].shape == [2, 16]
    # No config: a leading -1 on every input is taken as the batch dim.
    plan = plan_model(SIMPLE_METADATA, None, 4, {})
    assert plan.batched and plan.source == "metadata" and plan.inputs[0].shape == [4, 16]
    fixed = {**SIMPLE_METADATA, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3]}]}
    with pytest.raises(BenchError, match="-b must be 1"):
        plan_model(fixed, None, 2, {})
    with pytest.raises(BenchError, match="needs 1"):
        plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 1, {"INPUT0": [4, 4]})


def test_input_file_forms() -> None:
    import base64

    plan = plan_model(SIMPLE_METADATA, SIMPLE_CONFIG, 2, {})
    raw = np.arange(16, dtype="<i4")
    entries: list[dict[str, Any]] = [
        {"INPUT0": list(range(16)), "INPUT1": {"b64": base64.b64encode(raw.tobytes()).decode()}},
        {"INPUT0": {"content": [[1] * 8, [2] * 8], "shape": [16]}, "INPUT1": [0] * 16},
        {"INPUT0": [3] * 16, "INPUT1": [3] * 16},
    ]
    requests = file_requests(plan, entries)
    assert len(requests) == 1  # 3 entries // batch 2
    assert requests[0]["INPUT0"].shape == (2, 16) and requests[0]["INPUT0"].dtype == np.dtype("<i4")
    assert np.array_equal(requests[0]["INPUT1"][0], raw)
    with pytest.raises(BenchError, match="no input 'INPUT1'"):
        file_requests(plan, [{"INPUT0": [0] * 16}])
    with pytest.raises(BenchError, match="do not fill"):
        file_requests(plan, [{"INPUT0": [0] * 15, "INPUT1": [0] * 16}])


def test_codec_request_equals_protobuf() -> None:
    from fastoip._proto import grpc_service_pb2 as pb
    from fastoip.bench.inputs import _encode_grpc_protobuf

    meta = {
        **SIMPLE_METADATA,
        "name": "string_identity",
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}],
        "outputs": [],
    }
    plan = plan_model(meta, SIMPLE_CONFIG, 2, {"INPUT0": [3]})
    tensors = make_requests(plan, "random", 5)[0]
    a = pb.ModelInferRequest.FromString(encode_grpc(plan, tensors))
    b = pb.ModelInferRequest.FromString(_encode_grpc_protobuf(plan, tensors))
    assert a == b
    assert list(a.inputs[0].shape) == [2, 3] and len(a.raw_input_contents[0]) == 6 * (4 + 5)


def test_stability_rule_and_percentiles() -> None:
    def window(count: int, latency_us: float) -> Window:
        lat = np.full(count, int(latency_us * 1e3), dtype=np.int64)
        return Window(0, 1_000_000_000, Sample(lat, {}))

    assert not is_stable([window(100, 10), window(100, 10)], 10, None)
    assert is_stable([window(100, 10), window(105, 10.5), window(96, 9.8)], 10, None)
    assert not is_stable([window(100, 10), window(150, 10), window(100, 10)], 10, None)
    assert not is_stable([window(100, 10), window(100, 20), window(100, 10)], 10, 99)
    assert not is_stable([window(0, 0), window(0, 0), window(0, 0)], 10, None)
    lat = np.random.default_rng(0).integers(1, 10_000_000, size=10_000)
    summary = latency_summary(lat)
    p50, p90, p95, p99 = (summary[key] for key in ("p50", "p90", "p95", "p99"))
    assert p50 is not None and p90 is not None and p95 is not None and p99 is not None
    assert p50 <= p90 <= p95 <= p99
    assert latency_summary(np.empty(0, np.int64))["p99"] is None
    result = LevelResult("concurrency", 4, 2, True, [window(100, 10)] * 4, window_ms=1000)
    row = result.to_dict()
    assert row["requests"] == 300 and row["throughput_req_per_s"] == pytest.approx(100)
    assert row["throughput_infer_per_s"] == pytest.approx(200)


def test_schema_validation_catches_problems() -> None:
    assert any("missing 'results'" in p for p in validate({}))
    bad_row = {"model": "m", "target": "server", "mode": "concurrency", "concurrency": "8"}
    problems = validate({"results": [bad_row]})
    assert any("'concurrency' is str" in p for p in problems)
    assert any("latency_us" in p for p in problems)

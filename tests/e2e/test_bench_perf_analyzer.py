"""``fastoip bench`` speaks perf_analyzer: its CSV layout, its measurement modes and flags, refusals by name.

End to end against real fastoip processes (short windows), plus the CSV writer on known rows.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from fastoip.bench.cli import build_parser, parse_header, parse_request_parameter
from fastoip.bench.cli import main as bench_main
from fastoip.bench.perf_analyzer import REFUSED, csv_text
from fastoip.bench.target import BenchError

codec = pytest.importorskip("fastoip._codec", reason="the native codec is not built (setup.py build_ext --inplace)")

from serverproc import ServerProcess, wait_until  # noqa: E402

FAST = ["-p", "300", "-r", "3", "--warmup-ms", "200", "--quiet"]
#: perf_analyzer's header with server statistics, in its order (src/report_writer.cc).
HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
          "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency")
VERBOSE = HEADER + ",Avg latency,request/response,response wait"


def run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = bench_main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def row(concurrency: int, throughput: float, avg: float, server: dict | None) -> dict:
    return {
        "mode": "concurrency", "concurrency": concurrency, "request_rate": None,
        "throughput_infer_per_s": throughput,
        "latency_us": {"avg": avg, "p50": avg - 10, "p90": avg + 10.7, "p95": avg + 20, "p99": avg + 30.2},
        "server": server,
    }


def test_csv_layout_on_known_rows() -> None:
    server = {"queue_us": 100.9, "compute_input_us": 10.2, "compute_infer_us": 200.5, "compute_output_us": 5.0}
    rows = [row(8, 5321.456, 1500.7, server), row(1, 912.3456, 1100.2, server)]
    text = csv_text(rows)
    lines = text.splitlines()
    assert lines[0] == HEADER
    # Sorted by throughput, as perf_analyzer sorts; rates as a C++ stream prints a double; whole microseconds.
    # Network+Server = avg - (queue + compute input + infer + output), client send/recv not split off (0).
    assert lines[1] == "1,912.346,0,785,100,10,200,5,0,1090,1110,1120,1130"
    assert lines[2] == "8,5321.46,0,1185,100,10,200,5,0,1490,1511,1520,1530"
    verbose = csv_text(rows, verbose=True).splitlines()
    assert verbose[0] == VERBOSE and verbose[1].endswith(",1100,0,1100")
    assert csv_text(rows, verbose=True, percentile=99).splitlines()[0] == HEADER + ",request/response,response wait"
    # A server without statistics: no server columns, as perf_analyzer without server stats.
    bare = csv_text([row(1, 10.0, 50.0, None)]).splitlines()
    assert bare[0] == "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,p95 latency," \
                      "p99 latency"
    rate = dict(row(1, 99.5, 50.0, None), mode="request_rate", concurrency=None, request_rate=100.0)
    assert csv_text([rate]).splitlines()[1].startswith("100,99.5,0,0,40,")
    gpu = dict(row(1, 10.0, 50.0, server), metrics={"gpu_utilization": {"GPU-1": 0.5}, "gpu_power_usage": {},
                                                     "gpu_memory_used_bytes": {"GPU-1": 1024.0},
                                                     "gpu_memory_total_bytes": {"GPU-1": 4096.0}})
    line = csv_text([gpu], verbose=True, metrics=True).splitlines()
    assert line[0].endswith(",Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory")
    assert line[1].endswith(",GPU-1:0.5;,,GPU-1:1024;,GPU-1:4096;")


def test_f_writes_perf_analyzer_csv_against_fastoip(server, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out_csv, out_json = tmp_path / "pa.csv", tmp_path / "r.json"
    rc, _, _ = run([f"grpc://{server.grpc_url}", "-m", "simple", "--concurrency-range", "1:2", "-a", "-f", str(out_csv),
                    "--verbose-csv", "--json", str(out_json), *FAST], capsys)
    assert rc == 0
    document = json.loads(out_json.read_text())
    with open(out_csv, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        records = list(reader)
    assert ",".join(header) == VERBOSE
    assert len(records) == 2
    by_level = {int(r[0]): r for r in records}
    for result in document["results"]:
        record = by_level[result["concurrency"]]
        assert float(record[1]) == pytest.approx(result["throughput_infer_per_s"], rel=1e-5)
        assert int(record[4]) == int(result["server"]["queue_us"])
        assert int(record[6]) == int(result["server"]["compute_infer_us"]) and int(record[6]) > 0
        assert int(record[9]) == int(result["latency_us"]["p50"]) and int(record[12]) >= int(record[9])
        assert int(record[13]) == int(result["latency_us"]["avg"])
    # rows ascend in throughput, as perf_analyzer writes them
    assert [float(r[1]) for r in records] == sorted(float(r[1]) for r in records)


def test_count_windows_request_count_and_warmup_count(server, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.json"
    rc, _, _ = run([f"grpc://{server.grpc_url}", "-m", "simple", "--sync", "--measurement-mode", "count_windows",
                    "--measurement-request-count", "40", "--warmup-request-count", "20", "-r", "3", "--quiet",
                    "--json", str(out)], capsys)
    assert rc == 0
    result = json.loads(out.read_text())["results"][0]
    assert 1 <= result["windows"] <= 3
    # each reported window held at least 40 completed requests
    assert result["requests"] >= 40 * min(3, result["windows"])

    rc, _, _ = run([f"grpc://{server.grpc_url}", "-m", "simple", "--request-count", "100", "--concurrency-range", "4",
                    "--quiet", "--json", str(out)], capsys)
    assert rc == 0
    result = json.loads(out.read_text())["results"][0]
    assert result["windows"] == 1 and result["stable"] is True
    assert result["requests"] >= 100


PARAMS_MODEL = """
    import numpy as np
    import fastoip

    class Echo(fastoip.Model):
        def predict(self, inputs, parameters):
            # Fails unless the bench sent the parameter, the header-free way a script would check it.
            if parameters.get("scale") != 3 or parameters.get("tag") != "pa" or parameters.get("flag") is not True:
                raise ValueError(f"parameters not received: {parameters}")
            text = inputs["TEXT"]
            if any(bytes(t) != b"hello perf" for t in text.ravel()):
                raise ValueError(f"string data not received: {text!r}")
            return {"OUT": inputs["X"] * parameters["scale"]}
"""
PARAMS_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] },
            { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def params_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import textwrap

    root = tmp_path_factory.mktemp("pa-repo")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(textwrap.dedent(PARAMS_MODEL))
    (root / "echo" / "config.pbtxt").write_text(textwrap.dedent(PARAMS_CONFIG))
    with ServerProcess(root, http=True, metrics=True) as proc:
        yield proc


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_request_parameters_string_data_headers_and_compression(  # type: ignore[no-untyped-def]
    params_server, protocol: str, tmp_path: Path, capsys
) -> None:
    url = params_server.grpc_url if protocol == "grpc" else params_server.http_url
    out = tmp_path / "r.json"
    extra = ["--grpc-compression-algorithm", "gzip"] if protocol == "grpc" else []
    rc, _, err = run([url, "-i", protocol, "-m", "echo", "--request-parameter", "scale:3:int",
                      "--request-parameter", "tag:pa:string", "--request-parameter", "flag:true:bool",
                      "--string-data", "hello perf", "-H", "X-Trace-Tag: bench", *extra, "--json", str(out),
                      *FAST], capsys)
    assert rc == 0, err
    result = json.loads(out.read_text())["results"][0]
    assert result["errors"] == {} and result["requests"] > 0


def test_data_directory(params_server, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    data.mkdir()
    (data / "X").write_bytes(np.arange(4, dtype="<i4").tobytes())
    (data / "TEXT").write_text("hello perf\n")
    out = tmp_path / "r.json"
    rc, _, err = run([f"grpc://{params_server.grpc_url}", "-m", "echo", "--request-parameter", "scale:3:int",
                      "--request-parameter", "tag:pa:string", "--request-parameter", "flag:true:bool",
                      "--data-directory", str(data), "--json", str(out), *FAST], capsys)
    assert rc == 0, err
    assert json.loads(out.read_text())["results"][0]["errors"] == {}
    (data / "X").write_bytes(b"\x00" * 3)  # not a whole INT32, let alone 4 of them
    rc, _, err = run([f"grpc://{params_server.grpc_url}", "-m", "echo", "--data-directory", str(data), *FAST], capsys)
    assert rc == 1 and "input 'X' holds 3 bytes, not a whole number of INT32 values" in err


def test_collect_metrics_scrapes_the_servers_metrics(params_server, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out, out_csv = tmp_path / "r.json", tmp_path / "pa.csv"
    url = f"127.0.0.1:{params_server.metrics_port}/metrics"
    rc, _, err = run([f"grpc://{params_server.grpc_url}", "-m", "echo", "--request-parameter", "scale:3:int",
                      "--request-parameter", "tag:pa:string", "--request-parameter", "flag:true:bool",
                      "--string-data", "hello perf", "--collect-metrics", "--metrics-url", url,
                      "--metrics-interval", "100", "--verbose-csv", "-f", str(out_csv), "--json", str(out), *FAST],
                     capsys)
    assert rc == 0, err
    metrics = json.loads(out.read_text())["results"][0]["metrics"]
    assert metrics["scrapes"] >= 2 and metrics["scrape_errors"] == 0
    header = out_csv.read_text().splitlines()[0]
    assert header.endswith(",Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory")
    rc, _, err = run([f"grpc://{params_server.grpc_url}", "-m", "echo", "--collect-metrics", "--metrics-url",
                      "127.0.0.1:1/metrics", *FAST], capsys)
    assert rc == 1 and "--metrics-url http://127.0.0.1:1/metrics" in err


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_flags_it_cannot_honour_are_refused_by_name(flag: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["localhost:8001", "-m", "simple", flag, "1"])
    assert exit_info.value.code == 2
    assert f"perf_analyzer's {flag} is not supported by fastoip bench: {REFUSED[flag]}" in capsys.readouterr().err


def test_unknown_and_abbreviated_flags_are_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    for words in (["--warmup", "5"], ["--request", "5"], ["--no-such-flag"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["localhost:8001", "-m", "simple", *words])
        assert words[0] in capsys.readouterr().err  # named, never taken for a longer flag


def test_usage_errors_name_the_flag(capsys) -> None:  # type: ignore[no-untyped-def]
    cases = [
        (["--metrics-url", "x:1/metrics"], "--metrics-url needs --collect-metrics"),
        (["-a", "--sync"], "not allowed with argument"),
        (["--request-parameter", "a:1"], "expected NAME:VALUE:TYPE"),
        (["--request-parameter", "a:x:int"], "'x' is not an int"),
        (["-H", "no-colon"], "expected HEADER:VALUE"),
        (["--string-data", "s", "--data-directory", "/tmp"], "--string-data and --data-directory are exclusive"),
        (["-m", "other", "-f", "x.csv"], "no model column"),
        (["--measurement-request-count", "0"], "--measurement-request-count must be >= 1"),
    ]
    for words, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            bench_main(["localhost:8001", "-m", "simple", *words])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, words


def test_parsers() -> None:
    assert parse_request_parameter("max_tokens:256:int") == ("max_tokens", 256)
    assert parse_request_parameter("on:TRUE:bool") == ("on", True)
    assert parse_request_parameter("s:a b:STRING") == ("s", "a b")
    assert parse_header("Authorization: Bearer x:y") == ("Authorization", "Bearer x:y")
    with pytest.raises(BenchError):
        parse_header("X-A: b\r\nX-Injected: c")
    stream = io.StringIO()
    stream.write(csv_text([]))
    assert stream.getvalue() == ""


@pytest.mark.parametrize("client", ["future", "aio"])
def test_headers_travel_as_grpc_metadata(client: str) -> None:
    """A real gRPC server in the test process records what the load generator sends.

    (gRPC hides the compression headers from the handler: that gzip requests are accepted and
    decoded is what the end-to-end test with --grpc-compression-algorithm gzip shows.)
    """
    import threading
    from concurrent import futures

    import grpc

    from fastoip.bench.generators import make_generator
    from fastoip.bench.load import INFER_METHOD, LoadSpec
    from fastoip.bench.verify import ResponseCheck

    seen: list[tuple[dict, bytes]] = []
    lock = threading.Lock()

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        with lock:
            seen.append((dict(context.invocation_metadata()), request))
        return b""

    handler = grpc.method_handlers_generic_handler(
        INFER_METHOD.split("/")[1],
        {INFER_METHOD.split("/")[2]: grpc.unary_unary_rpc_method_handler(infer)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        spec = LoadSpec("grpc", "127.0.0.1", port, [b"\x0a\x06simple"], ResponseCheck("grpc", {0}, []),
                        client=client, metadata=(("x-trace-tag", "bench"),), compression="gzip")
        generator = make_generator(spec, "concurrency", 2)
        generator.start_concurrency(2)
        wait_until(lambda: len(seen) >= 10, timeout=30)
        generator.stop(5.0)
        generator.close()
    finally:
        server.stop(None)
    assert len(seen) >= 10
    for metadata, request in seen:
        assert metadata["x-trace-tag"] == "bench"
        assert request == b"\x0a\x06simple"


def test_profile_export_file(server, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import time

    out, profile = tmp_path / "r.json", tmp_path / "profile.json"
    before = time.time_ns()
    rc, _, err = run([f"grpc://{server.grpc_url}", "-m", "simple", "--concurrency-range", "1:2",
                      "--profile-export-file", str(profile), "--json", str(out), *FAST], capsys)
    after = time.time_ns()
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    document = json.loads(profile.read_text())
    assert set(document) == {"experiments", "version", "service_kind", "endpoint"}
    assert [e["experiment"] for e in document["experiments"]] == [
        {"mode": "concurrency", "value": 1}, {"mode": "concurrency", "value": 2}]
    for entry, row in zip(document["experiments"], rows, strict=True):
        requests = entry["requests"]
        assert len(requests) == row["requests"] > 0  # every success of the reported windows
        boundaries = entry["window_boundaries"]
        assert boundaries == sorted(boundaries) and before < boundaries[0] and boundaries[-1] < after
        starts = [r["timestamp"] for r in requests]
        assert starts == sorted(starts)
        latencies = []
        for request in requests:
            (response,) = request["response_timestamps"]
            assert request["request_inputs"] == {} and request["response_outputs"] == []
            assert boundaries[0] <= response < boundaries[-1]  # completed inside a reported window
            latencies.append(response - request["timestamp"])
        assert np.mean(latencies) / 1e3 == pytest.approx(row["latency_us"]["avg"], rel=1e-6)

"""The first hour of a new user: each common mistake gets an error that says what to do, and fast.

Real ``fastoip serve`` processes: the errors are what a user reads on the terminal.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from fastoip import cli, serve_help
from fastoip.cli import serve_options
from fastoip.repository.layout import missing_version_hint, model_folder_given_as_repository
from fastoip.triton_flags import FlagError
from models import identity_model_bytes, write_model
from python_models import write_python_model
from serverproc import ServerProcess

SERVE = [sys.executable, "-m", "fastoip.cli", "serve"]
NO_PORTS = ["--grpc-port=0", "--http-port=-1", "--metrics-port=-1"]


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return identity_model_bytes(TensorProto.FLOAT, [4])


def _model_error(root: Path, name: str) -> str:
    """The reason the server gives for a model that did not load (its HTTP model-ready answer's log)."""
    with ServerProcess(root, http=True) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready(name)
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        return str(index[name].get("reason", "")) + server.output()


# -- layout mistakes ------------------------------------------------------------------
def test_a_model_file_outside_a_version_folder_says_where_to_move_it(tmp_path: Path, model_bytes: bytes) -> None:
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "mymodel" / "model.onnx").write_bytes(model_bytes)
    error = _model_error(tmp_path, "mymodel")
    assert "move it to mymodel/1/model.onnx" in error
    # the fix leads, in the index's reason and in the log's line; Triton's misleading sentence comes after it
    reason = error.split("\n", 1)[0]
    assert reason.startswith("found mymodel/model.onnx outside a version folder: move it to mymodel/1/model.onnx")
    assert reason.index("move it to") < reason.index("Expected model name of the form")
    logged = next(line for line in error.splitlines() if "model 'mymodel' failed to load" in line)
    assert logged.split("model 'mymodel' failed to load: ", 1)[1].startswith("found mymodel/model.onnx outside")


def test_a_version_folder_with_another_file_name_says_how_to_name_it(tmp_path: Path, model_bytes: bytes) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "resnet.onnx").write_bytes(model_bytes)
    hint = missing_version_hint("m", tmp_path / "m", "model.onnx")
    assert "m/1/ holds resnet.onnx" in hint and "default_model_filename" in hint


def test_a_model_folder_given_as_the_repository_names_its_parent(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "simple", model_bytes, config='name: "simple"\n')
    write_model(tmp_path, "bare", model_bytes)  # no config: only the version folder marks it
    for name in ("simple", "bare"):
        with pytest.raises(FlagError, match=f"give its parent, --model-repository {tmp_path}"):
            serve_options([f"--model-repository={tmp_path / name}"])
    assert model_folder_given_as_repository(tmp_path) == ""  # the repository itself is fine
    # MLServer's layout: model-settings.json at the repository root (`mlserver start .`) is a repository...
    mlserver_root = tmp_path / "mlserver-root"
    mlserver_root.mkdir()
    (mlserver_root / "model-settings.json").write_text('{"name": "m", "implementation": "runtime.M"}')
    assert model_folder_given_as_repository(mlserver_root) == ""
    # ...but beside version folders it marks one model's folder
    (mlserver_root / "1").mkdir()
    assert "it holds model-settings.json" in model_folder_given_as_repository(mlserver_root)
    done = subprocess.run([*SERVE, f"--model-repository={tmp_path / 'simple'}", *NO_PORTS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "looks like one model's folder" in done.stderr


def test_a_malformed_config_names_the_file_and_line(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "bad", model_bytes, config='name: "bad"\nmax_batch_size: 0\ninput [\n { name: "x" }\n'
                                                      '{ name: "y" }\n')
    error = _model_error(tmp_path, "bad")
    # the file by its model, not by the server's path (load errors never show server paths: issue 27)
    assert "<model 'bad'>/config.pbtxt, line 5, column 1: " in error


# -- flags -------------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "nearest"), [
    ("--grpc-prot", "did you mean --grpc-port"),
    ("--http_port", "did you mean --http-port?"),
    ("--exit-timout-secs", "did you mean --exit-timeout-secs"),
    ("--log-verbse", "did you mean --log-verbose?"),
    ("--model-respository", "did you mean --model-repository"),
])
def test_an_unknown_flag_gets_the_nearest_spelling(capsys: pytest.CaptureFixture, given: str, nearest: str) -> None:
    with pytest.raises(SystemExit):
        serve_options([given, "7"])
    err = capsys.readouterr().err
    assert nearest in err
    assert "'7'" not in err  # the unknown flag's value is not a second complaint


def test_a_repository_given_without_its_flag_says_which_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        serve_options([str(tmp_path)])
    assert f"--model-repository {tmp_path}" in capsys.readouterr().err


# -- timing: a port in use, Ctrl-C on an idle server --------------------------------------
def test_a_port_in_use_fails_before_any_model_loads(tmp_path: Path, model_bytes: bytes) -> None:
    for index in range(20):  # many models: loading them would take a while
        write_model(tmp_path, f"m{index}", model_bytes)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([*SERVE, f"--model-repository={tmp_path}", "--grpc-port=0", f"--http-port={port}",
                               "--metrics-port=-1"], capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert f"--http-port {port}: cannot bind 127.0.0.1:{port}" in done.stderr
    assert "pick another port with --http-port" in done.stderr
    assert "model repository" not in done.stderr  # nothing was loaded
    # the interpreter's start and imports dominate (about 1 s quiet); the stderr check above is what shows nothing
    # loaded: this bound only catches a wait, with room for make test's 6 workers on a 2-core machine (5.5 s seen)
    assert elapsed < 10.0, elapsed


def test_ctrl_c_on_an_idle_server_exits_without_the_grace_period(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "identity", model_bytes)
    server = ServerProcess(tmp_path, "--shutdown-grace=20").start()
    try:
        started = time.monotonic()
        server.signal(signal.SIGINT)
        assert server.wait(15) == 0
        assert time.monotonic() - started < 10  # not the 20 s grace
        assert "no grace period" in server.output()
    finally:
        server.stop()


# -- readiness a user can wait on -----------------------------------------------------------
HEALTH = [sys.executable, "-m", "fastoip.cli", "health"]


def test_health_names_the_failed_model_and_exits_nonzero(tmp_path: Path, model_bytes: bytes) -> None:
    """README's wait loop: `fastoip health --wait` ends at once when a model failed, saying which and why."""
    write_model(tmp_path, "good", model_bytes)
    write_model(tmp_path, "broken", b"not an onnx model")
    with ServerProcess(tmp_path, http=True) as server:
        started = time.monotonic()
        done = subprocess.run([*HEALTH, "--url", server.http_url, "--wait", "60"], capture_output=True, text=True,
                              timeout=120)
        assert time.monotonic() - started < 30  # not the 60 s: a failed model will not become ready
    assert done.returncode == 1, done
    assert "fastoip: model 'broken' failed to load: onnxruntime could not load" in done.stderr, done.stderr
    assert "good" not in done.stderr


def test_health_exits_zero_when_ready_and_waits_for_a_server(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "good", model_bytes)
    with ServerProcess(tmp_path, http=True) as server:
        done = subprocess.run([*HEALTH, "--url", f"http://{server.http_url}/"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and f"ready: http://{server.http_url}" in done.stdout, done
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    started = time.monotonic()
    done = subprocess.run([*HEALTH, "--url", f"127.0.0.1:{port}", "--wait", "2"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and f"no server answers at http://127.0.0.1:{port}" in done.stderr, done
    assert 1.5 < time.monotonic() - started < 60


SLOW_INITIALIZE = """
    import os, time

    class TritonPythonModel:
        def initialize(self, args):
            with open(os.environ["FASTOIP_TEST_PID_FILE"], "w") as out:
                out.write(str(os.getpid()))
            time.sleep(30)

        def execute(self, requests):
            return []
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie waiting for init to reap it
    except OSError:
        return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_30_s_model_load_stops_within_a_second_or_two(tmp_path: Path, signum: int) -> None:
    """Before: the signal was logged, then the server waited for the load, opened its listeners, then stopped."""
    config = 'backend: "python"\ninput [{ name: "IN", data_type: TYPE_FP32, dims: [1] }]\n' \
             'output [{ name: "OUT", data_type: TYPE_FP32, dims: [1] }]\n'
    write_python_model(tmp_path, "slow", SLOW_INITIALIZE, config=config)
    pid_file = tmp_path / "worker.pid"
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*SERVE, f"--model-repository={tmp_path}", *NO_PORTS], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "FASTOIP_TEST_PID_FILE": str(pid_file)})
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        started = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == 0
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert took < 3, (took, text)
    assert "stopping before the models finished loading: abandoning the load of 'slow'" in text
    assert "listening on" not in text  # no listener opened after the signal
    deadline = time.monotonic() + 5
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker), "the model's worker process outlived the server"


# -- small mistakes, one clear line each -----------------------------------------------------
def test_an_object_storage_repository_without_its_extra_is_one_line() -> None:
    script = ("import sys; sys.modules['s3fs'] = None; from fastoip.cli import main; "
              "sys.exit(main(['serve', '--model-repository', 's3://bucket/models', '--grpc-port', '0', "
              "'--http-port', '-1', '--metrics-port', '-1']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert ("fastoip: cannot start: model repository 's3://bucket/models' needs s3fs: pip install 'fastoip[s3]'"
            in done.stderr), done.stderr


def test_an_80_mb_body_sent_by_urllib_gets_the_413_not_a_reset(tmp_path: Path, model_bytes: bytes) -> None:
    """urllib sends the whole body before it reads: the server reads and drops it after answering (lingering
    close, as nginx), instead of closing with unread bytes (a reset: "Broken pipe")."""
    import urllib.error
    import urllib.request

    write_model(tmp_path, "identity", model_bytes)
    body = b'{"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [' + b"1," * (40 << 20) \
        + b'1]}]}'
    assert len(body) > 80 << 20
    with ServerProcess(tmp_path, http=True) as server:
        for _ in range(2):  # the server stays up and answers again
            request = urllib.request.Request(f"http://{server.http_url}/v2/models/identity/infer", data=body)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=60)
            assert refused.value.code == 413
            assert b"--http-max-input-size" in refused.value.read()
        assert httpclient.InferenceServerClient(server.http_url).is_server_ready()


def test_the_lingering_close_after_a_413_is_bounded(tmp_path: Path, model_bytes: bytes) -> None:
    """Who can hold the drop-the-body reading: a client that stops sending is closed ~2 s after its last bytes.
    (``connection: close``, as urllib sends it: a keep-alive connection is answered and stays open, its body
    discarded as it arrives, under the body timeouts.)"""
    write_model(tmp_path, "identity", model_bytes)
    with ServerProcess(tmp_path, http=True) as server, socket.create_connection(("127.0.0.1", server.http_port),
                                                                                 timeout=20) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                     b"content-length: 100000000\r\n\r\n" + b"x" * 65536)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413 ")
        while sock.recv(65536):  # the rest of the answer, then the server's half-close (FIN)
            pass
        sock.sendall(b"x" * (4 << 20))  # still read and dropped: no reset
        time.sleep(3 * 2.0)  # quiet for longer than LINGER_AFTER_REFUSAL_S: the server closes
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(100):
                sock.sendall(b"x" * 65536)
                time.sleep(0.01)


def test_version_names_the_grpc_frontend_built() -> None:
    done = subprocess.run([sys.executable, "-m", "fastoip.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "gRPC frontend: " in done.stdout, done
    # a build without libnghttp2: the extension cannot be imported (find_spec answers None for it)
    script = ("import sys; sys.modules['fastoip.server.grpc._http2'] = None; "
              "from fastoip.cli import main; main(['--version'])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "gRPC frontend: grpcio; the faster native one was not built" in done.stdout, done
    assert "apt-get install libnghttp2-dev" in done.stdout


def test_a_host_without_a_gpu_says_so_in_one_line_as_a_fact(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "identity", model_bytes)
    with ServerProcess(tmp_path) as server:
        output = server.output()
    from fastoip import cuda

    if cuda.runtime() is not None:
        pytest.skip("this host has a CUDA GPU")
    lines = [line for line in output.splitlines() if "cuda" in line.lower()]
    assert all("insufficient" not in line and "not usable" not in line for line in lines), lines
    assert len(lines) <= 1 and all("no CUDA GPU on this host: models run on the CPU" in line for line in lines), lines


# -- serve --help ---------------------------------------------------------------------------
def _serve_help() -> str:
    done = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0
    return done.stdout


def _serve_actions() -> list[argparse.Action]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [action for action in sub.choices["serve"]._actions if action.option_strings != ["-h", "--help"]]


def test_serve_help_is_in_groups_in_a_readers_order() -> None:
    text = _serve_help()
    titles = [line[:-1] for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["options", *(title for title, _, _ in serve_help.GROUPS)]
    assert text.startswith("usage: fastoip serve [--model-repository DIR] [options]\n")
    grouped = {flag for _, _, flags in serve_help.GROUPS for flag in flags}
    ungrouped = [a.option_strings[0] for a in _serve_actions() if a.option_strings[0] != "-h"
                 and not grouped.intersection(a.option_strings)]
    assert ungrouped == [] or all(not flag.startswith("--") for flag in ungrouped), ungrouped


def test_every_flag_with_a_default_states_it() -> None:
    text = _serve_help()
    for action in _serve_actions():
        default = action.default
        if default in (None, "", [], False) and not (default is False and action.nargs != 0):
            continue
        assert action.help and serve_help.states_default(action.help, default) or (
            f"(default: {'true' if default is True else 'false' if default is False else default})"
            in " ".join(text.split())
        ), action.option_strings
    flat = " ".join(text.split())
    for words in ("--grpc-port GRPC_PORT 0 picks a free port (default: 8001)", "(default: none)",
                  "(default: 30.0)", "(default 0: ONNX Runtime's default", "(default: INFO)"):
        assert words in flat


def test_each_alias_pair_says_once_which_spelling_to_prefer() -> None:
    flat = " ".join(_serve_help().split())
    for alias, preferred in serve_help.PREFERRED.items():
        spelling = preferred.split()[0].rstrip(",")
        assert flat.count(f"prefer {spelling}") == 1, alias
    assert "--model-store is Triton's older name, --model-repository preferred" in flat


# -- fastoip bench as a perf_analyzer user expects ---------------------------------------
def _bench_settings(*argv: str) -> Any:
    from fastoip.bench.cli import build_parser, settings_from

    return settings_from(build_parser().parse_args(list(argv)))


def test_bench_defaults_are_perf_analyzers() -> None:
    settings = _bench_settings("-m", "simple")  # no URL: localhost:8000 over HTTP, as perf_analyzer
    assert (settings.protocol, settings.target.host, settings.target.port) == ("http", "localhost", 8000)
    assert not settings.local
    settings = _bench_settings("-m", "simple", "-i", "grpc")
    assert (settings.protocol, settings.target.port) == ("grpc", 8001)
    settings = _bench_settings("-m", "simple", "-u", "localhost:8000")  # the spelling that failed before
    assert (settings.protocol, settings.target.port) == ("http", 8000)
    assert _bench_settings("-m", "s", "grpc://h:9").protocol == "grpc"


def test_bench_private_server_is_explicit() -> None:
    from fastoip.bench.cli import BenchError

    assert _bench_settings("--local-server").local
    with pytest.raises(BenchError, match="--local-server"):
        _bench_settings()  # no -m: perf_analyzer requires one; the message names the private-server mode
    with pytest.raises(BenchError, match="give no URL"):
        _bench_settings("--local-server", "-u", "localhost:8000")


def _row(model: str, target: str, level: int, stable: bool = True) -> dict:
    latency = {key: 123_456.7 for key in ("avg", "p50", "p90", "p95", "p99")}
    return {"model": model, "target": target, "mode": "concurrency", "concurrency": level,
            "throughput_infer_per_s": 123_456.0, "throughput_req_per_s": 123_456.0, "latency_us": latency,
            "errors": {"UNAVAILABLE": 12, "DEADLINE_EXCEEDED": 3}, "stable": stable, "client_cpu_percent": 99.0,
            "server_cpu_percent": 180.0, "other_cpu_percent": 1.0,
            "server": {"queue_us": 1.0, "compute_input_us": 2.0, "compute_infer_us": 3.0, "compute_output_us": 4.0,
                       "avg_batch_size": 7.5}}


def test_the_bench_table_fits_80_columns_and_wide_has_everything() -> None:
    import io

    from fastoip.bench.report import render_table

    rows = [_row("a_rather_long_model_name_indeed", "server", 1024, stable=False), _row("mlp", "ceiling", 64)]
    document = {"url": "grpc://some-host.example:8001", "batch_size": 8, "results": rows,
                "settings": {"stability_pct": 10, "max_trials": 10}}
    compact = io.StringIO()
    render_table(document, compact)
    lines = compact.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, compact.getvalue()
    text = compact.getvalue()
    assert "p95" in text and "latency in ms" in text and "c=1024" in text
    assert "123456*" in text  # the unstable level is marked
    wide = io.StringIO()
    render_table(document, wide, wide=True)
    assert "srv cpu%" in wide.getvalue() and "queue µs" in wide.getvalue()


def test_bench_in_a_ci_log_prints_a_line_per_window_and_level_k_of_n(tmp_path: Path, model_bytes: bytes) -> None:
    write_model(tmp_path, "identity", model_bytes)
    with ServerProcess(tmp_path, http=True) as server:
        done = subprocess.run([sys.executable, "-m", "fastoip.cli", "bench", "-u", server.http_url, "-m", "identity",
                               "--concurrency-range", "1:2", "-p", "200", "-r", "2", "--warmup-ms", "50"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "level 1 of 2: identity [server] c=1  window 1:" in done.stderr
    assert "level 2 of 2: identity [server] c=2  window 1:" in done.stderr
    assert f"http://{server.http_url}" in done.stdout  # HTTP: the default protocol
    assert max(len(line) for line in done.stdout.splitlines()) <= 80

"""``fastoip.Server``: a whole fastoip inside the test's process, reached over real sockets by tritonclient."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import fastoip
from fastoip.demo import write_repository
from python_models import INT_IO, SLEEPER, write_python_model
from serverproc import wait_until
from simple_model import ZERO_TO_15, simple_inputs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("embed") / "repository", ["simple"])
    write_python_model(root, "sleeper", SLEEPER, INT_IO)  # answers after 0.4 s
    return root


def counting_inputs(module):  # type: ignore[no-untyped-def]
    """INPUT0 and INPUT1 both 0..15 (OUTPUT0 doubles them, OUTPUT1 is zeros)."""
    return simple_inputs(module, ZERO_TO_15, ZERO_TO_15)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def fastoip_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("fastoip")}


def test_serves_grpc_and_http_on_free_ports_and_frees_them(repository: Path) -> None:
    threads_before = fastoip_threads()
    with fastoip.Server(repository, metrics=True) as server:
        ports = [server.grpc_port, server.http_port, server.metrics_port]
        assert len(set(ports)) == 3 and all(ports)
        assert server.grpc_url == f"127.0.0.1:{server.grpc_port}"
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_ready()
        np.testing.assert_array_equal(
            grpc.infer("simple", counting_inputs(grpcclient)).as_numpy("OUTPUT0"),
            2 * np.arange(16, dtype=np.int32).reshape(1, 16),
        )
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.get_server_metadata()["name"] == "fastoip"
        np.testing.assert_array_equal(
            http.infer("simple", counting_inputs(httpclient)).as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32)
        )
        with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        assert 'nv_inference_request_success{model="simple",version="1"} 2' in text
    assert not server.running
    assert all(refuses_connections(port) for port in ports)
    for port in ports:  # free for the next server: a listener can bind each again
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    wait_until(lambda: not fastoip_threads() - threads_before, timeout=10)
    assert fastoip_threads() - threads_before == set()


def test_starts_again_and_runs_beside_another(repository: Path) -> None:
    server = fastoip.Server(repository, http=False)
    for _ in range(2):
        server.start()
        port = server.grpc_port
        try:
            with fastoip.Server(repository, grpc=False) as other:
                assert other.grpc_port == 0 and other.http_port != 0
                assert httpclient.InferenceServerClient(other.http_url).is_model_ready("sleeper")
                result = grpcclient.InferenceServerClient(server.grpc_url).infer("simple", counting_inputs(grpcclient))
                assert result.as_numpy("OUTPUT0")[0, 1] == 2
        finally:
            server.stop()
        assert refuses_connections(port)
    server.stop()  # a second stop does nothing


def test_stop_answers_the_calls_in_flight(repository: Path) -> None:
    server = fastoip.Server(repository, http=False, exit_timeout=10.0).start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [3], "INT32")
    x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    results: list = []
    caller = threading.Thread(target=lambda: results.append(client.infer("sleeper", [x]).as_numpy("OUT")))
    caller.start()
    time.sleep(0.15)  # the call is in the model (it sleeps 0.4 s) when stop() begins
    started = time.monotonic()
    server.stop()
    caller.join(10)
    assert results and results[0].tolist() == [1, 2, 3]
    assert time.monotonic() - started < 5


def test_what_is_off_has_no_url(repository: Path) -> None:
    with fastoip.Server(repository, http=False) as server:
        assert server.metrics_port == 0 and server.http_port == 0
        with pytest.raises(RuntimeError, match="no metrics listener"):
            _ = server.metrics_url
        with pytest.raises(RuntimeError, match="no http listener"):
            _ = server.http_url
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.grpc_port


def test_bad_settings_and_busy_ports_fail_cleanly(repository: Path) -> None:
    with pytest.raises(TypeError, match="unknown setting.*grpc_prot"):
        fastoip.Server(repository, grpc_prot=0)
    with pytest.raises(ValueError, match="nothing to serve"):
        fastoip.Server(repository, grpc=False, http=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        server = fastoip.Server(repository, http_port=taken)
        with pytest.raises(OSError):
            server.start()
        assert not server.running
    with pytest.raises(FileNotFoundError, match="missing' is not a directory"):
        fastoip.Server(repository / "missing")


def test_two_servers_in_one_process_keep_their_own_metrics_config(repository: Path) -> None:
    """``--metrics-config`` belongs to a server, not to the process: the second server changes nothing
    of the first (it used to set a process-wide setting that every server's metrics read)."""
    from fastoip.metrics import MetricsConfig

    quiet = MetricsConfig(counter_latencies=False, summary_latencies=True)
    with fastoip.Server(repository, metrics=True, metrics_config=quiet) as first, \
            fastoip.Server(repository, metrics=True) as second:
        texts = []
        for server in (first, second):
            grpcclient.InferenceServerClient(server.grpc_url).infer("simple", counting_inputs(grpcclient))
            with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
                texts.append(answer.read().decode())
    first_text, second_text = texts
    assert "nv_inference_request_summary_us" in first_text  # its own summaries
    assert "nv_inference_request_duration_us" not in first_text  # and its own counter_latencies=false
    assert "nv_inference_request_duration_us" in second_text
    assert "nv_inference_request_summary_us" not in second_text

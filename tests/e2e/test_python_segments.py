"""Issue 36: the tensor segments between the server and its Python workers, attacked from a client.

- Nothing to hijack: the server makes every segment as a memfd (no name in /dev/shm or anywhere) and hands
  the worker its descriptor; while a model serves a 1 MiB request nothing of the server's or the worker's is in
  /dev/shm, and the system shared-memory API still refuses every ``fastoip-`` key, over gRPC and HTTP, in
  Triton's words for a reserved prefix, without the object's size.
- The flood: one client's registrations are bounded (RESOURCE_EXHAUSTED / 429) and another still registers;
  the bounds are flags.
- No SIGBUS: with a 64 MB /dev/shm (Docker's and Kubernetes' default, here a private mount namespace), a 96 MB
  request to a Python model is served (its segments are not in /dev/shm) and the server lives; the segments of
  all workers are bounded by ``--python-shm-pool-total`` (past it: RESOURCE_EXHAUSTED, the server lives); an
  idle server keeps no segments, and a large output is no longer mapped in the server after its answer.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip.shared_memory import REGION_LIMIT_PER_CLIENT
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(240)

IDENTITY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.pause = 2.0 if "slow" in args["model_name"] else 0.0

    def execute(self, requests):
        time.sleep(self.pause)  # (the slow twin: its request is in flight, its segments mapped, meanwhile)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""

MB = 1024 * 1024


def _repository(root: Path) -> Path:
    for name in ("py_identity", "py_slow_identity"):
        folder = root / name / "1"
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(IDENTITY)
        (root / name / "config.pbtxt").write_text(CONFIG)
    write_model(root, "identity_small", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    return root


def _echo(client: grpcclient.InferenceServerClient, nbytes: int, model: str = "py_identity") -> np.ndarray:
    data = (np.arange(nbytes) % 251).astype(np.uint8)
    tensor = grpcclient.InferInput("IN", [nbytes], "UINT8")
    tensor.set_data_from_numpy(data)
    out = client.infer(model, [tensor], client_timeout=120).as_numpy("OUT")
    np.testing.assert_array_equal(out, data)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with ServerProcess(_repository(tmp_path_factory.mktemp("segments-repo")), http=True) as proc:
        yield proc


def _processes(server: ServerProcess) -> list[int]:
    """The server's process and its children (the Python models' workers)."""
    assert server.proc is not None
    pids = [server.proc.pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server.proc.pid:
                pids.append(int(entry))
    return pids


def _segment_mappings(pid: int) -> dict[int, str]:
    """The memfd segments ``pid`` maps: inode -> its maps line."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return {}
    return {int(line.split()[4]): line for line in lines if "memfd:fastoip-segment" in line}


def _http_register(port: int, name: str, key: str, source: str = "127.0.0.1", conn=None):  # type: ignore[no-untyped-def]
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    body = json.dumps({"key": key, "offset": 0, "byte_size": 64})
    conn.request("POST", f"/v2/systemsharedmemory/region/{name}/register", body,
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read().decode(), conn


def test_no_segment_of_the_server_or_its_workers_has_a_name_a_client_could_register(server: ServerProcess) -> None:
    """Before: ``/dev/shm/fastoip-pyw-<pid>-<n>`` registered (a client read the previous client's tensors through
    it, and wrote a waiting client's answer); then a secret token in the name.  After: the server makes memfds
    and hands the worker descriptors: while a 1 MiB request is served, nothing in /dev/shm is one of them."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done: list[np.ndarray] = []
    serving = threading.Thread(target=lambda: done.append(_echo(client, 1 * MB, "py_slow_identity")))
    serving.start()
    try:
        deadline = time.monotonic() + 60
        mapped: dict[int, str] = {}
        while time.monotonic() < deadline:  # the worker holds the request's input (the model sleeps 2 s)
            mapped = {inode: line for pid in _processes(server)[1:] for inode, line in _segment_mappings(pid).items()}
            if mapped:
                break
            time.sleep(0.05)
        assert mapped, "the request went through shared memory (a memfd the worker maps)"
        names = os.listdir("/dev/shm")
        assert not [name for name in names if name.startswith("fastoip-")]
        nameable = set()
        for name in names:
            try:
                nameable.add(os.stat(os.path.join("/dev/shm", name), follow_symlinks=False).st_ino)
            except OSError:
                pass
        server_side = {inode for pid in _processes(server) for inode in _segment_mappings(pid)}
        assert not (set(mapped) | server_side) & nameable  # no name in /dev/shm for any of them
    finally:
        serving.join(timeout=120)
    assert done, "the request was answered"
    for key in ["fastoip-pyw-no-such", "/fastoip-anything", "fastoip-segment"]:  # (defence in depth)
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("hijack", key, 64)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = caught.value.message()
        assert f"with key '{key}' as the key contains the reserved prefix 'fastoip-'" in message
        assert "size" not in message and "exist" not in message  # the same words whether it exists or not
        status, body, _ = _http_register(server.http_port, "hijack", key)
        assert status == 400 and "reserved prefix 'fastoip-'" in json.loads(body)["error"]
    assert client.get_system_shared_memory_status() == {} or not client.get_system_shared_memory_status().regions
    _echo(client, 1 * MB)


def test_a_wrong_size_does_not_state_the_object_size(server: ServerProcess) -> None:
    key = f"/segments_small_{os.getpid()}"
    handle = shm.create_shared_memory_region("small", key, 128)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("small", key, 4096)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "128" not in caught.value.message()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_registration_flood_from_one_client_leaves_room_for_others(server: ServerProcess) -> None:
    """Before: 4,100 registrations by one client used up the 4,096-slot mapping table, and nobody could register.
    After: one client (its address, 127.0.0.2 here) gets RESOURCE_EXHAUSTED / 429 at its share; another registers."""
    key = f"/segments_flood_{os.getpid()}"
    handle = shm.create_shared_memory_region("flood", key, 64)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.http_url)
    conn = None
    try:
        for index in range(REGION_LIMIT_PER_CLIENT):
            status, body, conn = _http_register(server.http_port, f"flood_{index}", key, "127.0.0.2", conn)
            assert status == 200, body
        status, body, conn = _http_register(server.http_port, "flood_over", key, "127.0.0.2", conn)
        assert status == 429
        assert "already has 256 regions registered, the most one client may" in json.loads(body)["error"]
        # the other client (127.0.0.1), over gRPC and HTTP, still registers
        grpc_client.register_system_shared_memory("other_grpc", key, 64)
        http_client.register_system_shared_memory("other_http", key, 64)
        assert len(grpc_client.get_system_shared_memory_status().regions) == REGION_LIMIT_PER_CLIENT + 2
        grpc_client.unregister_system_shared_memory("flood_0")  # a region given back makes room again
        status, body, conn = _http_register(server.http_port, "flood_again", key, "127.0.0.2", conn)
        assert status == 200, body
    finally:
        if conn is not None:
            conn.close()
        grpc_client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("frontend", ["native", "grpcio"])
def test_a_grpc_client_is_bounded_by_its_address_on_either_frontend(tmp_path: Path, frontend: str) -> None:
    """The gRPC frontends tell the registry the peer's address: a gRPC client (127.0.0.1) that reached its share
    gets RESOURCE_EXHAUSTED; a client from another address (HTTP from 127.0.0.2) still registers."""
    write_model(tmp_path, "identity_small", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    key = f"/segments_grpc_flood_{os.getpid()}"
    handle = shm.create_shared_memory_region("flood", key, 64)
    try:
        with ServerProcess(tmp_path, http=True, grpc_frontend=frontend) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            for index in range(REGION_LIMIT_PER_CLIENT):
                client.register_system_shared_memory(f"g{index}", key, 64)
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("one_more", key, 64)
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert "the most one client may" in caught.value.message()
            status, body, conn = _http_register(server.http_port, "elsewhere", key, "127.0.0.2")
            conn.close()
            assert status == 200, body
    finally:
        shm.destroy_shared_memory_region(handle)


def test_the_registration_bounds_are_flags_over_grpc_and_http(tmp_path: Path) -> None:
    """``--shared-memory-max-regions 3 --shared-memory-max-regions-per-client 2``: a client's third registration
    is refused (gRPC RESOURCE_EXHAUSTED, HTTP 429), another client's fourth in all too; the defaults are 1024/256."""
    write_model(tmp_path, "identity_small", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    key = f"/segments_flags_{os.getpid()}"
    handle = shm.create_shared_memory_region("flags", key, 64)
    try:
        with ServerProcess(tmp_path, "--shared-memory-max-regions", "3", "--shared-memory-max-regions-per-client",
                           "2", http=True) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)  # 127.0.0.1
            client.register_system_shared_memory("g1", key, 64)
            client.register_system_shared_memory("g2", key, 64)
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("g3", key, 64)
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert "already has 2 regions registered, the most one client may" in caught.value.message()
            status, body, conn = _http_register(server.http_port, "h1", key, "127.0.0.1")
            assert status == 429 and "the most one client may" in json.loads(body)["error"]
            conn.close()
            status, body, conn = _http_register(server.http_port, "other1", key, "127.0.0.2")
            assert status == 200, body  # another client: the third region in all
            status, body, _ = _http_register(server.http_port, "other2", key, "127.0.0.2", conn)
            conn.close()
            assert status == 503  # the fourth in all: the server's table, 503 with Retry-After (issue 37's rule)
            assert "the server holds 3 shared memory regions, the most it takes" in json.loads(body)["error"]
            client.unregister_system_shared_memory("g1")
            client.register_system_shared_memory("g1_again", key, 64)  # room made, room taken
    finally:
        shm.destroy_shared_memory_region(handle)


# -- a 64 MB /dev/shm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_shm_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A server (and its workers) in a private mount namespace whose /dev/shm is 64 MB, as in Docker."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private 64 MB /dev/shm")
    probe = os.system("unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm' 2>/dev/null")
    if probe != 0:
        pytest.skip("no private mount namespace here (unshare -m and mount refused)")
    proc = ServerProcess(_repository(tmp_path_factory.mktemp("small-shm-repo")), "--grpc-max-message-size",
                         str(256 * MB))
    proc.args = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh",
                 *proc.args]
    with proc:
        yield proc


def _shm_of(server: ServerProcess) -> Path:
    assert server.proc is not None
    return Path(f"/proc/{server.proc.pid}/root/dev/shm")  # the namespace's /dev/shm, seen from here


def test_a_request_larger_than_dev_shm_is_served_and_the_server_lives(small_shm_server: ServerProcess) -> None:
    """Before: one 96 MB request to a Python model killed the server (SIGBUS: ftruncate past what tmpfs could
    give, then written); then it was refused (RESOURCE_EXHAUSTED: no room in /dev/shm).  After: the segments are
    memfds, not in /dev/shm, so the request is served, and /dev/shm stays empty."""
    client = grpcclient.InferenceServerClient(small_shm_server.grpc_url)
    _echo(client, 1 * MB)
    _echo(client, 96 * MB)  # 96 MB in and 96 MB out: three times what /dev/shm holds
    assert small_shm_server.proc is not None and small_shm_server.proc.poll() is None
    assert [p.name for p in _shm_of(small_shm_server).iterdir()] == []
    _echo(client, 1 * MB)
    assert client.is_server_live()


def test_an_idle_server_keeps_no_segments_and_a_large_output_is_unmapped(small_shm_server: ServerProcess) -> None:
    """Before: an idle server kept 720 MB of /dev/shm after 8 requests of 48 MB (its pool never shrank), and a
    512 MiB output stayed mapped in the server after its answer.  After: both go."""
    assert small_shm_server.proc is not None
    client = grpcclient.InferenceServerClient(small_shm_server.grpc_url)
    for size in [8 * MB, 4 * MB, 2 * MB, 1 * MB] * 2:  # pooled sizes (the pool is 16 MiB a worker, each way)
        _echo(client, size)
    _echo(client, 24 * MB)  # over the pool: one-shot segments each way
    processes = _processes(small_shm_server)
    assert len(processes) >= 3  # the server and the two models' workers
    deadline = time.monotonic() + 15
    mapped: list[str] = []
    while time.monotonic() < deadline:
        mapped = [line for pid in processes for line in _segment_mappings(pid).values()]
        if not mapped:
            break
        time.sleep(0.25)
    assert mapped == [], f"segments still mapped in the server or its workers: {mapped}"
    _echo(client, 2 * MB)


CRASHER = """
import os
import signal
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        data = requests[0].inputs()[0].as_numpy()
        if data[0] == 255:  # the requests sent meanwhile wait in the socket behind this one
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGSEGV)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""


def test_large_requests_waiting_behind_a_crash_move_to_the_replacements_segments(tmp_path: Path) -> None:
    """The requests a worker had not started when it died go to its replacement: their tensors were in the dead
    worker's segments, so they are copied into the new one's (before: the reader thread failed and they hung)."""
    folder = tmp_path / "py_crasher" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(CRASHER)
    (tmp_path / "py_crasher" / "config.pbtxt").write_text(CONFIG)
    with ServerProcess(tmp_path) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        _echo(client, 1 * MB, "py_crasher")
        crash = np.full(1 * MB, 255, dtype=np.uint8)
        with ThreadPoolExecutor(4) as pool:
            def send(data: np.ndarray) -> np.ndarray:
                tensor = grpcclient.InferInput("IN", [data.size], "UINT8")
                tensor.set_data_from_numpy(data)
                own = grpcclient.InferenceServerClient(server.grpc_url)
                return own.infer("py_crasher", [tensor], client_timeout=60).as_numpy("OUT")

            crashing = pool.submit(send, crash)
            time.sleep(0.3)
            behind = [(data, pool.submit(send, data)) for data in
                      [(np.arange(1 * MB) % (n + 7)).astype(np.uint8) for n in range(3)]]
            with pytest.raises(InferenceServerException, match="SIGSEGV"):
                crashing.result(timeout=60)
            for data, answer in behind:
                np.testing.assert_array_equal(answer.result(timeout=60), data)


def test_all_workers_segments_are_bounded_by_a_flag(tmp_path: Path) -> None:
    """``--python-shm-pool-total``: a tensor that would take the segments of all workers past it fails its
    request (RESOURCE_EXHAUSTED, in python_backend's words), on the way in and on the way out; the server and
    the worker go on, and smaller tensors are served."""
    with ServerProcess(_repository(tmp_path), "--python-shm-pool-total", str(8 * MB)) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        _echo(client, 1 * MB)
        with pytest.raises(InferenceServerException) as caught:
            _echo(client, 6 * MB)  # in: 8 MiB pooled (the next power of two), past the 8 MiB in all
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        message = caught.value.message()
        assert "Failed to increase the shared memory pool size" in message and "--python-shm-pool-total" in message
        _echo(client, 1 * MB)
        with pytest.raises(InferenceServerException, match="--python-shm-pool-total"):
            _echo(client, 3 * MB)  # in: 4 MiB; out: 4 MiB more, while the input is held: the worker is refused
        _echo(client, 1 * MB)
        assert server.proc is not None and server.proc.poll() is None and client.is_server_live()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Issue 36: the tensor segments between the server and its Python workers, attacked from a client.

- The hijack: every segment (``fastoip-pyw-*``) and any other name for one is refused by the system
  shared-memory API, over gRPC and HTTP, in Triton's words for a reserved prefix, without the object's size.
- The flood: one client's registrations are bounded (RESOURCE_EXHAUSTED / 429) and another still registers.
- No SIGBUS: with a 64 MB /dev/shm (Docker's and Kubernetes' default, here a private mount namespace), a 96 MB
  request to a Python model is answered with an error and the server lives; an idle server's segments go, and
  a large output is no longer mapped in the server after its answer.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import time
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
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
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
    folder = root / "py_identity" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(IDENTITY)
    (root / "py_identity" / "config.pbtxt").write_text(CONFIG)
    write_model(root, "identity_small", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    return root


def _echo(client: grpcclient.InferenceServerClient, nbytes: int) -> np.ndarray:
    data = (np.arange(nbytes) % 251).astype(np.uint8)
    tensor = grpcclient.InferInput("IN", [nbytes], "UINT8")
    tensor.set_data_from_numpy(data)
    out = client.infer("py_identity", [tensor], client_timeout=120).as_numpy("OUT")
    np.testing.assert_array_equal(out, data)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with ServerProcess(_repository(tmp_path_factory.mktemp("segments-repo")), http=True) as proc:
        yield proc


def _own_segments() -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("fastoip-pyw-")]


def _http_register(port: int, name: str, key: str, source: str = "127.0.0.1", conn=None):  # type: ignore[no-untyped-def]
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    body = json.dumps({"key": key, "offset": 0, "byte_size": 64})
    conn.request("POST", f"/v2/systemsharedmemory/region/{name}/register", body,
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read().decode(), conn


def test_the_segments_of_the_server_and_its_workers_cannot_be_registered(server: ServerProcess) -> None:
    """Before: ``fastoip-pyw-<pid>-<n>`` registered (a client read the previous client's tensors through it, and
    wrote a waiting client's answer); the refusal of a wrong size stated the object's size.  After: refused."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    _echo(client, 1 * MB)  # segments exist now (pooled: the server's for the input, the worker's for the output)
    owned = _own_segments()
    assert owned, "the request went through shared memory"
    for key in [*owned, "fastoip-pyw-no-such", "/fastoip-anything"]:
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("hijack", key, 64)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = caught.value.message()
        assert f"with key '{key}' as the key contains the reserved prefix 'fastoip-'" in message
        assert "size" not in message and "exist" not in message  # the same words whether it exists or not
        status, body, _ = _http_register(server.http_port, "hijack", key)
        assert status == 400 and "reserved prefix 'fastoip-'" in json.loads(body)["error"]
    # another name for the same object (a hard link) is refused as well
    link = f"segments_link_{os.getpid()}"
    os.link(os.path.join("/dev/shm", owned[0]), os.path.join("/dev/shm", link))
    try:
        with pytest.raises(InferenceServerException, match="reserved prefix 'fastoip-'"):
            client.register_system_shared_memory("hijack", link, 64)
    finally:
        os.unlink(os.path.join("/dev/shm", link))
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
            assert status == 429  # the fourth in all
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


def test_a_request_larger_than_dev_shm_is_an_error_and_the_server_lives(small_shm_server: ServerProcess) -> None:
    """Before: one 96 MB request to a Python model killed the server (SIGBUS: ftruncate past what tmpfs could
    give, then written).  After: RESOURCE_EXHAUSTED for that request, and the next one is served."""
    client = grpcclient.InferenceServerClient(small_shm_server.grpc_url)
    _echo(client, 1 * MB)
    data = np.ones(96 * MB, dtype=np.uint8)
    tensor = grpcclient.InferInput("IN", [data.size], "UINT8")
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("py_identity", [tensor], client_timeout=120)
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "no room in /dev/shm for a tensor of 100663296 bytes" in caught.value.message()
    assert small_shm_server.proc is not None and small_shm_server.proc.poll() is None
    _echo(client, 1 * MB)  # served again, by the same server and worker
    # an output that does not fit (40 MB in, 40 MB out: 80 MB of 64) fails in the worker, which lives on
    with pytest.raises(InferenceServerException, match="no room in /dev/shm"):
        _echo(client, 40 * MB)
    _echo(client, 1 * MB)
    assert client.is_server_live()


def test_an_idle_server_keeps_no_segments_and_a_large_output_is_unmapped(small_shm_server: ServerProcess) -> None:
    """Before: an idle server kept 720 MB of /dev/shm after 8 requests of 48 MB (its pool never shrank), and a
    512 MiB output stayed mapped in the server after its answer.  After: both go."""
    assert small_shm_server.proc is not None
    client = grpcclient.InferenceServerClient(small_shm_server.grpc_url)
    for size in [8 * MB, 4 * MB, 2 * MB, 1 * MB] * 2:  # pooled sizes (the pool is 16 MiB a process)
        _echo(client, size)
    _echo(client, 24 * MB)  # over the pool: one-shot segments each way
    maps = Path(f"/proc/{small_shm_server.proc.pid}/maps")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [p.name for p in _shm_of(small_shm_server).iterdir() if p.name.startswith("fastoip-pyw-")]
        mapped = [line for line in maps.read_text().splitlines() if "fastoip-pyw-" in line]
        if not left and not mapped:
            break
        time.sleep(0.25)
    assert left == [], f"segments left in /dev/shm of an idle server: {left}"
    assert mapped == [], f"segments still mapped in the server: {mapped}"
    _echo(client, 2 * MB)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

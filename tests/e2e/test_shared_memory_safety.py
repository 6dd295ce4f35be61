"""System shared memory that a client cannot crash the server with, and keys that name only shm objects.

The client owns a region's object and may shrink it at any time, also while the server reads it or
writes into it.  These tests shrink it from another process while requests run, and hold the server
to: it lives, the requests answer INVALID_ARGUMENT, and a good request afterwards succeeds.
"""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip._shmguard import GuardedMapping
from fastoip.errors import InvalidArgument
from fastoip.shared_memory import SHM_DIR, SharedMemoryRegistry, check_intact
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

ROW = 256 * 1024  # FP32 elements per row: 1 MiB, so a copy takes long enough to be raced
ROWS = 4
REGION_BYTES = ROW * ROWS * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("shm-safety-repo")
    write_model(root, "identity_big", identity_model_bytes(TensorProto.FLOAT, [ROW]), config="max_batch_size: 8\n")
    write_model(root, "identity_small", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    with ServerProcess(root, http=True) as proc:
        yield proc


def _key(tag: str) -> str:
    return f"/fastoip_safety_{tag}_{os.getpid()}"


def _good_request(client: tg.InferenceServerClient) -> None:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = tg.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_small", [inp]).as_numpy("OUTPUT0"), data)


def _shrink_and_restore(key: str, size: int, stop_after: float) -> None:
    """Another process: truncate the object to 0 and back, over and over, for ``stop_after`` seconds."""
    fd = os.open(os.path.join(SHM_DIR, key.lstrip("/")), os.O_RDWR)
    deadline = time.monotonic() + stop_after
    while time.monotonic() < deadline:
        os.ftruncate(fd, 0)
        time.sleep(0.0005)
        os.ftruncate(fd, size)
        time.sleep(0.002)
    os.close(fd)


def _register_while_racing(client: tg.InferenceServerClient, key: str) -> None:
    """Register 'victim' again; the racer may have it at size 0 right now, so retry a while."""
    for _ in range(1000):
        try:
            client.register_system_shared_memory("victim", key, REGION_BYTES)
            return
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.INVALID_ARGUMENT", exc
            time.sleep(0.001)


@pytest.mark.parametrize("direction", ["input", "output"])
def test_shrinking_a_region_under_requests_does_not_kill_the_server(server: ServerProcess, direction: str) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    key = _key(direction)
    handle = shm.create_shared_memory_region("victim", key, REGION_BYTES)
    data = np.ones((ROWS, ROW), dtype=np.float32)
    shm.set_shared_memory_region(handle, [data])
    client.register_system_shared_memory("victim", key, REGION_BYTES)
    racer = multiprocessing.get_context("spawn").Process(target=_shrink_and_restore, args=(key, REGION_BYTES, 4.0))
    racer.start()
    outcomes: dict[str, int] = {"ok": 0, "refused": 0}
    try:
        while racer.is_alive():
            inp = tg.InferInput("INPUT0", [ROWS, ROW], "FP32")
            out = tg.InferRequestedOutput("OUTPUT0")
            if direction == "input":
                inp.set_shared_memory("victim", REGION_BYTES)
            else:
                inp.set_data_from_numpy(data)
                out.set_shared_memory("victim", REGION_BYTES)
            try:
                client.infer("identity_big", [inp], outputs=[out])
                outcomes["ok"] += 1
            except InferenceServerException as exc:
                assert exc.status() == "StatusCode.INVALID_ARGUMENT", exc
                assert "victim" in exc.message(), exc
                outcomes["refused"] += 1
                if "register it again" in exc.message():  # the guard caught a fault: the region is spent
                    outcomes["faults"] = outcomes.get("faults", 0) + 1
                    client.unregister_system_shared_memory("victim")
                    _register_while_racing(client, key)
    finally:
        racer.join()
    print("outcomes under the racer:", outcomes)
    assert server.proc is not None and server.proc.poll() is None, server.output()
    assert outcomes["refused"] > 0, outcomes  # the shrinks were seen, one way or the other
    # The object is whole again: after re-registering, the region serves correct results.
    client.unregister_system_shared_memory("victim")
    time.sleep(0.1)
    shm.set_shared_memory_region(handle, [data])
    client.register_system_shared_memory("victim", key, REGION_BYTES)
    inp = tg.InferInput("INPUT0", [ROWS, ROW], "FP32")
    inp.set_shared_memory("victim", REGION_BYTES)
    np.testing.assert_array_equal(client.infer("identity_big", [inp]).as_numpy("OUTPUT0"), data)
    client.unregister_system_shared_memory("victim")
    shm.destroy_shared_memory_region(handle)
    _good_request(client)


def test_a_region_truncated_before_use_is_refused(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    key = _key("before")
    handle = shm.create_shared_memory_region("short", key, 64)
    client.register_system_shared_memory("short", key, 64)
    os.truncate(os.path.join(SHM_DIR, key.lstrip("/")), 0)
    inp = tg.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_shared_memory("short", 16)
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_small", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Invalid offset + byte size for shared memory region: 'short'" in info.value.message()
    client.unregister_system_shared_memory("short")
    shm.destroy_shared_memory_region(handle)
    _good_request(client)


def test_a_fault_in_a_region_becomes_an_error_in_process(tmp_path: os.PathLike) -> None:
    """The guard itself: a read and a write past a shrunk object's end are repaired and reported."""
    key = _key("inproc")
    path = os.path.join(SHM_DIR, key.lstrip("/"))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 1 << 20)
        registry = SharedMemoryRegistry()
        registry.register("r", key, 0, 1 << 20)
        uses: list = []
        view = registry.input_view("INPUT0", "FP32", (1 << 18,), {"shared_memory_region": "r"}, uses)
        os.ftruncate(fd, 0)
        copied = view.copy()  # without the guard: SIGBUS, the process dies
        assert not copied.any()
        with pytest.raises(InvalidArgument, match="shrank while in use"):
            check_intact(uses)
        os.ftruncate(fd, 1 << 20)
        with pytest.raises(InvalidArgument, match="register it again"):  # spent until re-registered
            registry.input_view("INPUT0", "FP32", (4,), {"shared_memory_region": "r", "shared_memory_byte_size": 16})
        registry.unregister("r")
        registry.register("r", key, 0, 1 << 20)
        out = registry.output_view("OUTPUT0", {"shared_memory_region": "r"}, uses := [])
        os.ftruncate(fd, 4096)
        out[:] = 5  # a write past the end, in place
        with pytest.raises(InvalidArgument, match="shrank while in use"):
            check_intact(uses)
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_fault_outside_any_region_still_ends_the_process(tmp_path: os.PathLike) -> None:
    """Only registered mappings are guarded: any other SIGBUS keeps its default action."""
    script = (
        "import mmap, os\n"
        "from fastoip._shmguard import GuardedMapping\n"
        f"fd = os.open('{tmp_path}/f', os.O_RDWR | os.O_CREAT, 0o600)\n"
        "os.ftruncate(fd, 8192)\n"
        "guarded = GuardedMapping(fd, 8192)\n"
        "plain = mmap.mmap(fd, 8192)\n"
        "os.ftruncate(fd, 0)\n"
        "print(plain[5000])\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert result.returncode == -7, result  # SIGBUS
    assert GuardedMapping  # imported in the child


def _register_error(client: tg.InferenceServerClient | th.InferenceServerClient, key: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("bad", key, 16)
    return info.value


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_keys_that_are_not_shm_objects_are_refused(server: ServerProcess, protocol: str, tmp_path: os.PathLike) -> None:
    client: tg.InferenceServerClient | th.InferenceServerClient = (
        tg.InferenceServerClient(server.grpc_url) if protocol == "grpc" else th.InferenceServerClient(server.http_url)
    )
    secret = os.path.join(str(tmp_path), "secret")
    with open(secret, "wb") as f:
        f.write(b"s" * 64)
    tag = f"{protocol}_{os.getpid()}"
    link, fifo, directory = (os.path.join(SHM_DIR, f"fastoip_{kind}_{tag}") for kind in ("link", "fifo", "dir"))
    os.symlink(secret, link)
    os.mkfifo(fifo)
    os.mkdir(directory)
    expected = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    try:
        cases = {
            os.path.basename(link): "symbolic link",
            os.path.basename(fifo): "not a shared memory object",
            os.path.basename(directory): "Unable to open shared memory region",
            "triton_python_backend_shm_region_1": "reserved prefix",
            "with\0nul": "not a valid POSIX shared memory name",
            "../etc/passwd": "not a valid POSIX shared memory name",
        }
        for key, words in cases.items():
            error = _register_error(client, key)
            assert error.status() == expected, (key, error)
            assert words in error.message(), (key, error)
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'bad'"):
            client.get_system_shared_memory_status("bad")
    finally:
        os.unlink(link)
        os.unlink(fifo)
        os.rmdir(directory)
    _good_request(tg.InferenceServerClient(server.grpc_url))

"""fastoip's CUDA shared-memory code, driven on CPU through a host-memory stand-in for libcudart.

``tests/host_cudart.c`` implements the handful of CUDA runtime calls fastoip makes on host memory
(an IPC handle names a POSIX shared-memory object; device memory is that object mapped). The
server loads it through ``FASTOIP_CUDA_RUNTIME``. These tests prove fastoip's side of CUDA shared
memory on every CI run: the ctypes declarations, registration, status and unregistration over
tritonclient's gRPC and HTTP clients, bounds checks, inputs copied out and outputs copied in, and
that a handle stays open while a request still uses it. What they cannot prove is CUDA itself:
``tests/test_cuda.py`` does that on a GPU machine.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip import cuda
from fastoip.shared_memory import CUDA, SharedMemoryRegistry
from host_cuda import build_host_cudart
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

SIZE = 2 * 16 * 4  # FP32 [2, 16]


@pytest.fixture(scope="module")
def host_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host_cudart(tmp_path_factory.mktemp("cudart"))


class DeviceRegion:
    """A POSIX shared-memory object playing a cudaMalloc allocation; its handle is its name."""

    def __init__(self, name: str, size: int) -> None:
        self.key = f"/fastoip_dev_{os.getpid()}_{name}"
        fd = os.open(f"/dev/shm{self.key}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.raw_handle = self.key.encode().ljust(cuda.IPC_HANDLE_BYTES, b"\0")

    def b64(self) -> str:
        return base64.b64encode(self.raw_handle).decode()

    def array(self, dtype: type, shape: list[int], offset: int = 0) -> np.ndarray:
        return np.frombuffer(self.mapping, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)

    def close(self) -> None:
        self.mapping.close()
        os.unlink(f"/dev/shm{self.key}")


@pytest.fixture(scope="module")
def cuda_server(  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory, host_cudart: Path, grpc_frontend: str
):
    root = tmp_path_factory.mktemp("cuda-plumbing-repo")
    write_model(root, "identity_fp32", identity_model_bytes(TensorProto.FLOAT, [16]), config="max_batch_size: 8\n")
    env = {"FASTOIP_CUDA_RUNTIME": str(host_cudart)}
    with ServerProcess(root, http=True, env=env, grpc_frontend=grpc_frontend) as proc:
        yield proc


@pytest.fixture()
def device_regions():  # type: ignore[no-untyped-def]
    regions = [DeviceRegion("in", SIZE), DeviceRegion("out", SIZE)]
    yield regions
    for region in regions:
        region.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cuda_shared_memory_flow_through_tritonclient(cuda_server: ServerProcess, device_regions, protocol: str) -> None:  # type: ignore[no-untyped-def]
    region_in, region_out = device_regions
    module = tg if protocol == "grpc" else th
    client = (
        tg.InferenceServerClient(cuda_server.grpc_url)
        if protocol == "grpc"
        else th.InferenceServerClient(cuda_server.http_url)
    )
    assert "cuda_shared_memory" in client.get_server_metadata(**({"as_json": True} if protocol == "grpc" else {}))["extensions"]
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    region_in.array(np.float32, [2, 16])[:] = data
    # tritonclient's own register calls: the handle travels base64 over HTTP, raw over gRPC.
    client.register_cuda_shared_memory("in", region_in.b64(), 0, SIZE)
    client.register_cuda_shared_memory("out", region_out.b64(), 0, SIZE)
    try:
        if protocol == "grpc":
            status = client.get_cuda_shared_memory_status(as_json=True)["regions"]
            assert {name: (int(r["byte_size"]), int(r.get("device_id", 0))) for name, r in status.items()} == {
                "in": (SIZE, 0),
                "out": (SIZE, 0),
            }
        else:
            status = client.get_cuda_shared_memory_status()
            assert sorted((r["name"], r["byte_size"], r["device_id"]) for r in status) == [
                ("in", SIZE, 0),
                ("out", SIZE, 0),
            ]
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("in", region_in.b64(), 0, SIZE)
        assert "already in manager" in err.value.message()

        for step in range(3):
            region_in.array(np.float32, [2, 16])[:] = data + step
            inp = module.InferInput("INPUT0", [2, 16], "FP32")
            inp.set_shared_memory("in", SIZE)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("out", SIZE)
            result = client.infer("identity_fp32", [inp], outputs=[out])
            assert list(result.get_output("OUTPUT0")["shape"] if protocol == "http" else result.get_output("OUTPUT0").shape) == [2, 16]
            np.testing.assert_array_equal(region_out.array(np.float32, [2, 16]), data + step)

        past_end = module.InferInput("INPUT0", [2, 16], "FP32")
        past_end.set_shared_memory("in", SIZE, offset=4)
        with pytest.raises(InferenceServerException) as err:
            client.infer("identity_fp32", [past_end])
        assert "exceeds region 'in'" in err.value.message()
        assert err.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")
    finally:
        client.unregister_cuda_shared_memory("in")
        client.unregister_cuda_shared_memory()
    if protocol == "grpc":
        assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
    else:
        assert client.get_cuda_shared_memory_status() == []


def test_cuda_register_errors_are_clear(cuda_server: ServerProcess, device_regions) -> None:  # type: ignore[no-untyped-def]
    region_in, _ = device_regions
    client = tg.InferenceServerClient(cuda_server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("short", base64.b64encode(b"\1" * 10), 0, SIZE)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "64 bytes, got 10" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("gone", base64.b64encode(b"/no_such_object".ljust(64, b"\0")), 0, SIZE)
    assert "failed to register CUDA shared memory region 'gone'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("gpu7", region_in.b64(), 7, SIZE)
    assert "cudaSetDevice(7)" in err.value.message()
    # Names are one namespace with system regions, and status says which kind a name is.
    with pytest.raises(InferenceServerException) as err:
        client.get_cuda_shared_memory_status("nothing")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    client.register_system_shared_memory("sys", region_in.key, SIZE)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("sys", region_in.b64(), 0, SIZE)
        assert err.value.status() == "StatusCode.ALREADY_EXISTS"
        with pytest.raises(InferenceServerException) as err:
            client.get_cuda_shared_memory_status("sys")
        assert "registered as system shared memory, not cuda shared memory" in err.value.message()
        client.unregister_cuda_shared_memory()  # leaves system regions alone
        assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"sys"}
    finally:
        client.unregister_system_shared_memory()
    assert client.is_server_live()


def test_handle_stays_open_while_a_request_uses_it(host_cudart: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOIP_CUDA_RUNTIME", str(host_cudart))
    monkeypatch.setattr(cuda, "_searched", False)
    monkeypatch.setattr(cuda, "_runtime", None)
    library = ctypes.CDLL(str(host_cudart))  # the same loaded object the runtime uses
    region = DeviceRegion("inflight", SIZE)
    try:
        registry = SharedMemoryRegistry()
        registry.register_cuda("r", region.raw_handle, 0, SIZE)
        assert library.hostcudart_open_handles() == 1
        destination = registry.output_view("OUTPUT0", {"shared_memory_region": "r", "shared_memory_byte_size": SIZE})
        registry.unregister("r", CUDA)
        assert registry.status(kind=CUDA) == []
        assert library.hostcudart_open_handles() == 1  # a request still holds it
        del destination
        gc.collect()
        assert library.hostcudart_open_handles() == 0
    finally:
        region.close()


def test_pinned_blocks_live_as_long_as_their_arrays(host_cudart: Path) -> None:
    runtime = cuda.CudaRuntime(ctypes.CDLL(str(host_cudart)))
    array = np.asarray(cuda._PinnedBlock(runtime, 4096))
    view = array[128:256].view(np.float32)
    del array
    view[:] = 3.0  # the block is still allocated: the view's base chain holds it
    assert float(view.sum()) == 3.0 * 32


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bench_with_cuda_shared_memory(  # type: ignore[no-untyped-def]
    cuda_server: ServerProcess, host_cudart: Path, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path, protocol: str
) -> None:
    """``fastoip bench --shared-memory cuda`` as a CUDA client: allocates, fills, registers, verifies, frees."""
    import json

    from fastoip.bench.cli import main as bench_main

    monkeypatch.setenv("FASTOIP_CUDA_RUNTIME", str(host_cudart))
    monkeypatch.setattr(cuda, "_searched", False)
    monkeypatch.setattr(cuda, "_runtime", None)
    before = set(os.listdir("/dev/shm"))
    out_json = tmp_path / "bench.json"
    url = cuda_server.grpc_url if protocol == "grpc" else cuda_server.http_url
    rc = bench_main(
        [url, "-i", protocol, "-m", "identity_fp32", "--shared-memory", "cuda", "--verify", "-b", "2",
         "--concurrency-range", "1,2", "--json", str(out_json), "-p", "300", "-r", "3", "--warmup-ms", "200", "--quiet"]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    rows = json.loads(out_json.read_text())["results"]
    assert [row["concurrency"] for row in rows] == [1, 2]
    for row in rows:
        assert row["throughput_req_per_s"] > 0 and sum(row["errors"].values()) == 0
    # The bench's device memory is freed and its regions are unregistered from the server.
    # (this process's blocks only: another test worker may hold stand-in blocks of its own meanwhile)
    mine = f"hostcudart_{os.getpid()}_"
    assert not [name for name in set(os.listdir("/dev/shm")) - before if name.startswith(mine)]
    assert tg.InferenceServerClient(cuda_server.grpc_url).get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}

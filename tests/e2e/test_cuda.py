"""GPU paths: CUDA EP inference, pinned batch buffers, CUDA shared memory over gRPC and HTTP.

Every test here needs a GPU, the CUDA runtime and onnxruntime-gpu (``pip install -e '.[gpu]'``);
the shared-memory ones also need tritonclient's CUDA utilities (``pip install 'tritonclient[cuda]'``).
Without them the tests skip, each saying what is missing; CPU CI runs none of them.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto

from fastoip import cuda
from fastoip.backends.onnx import cuda_available
from models import conv_model_bytes, expected_conv, identity_model_bytes, write_model
from serverproc import ServerProcess

needs_gpu = pytest.mark.skipif(
    cuda.runtime() is None or not cuda_available(),
    reason="needs a GPU with the CUDA runtime and onnxruntime-gpu (CUDAExecutionProvider)",
)
pytestmark = needs_gpu


def cuda_shm_utilities():  # type: ignore[no-untyped-def]
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as exc:  # tritonclient raises RuntimeError without cuda-python
        pytest.skip(f"tritonclient's CUDA shared-memory utilities are not usable: {exc}")
    return cudashm


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("gpu-repo")
    write_model(root, "identity_fp32", identity_model_bytes(TensorProto.FLOAT, [16]), config="max_batch_size: 8\n")
    write_model(
        root,
        "batched_fp32",
        identity_model_bytes(TensorProto.FLOAT, [16], name="batched_fp32"),
        config="max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n",
    )
    with ServerProcess(root, http=True) as proc:
        yield proc


def test_models_run_on_the_cuda_ep(gpu_server: ServerProcess) -> None:
    client = tg.InferenceServerClient(gpu_server.grpc_url)
    config = client.get_model_config("identity_fp32", as_json=True)["config"]
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    data = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    inp = tg.InferInput("INPUT0", [3, 16], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)


def test_batches_through_pinned_buffers_return_each_request_its_rows(gpu_server: ServerProcess) -> None:
    from fastoip.scheduling.buffers import BufferPool

    pool = BufferPool(cuda.pinned_allocator)
    lease = pool.take("x", np.dtype(np.float32), (8, 16))
    assert isinstance(lease.storage.base, cuda._PinnedBlock)  # page-locked, from cudaHostAlloc

    client = tg.InferenceServerClient(gpu_server.grpc_url)
    rng = np.random.default_rng(2)

    def one(index: int) -> bool:
        data = rng.standard_normal((1 + index % 4, 16)).astype(np.float32) + index
        inp = tg.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        return np.array_equal(client.infer("batched_fp32", [inp]).as_numpy("OUTPUT0"), data)

    with concurrent.futures.ThreadPoolExecutor(32) as pool_threads:
        assert all(pool_threads.map(one, range(400)))
    stats = client.get_inference_statistics("batched_fp32", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) < int(stats["inference_count"])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cuda_shared_memory_flow(gpu_server: ServerProcess, protocol: str) -> None:
    cudashm = cuda_shm_utilities()
    client = (
        tg.InferenceServerClient(gpu_server.grpc_url)
        if protocol == "grpc"
        else th.InferenceServerClient(gpu_server.http_url)
    )
    module = tg if protocol == "grpc" else th
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    size = data.nbytes
    handle_in = cudashm.create_shared_memory_region(f"in_{protocol}", size, 0)
    handle_out = cudashm.create_shared_memory_region(f"out_{protocol}", size, 0)
    try:
        cudashm.set_shared_memory_region(handle_in, [data])
        client.register_cuda_shared_memory(f"in_{protocol}", cudashm.get_raw_handle(handle_in), 0, size)
        client.register_cuda_shared_memory(f"out_{protocol}", cudashm.get_raw_handle(handle_out), 0, size)
        if protocol == "grpc":
            names = set(client.get_cuda_shared_memory_status(as_json=True)["regions"])
        else:
            names = {region["name"] for region in client.get_cuda_shared_memory_status()}
        assert {f"in_{protocol}", f"out_{protocol}"} <= names
        for _ in range(3):  # the first run learns the output shape; later ones write the region in place
            inp = module.InferInput("INPUT0", [2, 16], "FP32")
            inp.set_shared_memory(f"in_{protocol}", size)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"out_{protocol}", size)
            result = client.infer("identity_fp32", [inp], outputs=[out])
            assert result.get_output("OUTPUT0") is not None
            np.testing.assert_array_equal(cudashm.get_contents_as_numpy(handle_out, np.float32, [2, 16]), data)
        too_big = module.InferRequestedOutput("OUTPUT0")
        too_big.set_shared_memory(f"out_{protocol}", size, offset=8)
        with pytest.raises(Exception) as err:
            client.infer("identity_fp32", [inp], outputs=[too_big])
        assert "exceeds region" in str(err.value)
        client.unregister_cuda_shared_memory(f"in_{protocol}")
        client.unregister_cuda_shared_memory()
    finally:
        cudashm.destroy_shared_memory_region(handle_in)
        cudashm.destroy_shared_memory_region(handle_out)
    assert client.is_server_live()


def test_a_convolution_keeps_a_session_per_batch_size_on_the_cuda_ep(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """cuDNN re-plans a session's convolutions at every new input shape (batch_buckets.py): each size its own."""
    from google.protobuf import text_format

    from fastoip._proto import model_config_pb2 as mc
    from fastoip.backends.onnx import KIND
    from fastoip.options import RepositoryOptions

    version = tmp_path / "1"
    version.mkdir()
    (version / "model.onnx").write_bytes(conv_model_bytes())
    base = text_format.Parse('name: "conv" platform: "onnxruntime_onnx" max_batch_size: 8', mc.ModelConfig())
    _, (backend,) = KIND.load("conv", 1, version / "model.onnx", base, RepositoryOptions())
    assert backend.on_gpu and sorted(backend._bucket_backends) == [1, 2, 4, 8]
    rng = np.random.default_rng(2)
    for rows in (1, 3, 8, 5, 2):
        x = rng.random((rows, 2, 4, 4), dtype=np.float32)
        (out,) = backend.run({"INPUT0": x}, ["OUTPUT0"])
        # cuDNN convolves FP32 in TF32 on Ampere and later (ORT's use_tf32 default): ~1e-3 relative, seen on an H200
        np.testing.assert_allclose(out, expected_conv(x), rtol=5e-3, atol=1e-3)
    backend.close()

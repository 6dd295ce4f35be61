"""GPU paths: CUDA EP inference, pinned batch buffers, CUDA shared memory over gRPC and HTTP, the config's CUDA EP
options and TensorRT accelerator.

Every test here needs a GPU, the CUDA runtime and onnxruntime-gpu (``pip install -e '.[gpu]'``);
the shared-memory ones also need tritonclient's CUDA utilities (``pip install 'tritonclient[cuda]'``).
Without them the tests skip, each saying what is missing; CPU CI runs none of them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from google.protobuf import text_format
from onnx import TensorProto

from fastoip import cuda
from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.onnx import KIND, OnnxBackend, _ort, cuda_available
from fastoip.backends.ort_providers import CPU, CUDA, TENSORRT
from fastoip.errors import InvalidArgument
from fastoip.options import RepositoryOptions
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


def load_conv(model_dir: Path, config: str) -> OnnxBackend:
    """The convolution model at ``model_dir``/1/model.onnx loaded as the repository loads it, with ``config``."""
    version = model_dir / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(conv_model_bytes())
    base = text_format.Parse(f'name: "conv" platform: "onnxruntime_onnx" {config}', mc.ModelConfig())
    _, (backend,) = KIND.load("conv", 1, version / "model.onnx", base, RepositoryOptions())
    return backend


def check_conv(backend: OnnxBackend, rows: tuple[int, ...], rtol: float = 5e-3, atol: float = 1e-3) -> None:
    rng = np.random.default_rng(2)
    for count in rows:
        x = rng.random((count, 2, 4, 4), dtype=np.float32)
        (out,) = backend.run({"INPUT0": x}, ["OUTPUT0"])
        np.testing.assert_allclose(out, expected_conv(x), rtol=rtol, atol=atol)


def check_cuda_options(backend: OnnxBackend, expected: dict[str, str]) -> None:
    """The backend runs on the CUDA EP with a session per batch size, each with ``expected`` among its options,
    and convolves right; then it is closed."""
    assert backend.providers[0] == CUDA and sorted(backend._bucket_backends) == [1, 2, 4, 8]
    for bucket in backend._bucket_backends.values():  # every batch size's session: the same options
        options = bucket.session.get_provider_options()[CUDA]
        assert {key: options.get(key) for key in expected} == expected
    check_conv(backend, (1, 3, 8, 5))
    backend.close()


def test_a_convolution_keeps_a_session_per_batch_size_on_the_cuda_ep(tmp_path: Path) -> None:
    """cuDNN re-plans a session's convolutions at every new input shape (batch_buckets.py): each size its own."""
    backend = load_conv(tmp_path, "max_batch_size: 8")
    assert backend.on_gpu and sorted(backend._bucket_backends) == [1, 2, 4, 8]
    # cuDNN convolves FP32 in TF32 on Ampere and later (ORT's use_tf32 default): ~1e-3 relative, seen on an H200
    check_conv(backend, (1, 3, 8, 5, 2))
    backend.close()


def test_cuda_ep_takes_tritons_cudnn_conv_algo_search_parameter_in_every_session(tmp_path: Path) -> None:
    config = (
        'max_batch_size: 8 parameters { key: "cudnn_conv_algo_search" value { string_value: "1" } }'
        ' parameters { key: "arena_extend_strategy" value { string_value: "1" } }'
    )
    expected = {"cudnn_conv_algo_search": "HEURISTIC", "arena_extend_strategy": "kSameAsRequested", "device_id": "0"}
    check_cuda_options(load_conv(tmp_path, config), expected)


def test_cuda_accelerator_parameters_reach_the_cuda_ep(tmp_path: Path) -> None:
    config = (
        'max_batch_size: 8 optimization { execution_accelerators { gpu_execution_accelerator { name: "cuda"'
        ' parameters { key: "cudnn_conv_use_max_workspace" value: "0" }'
        ' parameters { key: "use_ep_level_unified_stream" value: "1" }'
        ' parameters { key: "cudnn_conv_algo_search" value: "DEFAULT" } } } }'
    )
    expected = {"cudnn_conv_use_max_workspace": "0", "use_ep_level_unified_stream": "1",
                "cudnn_conv_algo_search": "DEFAULT"}
    check_cuda_options(load_conv(tmp_path, config), expected)


def test_cuda_accelerator_option_onnx_runtime_does_not_know_fails_the_load(tmp_path: Path) -> None:
    """fastoip passes option names it does not list to ORT, which refuses the unknown ones (as in Triton)."""
    config = (
        'max_batch_size: 8 optimization { execution_accelerators { gpu_execution_accelerator { name: "cuda"'
        ' parameters { key: "cudnn_conv_algo_serch" value: "HEURISTIC" } } } }'
    )
    with pytest.raises(InvalidArgument, match="cudnn_conv_algo_serch"):
        load_conv(tmp_path, config)


HIDDEN_GPU_LOAD = """
import pathlib, sys
from google.protobuf import text_format
from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.onnx import KIND, cuda_available
from fastoip.options import RepositoryOptions
base = text_format.Parse(sys.argv[2], mc.ModelConfig())
_, (backend,) = KIND.load("conv", 1, pathlib.Path(sys.argv[1]), base, RepositoryOptions())
print("CUDA EP listed:", cuda_available(), "providers:", backend.providers)
"""


def test_cuda_options_with_the_gpu_hidden_leave_the_model_on_the_cpu(tmp_path: Path) -> None:
    """onnxruntime-gpu lists its CUDA EP where no GPU answers: a config's CUDA options do not stop the load there."""
    model = tmp_path / "1" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes(conv_model_bytes())
    config = 'name: "conv" max_batch_size: 8 parameters { key: "cudnn_conv_algo_search" value { string_value: "1" } }'
    result = subprocess.run(
        [sys.executable, "-c", HIDDEN_GPU_LOAD, str(model), config], env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True, text=True, timeout=100,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"CUDA EP listed: True providers: ['{CPU}']" in result.stdout, (result.stdout, result.stderr[-3000:])
    assert "model 'conv': the CUDA EP could not start" in result.stderr  # the warning, through logging's last resort


TENSORRT_FP16 = (
    'name: "tensorrt" parameters { key: "precision_mode" value: "FP16" }'
    ' parameters { key: "trt_engine_cache_enable" value: "1" } parameters { key: "trt_engine_cache_path" value: '
    '"trt_cache" }'
)


@functools.cache
def tensorrt_unusable() -> str | None:
    """Why onnxruntime cannot start its TensorRT EP on this machine (None: it can), asked of ORT itself."""
    ort = _ort()
    if TENSORRT not in ort.get_available_providers():
        return f"this onnxruntime has no {TENSORRT}"
    try:
        session = ort.InferenceSession(
            conv_model_bytes(), providers=[(TENSORRT, {"device_id": "0"}), CUDA], enable_fallback=0
        )
    except Exception as exc:  # ORT raises several unrelated exception types
        return f"onnxruntime could not start {TENSORRT}: {exc}"
    if session.get_providers()[0] != TENSORRT:
        return f"onnxruntime did not start {TENSORRT} (are TensorRT's libraries installed?)"
    return None


def test_gpu_tensorrt_accelerator_runs_fp16_ahead_of_cuda(tmp_path: Path) -> None:
    why = tensorrt_unusable()
    if why is not None:
        pytest.skip(why)
    config = (
        f"max_batch_size: 8 optimization {{ execution_accelerators {{ gpu_execution_accelerator {{ {TENSORRT_FP16} }}"
        " } }"
    )
    backend = load_conv(tmp_path, config)
    assert backend.providers[:2] == [TENSORRT, CUDA] and backend.on_gpu and backend.on_tensorrt
    assert backend.session.get_provider_options()[TENSORRT]["trt_fp16_enable"] in ("1", "True", "true")
    assert backend._bucket_backends == {}  # auto buckets stay off on TensorRT (batch_buckets.py)
    check_conv(backend, (2, 8, 5), rtol=1e-2, atol=1e-2)  # FP16: ~1e-3 relative
    assert (tmp_path / "trt_cache").is_dir()  # the relative cache path, taken from the model's directory
    backend.close()


def test_gpu_tensorrt_accelerator_that_cannot_start_leaves_the_cuda_ep_its_options(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if tensorrt_unusable() is None:
        pytest.skip("TensorRT starts here: test_gpu_tensorrt_accelerator_runs_fp16_ahead_of_cuda covers it")
    config = (
        f"max_batch_size: 8 optimization {{ execution_accelerators {{ gpu_execution_accelerator [{{ {TENSORRT_FP16} }},"
        ' { name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" } }] } }'
    )
    with caplog.at_level(logging.WARNING, logger="fastoip.onnx"):
        backend = load_conv(tmp_path, config)
    assert not backend.on_tensorrt
    assert any("model 'conv': the tensorrt execution accelerator is not used" in r.getMessage() for r in caplog.records)
    # on the CUDA EP, auto buckets as ever, and the options ORT's own fallback would have dropped
    check_cuda_options(backend, {"cudnn_conv_algo_search": "HEURISTIC", "device_id": "0"})


# -- CUDA-region inputs bound on the device (issue 42) ----------------------------------------------------------
def device_copy(data: np.ndarray) -> cuda.DeviceArray:
    """``data`` in a new cudaMalloc allocation on GPU 0."""
    runtime = cuda.runtime()
    assert runtime is not None
    data = np.ascontiguousarray(data)
    block = cuda.DeviceBlock(runtime, data.nbytes, 0)
    runtime.copy(block.pointer, data.ctypes.data, data.nbytes)
    return cuda.DeviceArray(cuda.DeviceBytes(block.pointer, data.nbytes, 0, block), data.dtype, data.shape)


def test_device_inputs_are_bound_on_the_gpu_gathered_and_padded(tmp_path: Path) -> None:
    backend = load_conv(tmp_path, "max_batch_size: 8")
    assert backend.device_inputs == 0 and sorted(backend._bucket_backends) == [1, 2, 4, 8]
    rng = np.random.default_rng(4)
    x = rng.random((3, 2, 4, 4), dtype=np.float32)
    (out,) = backend.run({"INPUT0": device_copy(x)}, ["OUTPUT0"])  # 3 rows: padded on the GPU to the bucket of 4
    np.testing.assert_allclose(out, expected_conv(x), rtol=5e-3, atol=1e-3)
    parts = [device_copy(x[:1]), x[1:2], device_copy(x[2:])]  # a batch of device and host parts
    (out,) = backend.run({"INPUT0": cuda.DeviceBatch(parts)}, ["OUTPUT0"])
    np.testing.assert_allclose(out, expected_conv(x), rtol=5e-3, atol=1e-3)
    two = x[:2]
    (out,) = backend.run({"INPUT0": device_copy(two)}, ["OUTPUT0"])  # a bucket's own size: bound where it lies
    np.testing.assert_allclose(out, expected_conv(two), rtol=5e-3, atol=1e-3)
    backend.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_batched_cuda_shared_memory_inputs_answer_each_request_its_rows(
    gpu_server: ServerProcess, protocol: str
) -> None:
    """Concurrent requests whose inputs lie in one CUDA region, at different offsets: merged by the batcher and
    gathered on the GPU; each answer is its own rows."""
    cudashm = cuda_shm_utilities()
    client_of = functools.partial(tg.InferenceServerClient, gpu_server.grpc_url) if protocol == "grpc" else (
        functools.partial(th.InferenceServerClient, gpu_server.http_url)
    )
    module = tg if protocol == "grpc" else th
    requests = 16
    data = np.arange(requests * 16, dtype=np.float32).reshape(requests, 16)
    row = 16 * 4
    handle = cudashm.create_shared_memory_region(f"rows_{protocol}", data.nbytes, 0)
    setup = client_of()
    try:
        cudashm.set_shared_memory_region(handle, [data])
        setup.register_cuda_shared_memory(f"rows_{protocol}", cudashm.get_raw_handle(handle), 0, data.nbytes)

        def ask(index: int) -> np.ndarray:
            inp = module.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_shared_memory(f"rows_{protocol}", row, offset=index * row)
            return client_of().infer("batched_fp32", [inp]).as_numpy("OUTPUT0")

        with concurrent.futures.ThreadPoolExecutor(requests) as pool:
            answers = list(pool.map(ask, range(requests)))
        for index, answer in enumerate(answers):
            np.testing.assert_array_equal(answer, data[index : index + 1])
        setup.unregister_cuda_shared_memory(f"rows_{protocol}")
    finally:
        cudashm.destroy_shared_memory_region(handle)
    assert setup.is_server_live()


CUDA_GRAPHS = (
    'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "cuda" '
    'parameters { key: "enable_cuda_graph" value: "1" } } ] } }'
)


def test_cuda_graphs_replay_each_batch_size_on_its_bound_buffers(tmp_path: Path) -> None:
    backend = load_conv(tmp_path, f"max_batch_size: 8 {CUDA_GRAPHS}")
    assert backend.cuda_graph and sorted(backend._bucket_backends) == [1, 2, 4, 8]
    assert all(bucket._graph is not None for bucket in backend._bucket_backends.values())
    check_conv(backend, (1, 3, 8, 5, 2, 3))  # padded, replayed again and again on the same buffers
    x = np.random.default_rng(5).random((3, 2, 4, 4), dtype=np.float32)
    (out,) = backend.run({"INPUT0": device_copy(x)}, ["OUTPUT0"])  # an input in device memory: copied on the GPU
    np.testing.assert_allclose(out, expected_conv(x), rtol=5e-3, atol=1e-3)
    backend.close()

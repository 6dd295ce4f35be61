"""CUDA shared-memory inputs bound on the device (issue 42), driven on CPU through the host stand-in for libcudart.

The stand-in's "device memory" is host memory (``helpers/host_cudart.c``), so a CPU session can bind it the way the
CUDA EP binds real device memory: these tests set a CPU session's ``device_inputs`` to GPU 0, which is what a
session on the CUDA EP of GPU 0 sets itself.  They prove fastoip's side: the decision (which models keep a CUDA
input on the device), the registry's device views and their lifetime, the batcher's hand-over of device parts, the
device-side gather and padding (cudaMemcpy / cudaMemset through the project's libcudart wrapper), and the IO
binding of device pointers.  ``tests/e2e/test_cuda.py`` binds real device memory on a GPU machine.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from fastoip import cuda
from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.onnx import OnnxBackend
from fastoip.core import Core
from fastoip.cuda import DeviceArray, DeviceBatch, DeviceBlock, DevicePool, gather_to_device, host_copy
from fastoip.repository.loaded import device_input_gpu
from fastoip.shared_memory import BYTE_SIZE, CUDA, OFFSET, REGION, SharedMemoryRegistry
from fastoip.types import InferInput, InferRequest
from harness import core_on
from host_cuda import build_host_cudart

WIDTH = 16
ROW_BYTES = WIDTH * 4


def double_model_bytes() -> bytes:
    """FP32 [batch, 16] -> OUTPUT0 = 2 * INPUT0 (computed, so a result proves ORT read the bytes)."""
    shape = ["batch", WIDTH]
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])], "double",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)], initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host_cudart(tmp_path_factory.mktemp("cudart"))


@pytest.fixture()
def standin(library: Path, monkeypatch: pytest.MonkeyPatch) -> cuda.CudaRuntime:
    """``cuda.runtime()`` is the stand-in for this test."""
    monkeypatch.setenv("FASTOIP_CUDA_RUNTIME", str(library))
    monkeypatch.setattr(cuda, "_searched", False)
    monkeypatch.setattr(cuda, "_runtime", None)
    found = cuda.runtime()
    assert found is not None
    return found


def on_device(runtime: cuda.CudaRuntime, data: np.ndarray) -> DeviceArray:
    """``data`` copied into a new device allocation."""
    data = np.ascontiguousarray(data)
    block = DeviceBlock(runtime, max(data.nbytes, 1), 0)
    runtime.copy(block.pointer, data.ctypes.data, data.nbytes)
    return DeviceArray(cuda.DeviceBytes(block.pointer, data.nbytes, 0, block), data.dtype, data.shape)


def rows(count: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(count * WIDTH, dtype=np.float32) + start).reshape(count, WIDTH)


# -- the device-side gather -------------------------------------------------------------------------
def test_gather_concatenates_device_and_host_parts_and_pads_with_zeros(standin: cuda.CudaRuntime) -> None:
    pool = DevicePool()
    parts = [on_device(standin, rows(2)), rows(1, 100.0), on_device(standin, rows(1, 200.0))]
    taken: list = []
    merged = gather_to_device("INPUT0", parts, 6, 0, pool, taken)
    assert merged.shape == (6, WIDTH) and merged.dtype == np.float32 and len(taken) == 1
    expected = np.concatenate([rows(2), rows(1, 100.0), rows(1, 200.0), np.zeros((2, WIDTH), np.float32)])
    np.testing.assert_array_equal(host_copy(merged), expected)
    # the buffer goes back and is taken again: one allocation for every batch of that size or less
    pool.give_back(*taken[0])
    again: list = []
    smaller = gather_to_device("INPUT0", [on_device(standin, rows(3, 7.0))], 3, 0, pool, again)
    assert pool.allocations == 1 and again[0][1] is taken[0][1]
    np.testing.assert_array_equal(host_copy(smaller), rows(3, 7.0))


def test_a_free_that_fails_in_a_finalizer_is_logged_not_raised(
    standin: cuda.CudaRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    block = DeviceBlock(standin, 256, 0)
    standin.free(block.pointer)  # freed behind the block's back: its own cudaFree now fails
    with pytest.raises(cuda.CudaError, match=r"cudaFree failed: invalid argument \(host stand-in\) \(cudaError 1\)"):
        standin.free(block.pointer)
    with caplog.at_level("WARNING", logger="fastoip.cuda"):
        del block
        gc.collect()
    assert any(
        "freeing device memory: cudaFree failed: invalid argument" in record.getMessage() for record in caplog.records
    )


# -- the registry's device views --------------------------------------------------------------------
def registered(standin: cuda.CudaRuntime, data: np.ndarray) -> tuple[SharedMemoryRegistry, DeviceBlock]:
    """A registry with region "r": a cudaMalloc'd block (the client's) holding ``data``, opened by IPC handle."""
    block = DeviceBlock(standin, data.nbytes, 0)
    standin.copy(block.pointer, data.ctypes.data, data.nbytes)
    registry = SharedMemoryRegistry()
    registry.register_cuda("r", standin.ipc_handle(block.pointer), 0, data.nbytes)
    return registry, block


def test_a_cuda_input_stays_on_the_device_only_for_a_model_that_binds_it_there(standin: cuda.CudaRuntime) -> None:
    data = rows(2, 1.0)
    registry, _block = registered(standin, data)
    where = {REGION: "r", BYTE_SIZE: data.nbytes}
    on_gpu = registry.input_view("INPUT0", "FP32", (2, WIDTH), where, device_id=0)
    assert type(on_gpu) is DeviceArray and on_gpu.shape == (2, WIDTH) and on_gpu.dtype == np.float32
    np.testing.assert_array_equal(host_copy(on_gpu), data)
    # no copy: the view is the region's own memory (a client's later write shows through)
    standin.copy(_block.pointer, rows(2, 50.0).ctypes.data, data.nbytes)
    np.testing.assert_array_equal(host_copy(on_gpu), rows(2, 50.0))
    # a model that reads host memory (device -1), or one on another GPU, gets a host copy as before
    for device in (-1, 1):
        host = registry.input_view("INPUT0", "FP32", (2, WIDTH), where, device_id=device)
        assert type(host) is np.ndarray
        np.testing.assert_array_equal(host, rows(2, 50.0))
    # bytes have no alignment to break: any offset stays on the device
    odd = registry.input_view("INPUT0", "UINT8", (4,), {REGION: "r", OFFSET: 1, BYTE_SIZE: 4}, device_id=0)
    assert type(odd) is DeviceArray
    with pytest.raises(Exception, match="exceeds region 'r'"):  # the bounds apply before any device view
        registry.input_view("INPUT0", "FP32", (3, WIDTH), {REGION: "r", BYTE_SIZE: 3 * ROW_BYTES}, device_id=0)


def test_misaligned_and_bytes_inputs_come_to_the_host(standin: cuda.CudaRuntime) -> None:
    data = np.arange(64, dtype=np.uint8)
    registry, _block = registered(standin, data)
    misaligned = registry.input_view("INPUT0", "FP32", (4,), {REGION: "r", OFFSET: 2, BYTE_SIZE: 16}, device_id=0)
    assert type(misaligned) is np.ndarray
    np.testing.assert_array_equal(misaligned.view(np.uint8), data[2:18])
    text = np.frombuffer(b"\x03\x00\x00\x00abc", np.uint8)
    strings, _text_block = registered(standin, text)
    words = strings.input_view("INPUT0", "BYTES", (1,), {REGION: "r", BYTE_SIZE: 7}, device_id=0)
    assert type(words) is np.ndarray and list(words) == [b"abc"]


def test_a_device_view_keeps_the_handle_open_after_unregister(standin: cuda.CudaRuntime, library: Path) -> None:
    opened = ctypes.CDLL(str(library)).hostcudart_open_handles
    before = opened()
    registry, _block = registered(standin, rows(1))
    view = registry.input_view("INPUT0", "FP32", (1, WIDTH), {REGION: "r", BYTE_SIZE: ROW_BYTES}, device_id=0)
    registry.unregister("r", CUDA)
    assert opened() == before + 1  # the request still reads it
    np.testing.assert_array_equal(host_copy(view), rows(1))
    del view
    gc.collect()
    assert opened() == before


# -- which models keep CUDA inputs on the device -----------------------------------------------------
class _Instance:
    """What ``device_input_gpu`` reads of an instance: the GPU it binds device inputs on."""

    def __init__(self, device_inputs: int) -> None:
        self.device_inputs = device_inputs


@pytest.mark.parametrize(
    ("config", "instances", "reshaped", "cached", "expected"),
    [
        ("max_batch_size: 8", [0, 0], False, False, 0),
        ("max_batch_size: 8", [1], False, False, 1),
        ("max_batch_size: 8", [0, 1], False, False, -1),  # instances on two GPUs
        ("max_batch_size: 8", [0, -1], False, False, -1),  # one instance on the CPU (or a string model)
        ("max_batch_size: 8", [0], True, False, -1),  # reshape outside the graph
        ("max_batch_size: 8", [0], False, True, -1),  # the response cache hashes the bytes
        ("max_batch_size: 8 sequence_batching {}", [0], False, False, -1),
        ('max_batch_size: 8 input { name: "x" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true }',
         [0], False, False, -1),
        ('platform: "ensemble" ensemble_scheduling { step { model_name: "a" model_version: -1 } }', [0], False, False,
         -1),
        ("max_batch_size: 8", [], False, False, -1),
    ],
)
def test_which_models_bind_cuda_inputs_on_the_device(
    config: str, instances: list[int], reshaped: bool, cached: bool, expected: int
) -> None:
    parsed = text_format.Parse(config, mc.ModelConfig())
    assert device_input_gpu(parsed, [_Instance(d) for d in instances], reshaped, cached) == expected


# -- the ONNX backend binds device pointers -------------------------------------------------------------
@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("double") / "model.onnx"
    path.write_bytes(double_model_bytes())
    return path


def binding_backend(path: Path) -> OnnxBackend:
    """A CPU session told to bind device inputs on GPU 0: the stand-in's device memory is host memory."""
    backend = OnnxBackend(path, use_gpu=False, intra_op_threads=1)
    backend.device_inputs = 0
    return backend


def test_backend_binds_a_device_input_and_gathers_a_batch(standin: cuda.CudaRuntime, model_file: Path) -> None:
    backend = binding_backend(model_file)
    (out,) = backend.run({"INPUT0": on_device(standin, rows(2, 3.0))}, ["OUTPUT0"])
    np.testing.assert_array_equal(out, 2 * rows(2, 3.0))
    batch = DeviceBatch([on_device(standin, rows(1)), rows(2, 10.0), on_device(standin, rows(1, 20.0))])
    assert batch.shape == (4, WIDTH) and batch.nbytes == 4 * ROW_BYTES
    (out,) = backend.run({"INPUT0": batch}, ["OUTPUT0"])
    np.testing.assert_array_equal(out, 2 * np.concatenate([rows(1), rows(2, 10.0), rows(1, 20.0)]))
    assert backend._device_pool.allocations == 1
    backend.close()


def test_backend_pads_device_inputs_to_a_bucket_and_cuts_the_rows_back(
    standin: cuda.CudaRuntime, model_file: Path
) -> None:
    backend = binding_backend(model_file)
    backend.use_batch_buckets((4, 8), lambda: binding_backend(model_file))
    (out,) = backend.run({"INPUT0": on_device(standin, rows(3, 5.0))}, ["OUTPUT0"])
    assert out.shape == (3, WIDTH)
    np.testing.assert_array_equal(out, 2 * rows(3, 5.0))
    batch = DeviceBatch([on_device(standin, rows(4)), on_device(standin, rows(1, 9.0))])  # 5 rows: bucket 8
    (out,) = backend.run({"INPUT0": batch}, ["OUTPUT0"])
    np.testing.assert_array_equal(out, 2 * np.concatenate([rows(4), rows(1, 9.0)]))
    backend.close()


def test_backend_writes_outputs_of_device_inputs_into_their_regions(
    standin: cuda.CudaRuntime, model_file: Path
) -> None:
    backend = binding_backend(model_file)
    destination = np.zeros(2 * ROW_BYTES, np.uint8)
    for step in range(3):  # the first run learns the output shape, the next ones write in place
        (out,) = backend.run({"INPUT0": on_device(standin, rows(2, step))}, ["OUTPUT0"], {"OUTPUT0": destination})
        np.testing.assert_array_equal(out, 2 * rows(2, step))
    assert out.ctypes.data == destination.ctypes.data
    np.testing.assert_array_equal(destination.view(np.float32).reshape(2, WIDTH), 2 * rows(2, 2))
    backend.close()


# -- through the Core: requests whose inputs are in a CUDA region, batched ----------------------------------
@pytest.fixture()
def core(tmp_path: Path, model_file: Path, standin: cuda.CudaRuntime) -> Iterator[Core]:
    model_dir = tmp_path / "double"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(model_file.read_bytes())
    # three requests make a batch (the preferred size); a lone one waits at most 5 s
    (model_dir / "config.pbtxt").write_text(
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [3] max_queue_delay_microseconds: 5000000 }\n"
    )
    with core_on(tmp_path) as running:
        model = running.repository.get("double")
        model.device_inputs = 0  # what a model on the CUDA EP of GPU 0 decides at load
        for backend in model.backends:
            backend.device_inputs = 0  # type: ignore[attr-defined]
        yield running


def test_batched_requests_with_cuda_inputs_are_gathered_on_the_device(
    core: Core, standin: cuda.CudaRuntime
) -> None:
    block = DeviceBlock(standin, 3 * ROW_BYTES, 0)
    data = rows(3, 1.0)
    standin.copy(block.pointer, data.ctypes.data, data.nbytes)
    core.register_cuda_shared_memory("in", standin.ipc_handle(block.pointer), 0, 3 * ROW_BYTES)
    answers: dict[int, np.ndarray] = {}

    def ask(index: int) -> None:
        where = {REGION: "in", OFFSET: index * ROW_BYTES, BYTE_SIZE: ROW_BYTES}
        request = InferRequest("double", inputs=[InferInput("INPUT0", "FP32", (1, WIDTH), None, where)])
        answers[index] = core.infer(request).output("OUTPUT0").data

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [0, 1, 2]
    for index in range(3):
        np.testing.assert_array_equal(answers[index], 2 * data[index : index + 1])
    (stats,) = core.statistics("double")
    assert stats.inference_stats.success.count == 3 and stats.execution_count == 1  # one batch of three
    backend = core.repository.get("double").backends[0]
    assert backend._device_pool.allocations == 1  # type: ignore[attr-defined]  # gathered on the "device"
    core.unregister_shared_memory("in", CUDA)

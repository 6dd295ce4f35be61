"""System shared memory: outputs computed straight into their regions, and what happens when shapes move.

ONNX models write shared-memory outputs in place once a run with the same input shapes has shown the
output shapes (``OnnxBackend._run_into``); these tests hold the results to the model's own answer
whichever way a run went: first run, in-place runs, new input shapes, data-dependent output shapes.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, nonzero_model_bytes, write_model
from serverproc import ServerProcess

REGION_BYTES = 4 * 1024


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory, grpc_frontend: str):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("shm-repo")
    write_model(root, "identity_fp32", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    write_model(root, "nonzero", nonzero_model_bytes())
    with ServerProcess(root, grpc_frontend=grpc_frontend) as proc:
        yield proc


@pytest.fixture()
def regions(shm_server: ServerProcess):  # type: ignore[no-untyped-def]
    """An input and an output region registered with the server; yields (client, in, out handles)."""
    client = tg.InferenceServerClient(shm_server.grpc_url)
    tag = f"{os.getpid()}_{id(client)}"
    handle_in = shm.create_shared_memory_region("in", f"/fastoip_t_in_{tag}", REGION_BYTES)
    handle_out = shm.create_shared_memory_region("out", f"/fastoip_t_out_{tag}", REGION_BYTES)
    client.register_system_shared_memory("in", f"/fastoip_t_in_{tag}", REGION_BYTES)
    client.register_system_shared_memory("out", f"/fastoip_t_out_{tag}", REGION_BYTES)
    try:
        yield client, handle_in, handle_out
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


def infer_in_regions(client, model: str, handle_in, data: np.ndarray, datatype: str, out_bytes: int):  # type: ignore[no-untyped-def]
    shm.set_shared_memory_region(handle_in, [data])
    inp = tg.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_shared_memory("in", data.nbytes)
    out = tg.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out", out_bytes)
    return client.infer(model, [inp], outputs=[out])


def test_outputs_in_place_follow_batch_size_changes(regions) -> None:  # type: ignore[no-untyped-def]
    client, handle_in, handle_out = regions
    rng = np.random.default_rng(7)
    # Repeats of one shape take the in-place path; a new batch size must not reuse the old shape.
    for batch in (1, 1, 1, 3, 3, 1, 8, 8, 2):
        data = rng.standard_normal((batch, 4)).astype(np.float32)
        result = infer_in_regions(client, "identity_fp32", handle_in, data, "FP32", data.nbytes)
        assert result.get_output("OUTPUT0").shape == [batch, 4]
        assert [len(raw) for raw in result.get_response().raw_output_contents] == [0]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.float32, [batch, 4]), data)


def test_data_dependent_output_shapes_in_regions(regions) -> None:  # type: ignore[no-untyped-def]
    client, handle_in, handle_out = regions
    # Same input shape each time, different output shapes: a remembered shape must be noticed as wrong.
    for nonzero in ([1, 3, 5], [1, 3, 5], [0, 2, 4, 6, 7], [2], [2], []):
        data = np.zeros(8, dtype=np.int32)
        data[nonzero] = 9
        result = infer_in_regions(client, "nonzero", handle_in, data, "INT32", REGION_BYTES)
        assert result.get_output("OUTPUT0").shape == [1, len(nonzero)]
        got = shm.get_contents_as_numpy(handle_out, np.int64, [1, len(nonzero)])
        assert got.reshape(-1).tolist() == nonzero


def test_output_region_too_small_is_refused_and_server_stays_up(regions) -> None:  # type: ignore[no-untyped-def]
    client, handle_in, handle_out = regions
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):  # the second time the output shape is known before the run
        with pytest.raises(InferenceServerException) as err:
            infer_in_regions(client, "identity_fp32", handle_in, data, "FP32", data.nbytes - 4)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "output 'OUTPUT0' needs 32 bytes but shared memory byte size is 28" in err.value.message()
    result = infer_in_regions(client, "identity_fp32", handle_in, data, "FP32", data.nbytes)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.float32, [2, 4]), data)
    assert result.get_output("OUTPUT0").shape == [2, 4]


def test_unregistering_output_region_in_use_is_safe(regions, shm_server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    client, handle_in, _ = regions
    data = np.ones((1, 4), dtype=np.float32)
    infer_in_regions(client, "identity_fp32", handle_in, data, "FP32", data.nbytes)
    client.unregister_system_shared_memory("out")
    with pytest.raises(InferenceServerException) as err:
        infer_in_regions(client, "identity_fp32", handle_in, data, "FP32", data.nbytes)
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert client.is_server_live()


# -- CUDA shared memory calls on any host (Triton answers them on every build) ---------------------
@pytest.fixture(scope="module")
def cuda_calls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server (gRPC and HTTP) for both protocols: the calls below register nothing that outlives them."""
    root = tmp_path_factory.mktemp("cuda-calls")
    write_model(root, "identity_fp32", identity_model_bytes(TensorProto.FLOAT, [4]), config="max_batch_size: 8\n")
    with ServerProcess(root, http=True) as proc:
        yield proc


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cuda_status_and_unregister_work_without_a_gpu(cuda_calls_server: ServerProcess, protocol: str) -> None:
    """Client clean-up code calls unregister_cuda_shared_memory() unconditionally; it must not fail on a CPU host."""
    import tritonclient.http as th

    from fastoip import cuda

    proc = cuda_calls_server
    client = (
        tg.InferenceServerClient(proc.grpc_url) if protocol == "grpc" else th.InferenceServerClient(proc.http_url)
    )
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("never_registered")
    status = client.get_cuda_shared_memory_status()
    if protocol == "grpc":
        assert len(status.regions) == 0
    else:
        assert status == []
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region: 'nope'"):
        client.get_cuda_shared_memory_status("nope")
    if cuda.runtime() is None:  # only registering needs CUDA
        with pytest.raises(InferenceServerException) as info:
            client.register_cuda_shared_memory("r", base64.b64encode(b"\0" * 64), 0, 64)
        assert info.value.status() in ("StatusCode.UNAVAILABLE", "503")
        assert "needs a GPU" in info.value.message()
    # System shared memory status is unaffected, and inference still works.
    client.unregister_system_shared_memory()
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = (tg if protocol == "grpc" else th).InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)

"""Triton's ``reshape``: requests in the config's dims, the model in its own shape, outputs back in config dims."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto

from fastoip.core import Core
from fastoip.errors import InvalidArgument
from fastoip.repository import RepositoryOptions
from fastoip.types import InferInput, InferRequest
from models import identity_model_bytes, write_model
from serverproc import ServerProcess

RESHAPED = (
    "max_batch_size: 8\n"
    'input { name: "INPUT0" data_type: TYPE_FP32 dims: [6] reshape { shape: [2, 3] } }\n'
    'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [6] reshape { shape: [2, 3] } }\n'
)
#: Variable dims: the client's [n, 6] is the model's [n, 2, 3]; the -1 moves across.
VARIABLE = (
    "max_batch_size: 0\n"
    'input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 6] reshape { shape: [-1, 2, 3] } }\n'
    'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, 6] reshape { shape: [-1, 2, 3] } }\n'
)
#: A scalar per batch item: dims [1] with an empty reshape (the model takes [batch]).
SCALAR = (
    "max_batch_size: 4\n"
    'input { name: "INPUT0" data_type: TYPE_INT32 dims: [1] reshape { shape: [] } }\n'
    'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [1] reshape { shape: [] } }\n'
)


#: Batching plus a variable dim: the client's [b, n, 2] is the model's [b, n, 1, 2].
BATCHED_VARIABLE = (
    "max_batch_size: 4\n"
    'input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 2] reshape { shape: [-1, 1, 2] } }\n'
    'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, 2] reshape { shape: [-1, 1, 2] } }\n'
)


def _repository(root: Path) -> Path:
    write_model(root, "reshaped", identity_model_bytes(TensorProto.FLOAT, [2, 3]), config=RESHAPED)
    write_model(root, "variable", identity_model_bytes(TensorProto.FLOAT, ["n", 2, 3], batch=False), config=VARIABLE)
    write_model(root, "scalar", identity_model_bytes(TensorProto.INT32, []), config=SCALAR)
    write_model(root, "batched_variable", identity_model_bytes(TensorProto.FLOAT, ["n", 1, 2]), config=BATCHED_VARIABLE)
    delay = "dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
    batched = RESHAPED.replace("max_batch_size: 8\n", "max_batch_size: 8\n" + delay)
    write_model(root, "batched", identity_model_bytes(TensorProto.FLOAT, [2, 3]), config=batched)
    # dims that do not fit the model and no reshape: refused at load, with the reason
    write_model(
        root,
        "misfit",
        identity_model_bytes(TensorProto.FLOAT, [2, 3]),
        config='max_batch_size: 8\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: [6] }\n',
    )
    write_model(
        root,
        "wrong_count",
        identity_model_bytes(TensorProto.FLOAT, [2, 3]),
        config='max_batch_size: 8\ninput { name: "INPUT0" dims: [5] reshape { shape: [2, 3] } }\n',
    )
    return root


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    core = Core(_repository(tmp_path_factory.mktemp("reshape")), RepositoryOptions(use_gpu=False))
    core.load_models()
    yield core
    core.close()


def _run(core: Core, model: str, data: np.ndarray, datatype: str = "FP32") -> np.ndarray:
    response = core.infer(InferRequest(model, inputs=[InferInput("INPUT0", datatype, data.shape, data)]))
    out = response.output("OUTPUT0")
    assert out.data is not None and tuple(out.shape) == out.data.shape
    return out.data


def test_input_and_output_travel_in_the_configs_dims(core: Core) -> None:
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = _run(core, "reshaped", data)
    assert out.shape == (2, 6)
    np.testing.assert_array_equal(out, data)
    meta = core.model_metadata("reshaped")
    assert meta.inputs[0].shape == (-1, 6) and meta.outputs[0].shape == (-1, 6)


def test_requests_are_validated_against_the_config_not_the_model(core: Core) -> None:
    with pytest.raises(InvalidArgument, match=r"unexpected shape for input 'INPUT0'.*Expected \[-1, 6\]"):
        _run(core, "reshaped", np.zeros((1, 2, 3), np.float32))


def test_variable_dims_move_to_the_models_variable_dims_including_zero(core: Core) -> None:
    data = np.arange(18, dtype=np.float32).reshape(3, 6)
    np.testing.assert_array_equal(_run(core, "variable", data), data)
    empty = np.zeros((0, 6), np.float32)
    assert _run(core, "variable", empty).shape == (0, 6)


def test_batching_with_a_variable_dim_including_zero(core: Core) -> None:
    data = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    np.testing.assert_array_equal(_run(core, "batched_variable", data), data)
    assert _run(core, "batched_variable", np.zeros((2, 0, 2), np.float32)).shape == (2, 0, 2)


def test_empty_reshape_is_a_scalar_per_batch_item(core: Core) -> None:
    data = np.array([[5], [6], [7]], dtype=np.int32)
    out = _run(core, "scalar", data, "INT32")
    assert out.shape == (3, 1)
    np.testing.assert_array_equal(out, data)


def test_batched_requests_are_merged_and_split_back_in_config_dims(core: Core) -> None:
    results: dict[int, np.ndarray] = {}

    def send(index: int) -> None:
        data = np.full((index + 1, 6), index, dtype=np.float32)
        results[index] = _run(core, "batched", data)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for index in range(3):
        assert results[index].shape == (index + 1, 6)
        assert (results[index] == index).all()
    stats = core.statistics("batched")[0]
    assert stats.inference_count == 6  # 1 + 2 + 3 items went through


def test_dims_that_do_not_fit_the_model_are_refused_at_load_with_the_reason(core: Core) -> None:
    index = {entry.name: entry for entry in core.repository_index()}
    misfit = index["misfit"]
    assert misfit.state == "UNAVAILABLE"
    assert "tensor 'INPUT0': the model expects 3 dimensions (shape [-1,2,3])" in misfit.reason
    assert "'reshape'" in misfit.reason
    assert "has different size for dims and reshape" in index["wrong_count"].reason
    assert index["reshaped"].state == "READY"


def test_grpc_client_sees_config_dims(tmp_path: Path) -> None:
    write_model(tmp_path, "reshaped", identity_model_bytes(TensorProto.FLOAT, [2, 3]), config=RESHAPED)
    with ServerProcess(tmp_path) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        data = np.arange(6, dtype=np.float32).reshape(1, 6)
        tensor = grpcclient.InferInput("INPUT0", [1, 6], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("reshaped", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)

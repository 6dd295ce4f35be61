"""CUDA graphs (ORT's ``enable_cuda_graph``, the ``cuda`` accelerator's parameter, issue 42): the option reaches the
CUDA EP, a config whose shapes are not fixed is refused at load on every machine, and the runs on buffers bound
once (what a captured graph replays on) pad, replay and cut back right.  The runner is driven here on the CPU EP
with host buffers (``HostCopier``); capture and replay themselves run on a GPU (``tests/e2e/test_cuda.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.batch_buckets import bucket_sizes
from fastoip.backends.onnx import KIND, OnnxBackend, _ort
from fastoip.backends.ort_graphs import GraphRunner, HostCopier, wants_cuda_graph
from fastoip.backends.ort_providers import CPU, CUDA, plan_providers
from fastoip.cuda import DeviceBatch
from fastoip.errors import InvalidArgument
from fastoip.options import RepositoryOptions
from models import identity_model_bytes

GRAPHS = (
    'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "cuda" '
    'parameters { key: "enable_cuda_graph" value: "1" } } ] } }'
)


def double_model_bytes(width: int = 4) -> bytes:
    """FP32 [batch, width] -> OUTPUT0 = 2 * INPUT0."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])], "double",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])], initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def load(tmp_path: Path, data: bytes, text: str) -> list[OnnxBackend]:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(data)
    base = text_format.Parse(f'name: "m" platform: "onnxruntime_onnx" {text}', mc.ModelConfig())
    _, backends = KIND.load("m", 1, version / "model.onnx", base, RepositoryOptions(use_gpu=False))
    return backends


def test_the_option_reaches_the_cuda_ep(tmp_path: Path) -> None:
    config = text_format.Parse(f'name: "m" {GRAPHS}', mc.ModelConfig())
    plan = plan_providers(config, gpu=True, available=[CUDA, CPU], model_dir=tmp_path)
    assert plan.providers[0] == (CUDA, {"enable_cuda_graph": "1", "device_id": "0"})
    assert wants_cuda_graph(plan.providers[0][1])  # type: ignore[index]
    assert not wants_cuda_graph({"enable_cuda_graph": "0"}) and not wants_cuda_graph({})


@pytest.mark.parametrize(
    ("data", "text", "words"),
    [
        (identity_model_bytes(TensorProto.FLOAT, ["n"]), "max_batch_size: 8",
         "input 'INPUT0' has the shape [-1,-1] in the model, whose non-batch dims must all be numbers"),
        (double_model_bytes(),
         'max_batch_size: 8 parameters { key: "cuda_batch_buckets" value { string_value: "off" } }',
         "while 'cuda_batch_buckets' is off"),
        (identity_model_bytes(TensorProto.STRING, [2]), "max_batch_size: 8", "input 'INPUT0' is a string tensor"),
        (identity_model_bytes(TensorProto.FLOAT, [2, "n"], batch=False), "max_batch_size: 0",
         "input 'INPUT0' has the shape [2,-1] in the model, whose dims must all be numbers"),
    ],
)
def test_a_config_whose_shapes_are_not_fixed_is_refused_on_every_machine(
    tmp_path: Path, data: bytes, text: str, words: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        load(tmp_path, data, f"{text} {GRAPHS}")
    assert "the cuda execution accelerator's enable_cuda_graph needs every shape fixed" in err.value.message
    assert words in err.value.message


def test_a_fixed_model_loads_and_runs_where_there_is_no_gpu(tmp_path: Path) -> None:
    (backend,) = load(tmp_path, double_model_bytes(), f"max_batch_size: 8 {GRAPHS}")
    assert not backend.cuda_graph  # the CPU EP has no graphs: the model simply runs
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(backend.run({"INPUT0": x}, ["OUTPUT0"])[0], 2 * x)


def test_with_graphs_auto_buckets_are_on_for_any_batching_model_on_the_gpu(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(double_model_bytes())  # no convolution: auto alone would leave it one session
    config = text_format.Parse('name: "m" max_batch_size: 8', mc.ModelConfig())
    assert bucket_sizes(config, path, on_gpu=True) == ()
    assert bucket_sizes(config, path, on_gpu=True, cuda_graph=True) == (1, 2, 4, 8)
    assert bucket_sizes(config, path, on_gpu=False, cuda_graph=True) == ()


def test_the_runner_pads_replays_and_cuts_back_on_buffers_bound_once(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(double_model_bytes())
    ort = _ort()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    runner = GraphRunner(ort, session, 4, ("cpu", 0), HostCopier())
    runner.warm_up()
    first = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out_first,) = runner.run({"INPUT0": first}, 3, ["OUTPUT0"])
    np.testing.assert_array_equal(out_first, 2 * first)
    parts = [np.full((1, 4), 7.0, np.float32), np.full((3, 4), -1.0, np.float32)]  # a batch of parts, 4 rows
    (out_second,) = runner.run({"INPUT0": DeviceBatch(parts)}, 4, ["OUTPUT0"])
    np.testing.assert_array_equal(out_second, 2 * np.concatenate(parts))
    np.testing.assert_array_equal(out_first, 2 * first)  # an answer given is never the next run's buffer
    (one,) = runner.run({"INPUT0": np.ones((1, 4), np.float32)}, 1, ["OUTPUT0"])  # rows 2-4 padded with zeros
    np.testing.assert_array_equal(one, np.full((1, 4), 2.0, np.float32))
    with pytest.raises(InvalidArgument, match="more rows than the session's"):
        runner.run({"INPUT0": np.ones((5, 4), np.float32)}, 5, ["OUTPUT0"])


def test_a_backend_with_graphs_runs_each_batch_on_its_buckets_bound_buffers(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(double_model_bytes())

    def session() -> OnnxBackend:
        backend = OnnxBackend(path, use_gpu=False, intra_op_threads=1)
        backend.cuda_graph = True  # what a session on the CUDA EP with the option says of itself
        return backend

    backend = session()
    backend.use_batch_buckets((2, 4, 8), session)
    backend.use_graphs(8)
    assert {size: sibling._graph.batch for size, sibling in backend._bucket_backends.items()} == {2: 2, 4: 4, 8: 8}
    rng = np.random.default_rng(3)
    for rows in (1, 2, 3, 5, 8):
        x = rng.random((rows, 4), dtype=np.float32)
        (out,) = backend.run({"INPUT0": x}, ["OUTPUT0"])
        assert out.shape == (rows, 4)
        np.testing.assert_array_equal(out, 2 * x)
    backend.close()

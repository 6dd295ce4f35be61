"""What an ONNX graph may cost (issue 37, ``backends/onnx_cost.py`` and the ONNX backend's run-time bound)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from fastoip.backends.onnx import OnnxBackend
from fastoip.backends.onnx_cost import check_graph
from fastoip.errors import InvalidArgument, ResourceExhausted

MIB = 1024 * 1024


def save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


def shape(name: str, *values: int) -> object:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))


def test_a_computed_tensor_over_the_bound_is_refused_naming_it(tmp_path: Path) -> None:
    # the 256 MB hides in an intermediate that is summed away: the output alone would not tell
    path = save(tmp_path / "m.onnx",
                [helper.make_node("ConstantOfShape", ["s"], ["big"]), helper.make_node("ReduceSum", ["big"], ["y"])],
                [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape("s", 8192, 8192)])
    with pytest.raises(InvalidArgument, match=r"computes 'big' \(ConstantOfShape\) of 268435456 bytes, more than the "
                                              r"67108864 bytes"):
        check_graph("m", path, 64 * MIB)
    assert check_graph("m", path, 512 * MIB).no_constant_folding is False


def test_a_shape_computed_through_data_propagation_is_known(tmp_path: Path) -> None:
    # Shape -> Concat with a constant: onnx's data propagation sizes it
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Concat", ["xs", "k"], ["s"], axis=0),
             helper.make_node("ConstantOfShape", ["s"], ["y"])]
    path = save(tmp_path / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape("k", 32 * MIB)])
    with pytest.raises(InvalidArgument, match="'y'"):
        check_graph("m", path, 64 * MIB)


def test_a_constant_shape_inference_cannot_size_turns_constant_folding_off(tmp_path: Path) -> None:
    """Abs of a constant shape: onnx does not propagate it, ORT's constant folding would build it at load."""
    nodes = [helper.make_node("Abs", ["s"], ["a"]), helper.make_node("ConstantOfShape", ["a"], ["c"]),
             helper.make_node("Add", ["x", "c"], ["y"])]
    path = save(tmp_path / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape("s", 64 * MIB)])
    assert check_graph("m", path, 64 * MIB).no_constant_folding is True
    # and a session made that way builds nothing at load (ORT's folding made 256 MB here)
    before = _rss()
    backend = OnnxBackend(path, use_gpu=False, max_output_bytes=64 * MIB, constant_folding=False)
    assert _rss() - before < 100 * MIB
    with pytest.raises(ResourceExhausted, match="'y' is 268435456 bytes"):
        backend.run({"x": np.ones(1, np.float32)}, ["y"])
    backend.close()


def test_an_ordinary_graph_passes_and_an_unreadable_one_goes_to_ort_unfolded(tmp_path: Path) -> None:
    path = save(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    assert check_graph("m", path, 1024).no_constant_folding is False
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff" * 64)
    assert check_graph("junk", junk, 1024).no_constant_folding is True


def test_the_run_time_bound_is_per_request_of_a_batch(tmp_path: Path) -> None:
    path = save(tmp_path / "m.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1024])])
    backend = OnnxBackend(path, use_gpu=False, max_output_bytes=4096)
    backend.batches = True
    out = backend.run({"x": np.ones((8, 1024), np.float32)}, ["y"])  # 8 requests of 4 KiB each: within
    assert out[0].shape == (8, 1024)
    backend.max_output_bytes = 4095
    with pytest.raises(ResourceExhausted, match=r"8 requests of 4095 bytes each") as info:
        backend.run({"x": np.ones((8, 1024), np.float32)}, ["y"])
    assert info.value.grpc_code == "RESOURCE_EXHAUSTED" and info.value.http_status == 500
    backend.close()


def _rss() -> int:
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

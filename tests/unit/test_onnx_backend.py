"""The ONNX Runtime backend in process: outputs written into caller-given bytes, instance placement, pinned inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto

from fastoip.backends.onnx import OnnxBackend
from models import identity_model_bytes, nonzero_model_bytes


def backend_for(tmp_path: Path, data: bytes) -> OnnxBackend:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    return OnnxBackend(path, use_gpu=False)


def test_second_run_with_same_shapes_writes_into_destination(tmp_path: Path) -> None:
    backend = backend_for(tmp_path, identity_model_bytes(TensorProto.FLOAT, [4]))
    destination = np.zeros(64, dtype=np.uint8)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    first = backend.run({"INPUT0": x}, ["OUTPUT0"], destinations={"OUTPUT0": destination})[0]
    assert not np.shares_memory(first, destination)  # shapes not known yet: ORT allocated
    second = backend.run({"INPUT0": x + 1}, ["OUTPUT0"], destinations={"OUTPUT0": destination})[0]
    assert np.shares_memory(second, destination)
    np.testing.assert_array_equal(destination[:32].view(np.float32).reshape(2, 4), x + 1)


def test_destination_too_small_or_missing_falls_back_to_allocated_output(tmp_path: Path) -> None:
    backend = backend_for(tmp_path, identity_model_bytes(TensorProto.FLOAT, [4]))
    x = np.ones((2, 4), dtype=np.float32)
    small = np.zeros(16, dtype=np.uint8)
    for _ in range(2):
        out = backend.run({"INPUT0": x}, ["OUTPUT0"], destinations={"OUTPUT0": small})[0]
        assert not np.shares_memory(out, small)
        np.testing.assert_array_equal(out, x)
    out = backend.run({"INPUT0": x}, ["OUTPUT0"], destinations={})[0]
    np.testing.assert_array_equal(out, x)


def test_data_dependent_shape_is_rerun_and_relearned(tmp_path: Path) -> None:
    backend = backend_for(tmp_path, nonzero_model_bytes())
    destination = np.zeros(256, dtype=np.uint8)
    for nonzero in ([1, 2], [1, 2], [0, 3, 5], [0, 3, 5]):
        x = np.zeros(8, dtype=np.int32)
        x[nonzero] = 1
        out = backend.run({"INPUT0": x}, ["OUTPUT0"], destinations={"OUTPUT0": destination})[0]
        assert out.reshape(-1).tolist() == nonzero
    # Those input shapes are no longer bound: every later run is an ordinary one.
    key = (("OUTPUT0",), (("INPUT0", (8,)),))
    assert backend._learned_shapes[key] is None


def test_instances_are_placed_as_triton_places_them() -> None:
    from google.protobuf import text_format

    from fastoip._proto import model_config_pb2 as mc
    from fastoip.backends.onnx import instance_devices

    config = text_format.Parse(
        'instance_group [{ count: 2 kind: KIND_GPU gpus: [0, 1] }, { count: 1 kind: KIND_CPU gpus: [3] },'
        ' { count: 1 kind: KIND_GPU }]',
        mc.ModelConfig(),
    )
    assert instance_devices(config) == [0, 0, 1, 1, 0, 0]
    assert instance_devices(mc.ModelConfig()) == [0]


def test_pinned_batch_inputs_follow_the_config_switch() -> None:
    from google.protobuf import text_format

    from fastoip._proto import model_config_pb2 as mc
    from fastoip.repository.loaded import wants_pinned_inputs

    assert wants_pinned_inputs(mc.ModelConfig())  # Triton's default: on
    off = text_format.Parse("optimization { input_pinned_memory { enable: false } }", mc.ModelConfig())
    assert not wants_pinned_inputs(off)
    on = text_format.Parse("optimization { input_pinned_memory { enable: true } }", mc.ModelConfig())
    assert wants_pinned_inputs(on)

"""Batch buckets: which sizes a model keeps a session for, and batches padded up to them (real ORT, CPU EP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto

from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.batch_buckets import bucket_sizes, cut_rows, padded_feeds, smallest_fit
from fastoip.backends.onnx import KIND, OnnxBackend
from fastoip.errors import InvalidArgument
from fastoip.options import RepositoryOptions
from fastoip.scheduling.buffers import BufferPool
from models import conv_model_bytes, expected_conv, identity_model_bytes


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    return path


def test_auto_keeps_powers_of_two_and_preferred_sizes_for_a_convolution_on_the_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, conv_model_bytes())
    batched = config('name: "m" max_batch_size: 24 dynamic_batching { preferred_batch_size: [ 12 ] }')
    assert bucket_sizes(batched, path, on_gpu=True) == (1, 2, 4, 8, 12, 16, 24)
    assert bucket_sizes(config('name: "m" max_batch_size: 8'), path, on_gpu=True) == (1, 2, 4, 8)


@pytest.mark.parametrize(
    ("text", "on_gpu"),
    [
        ('name: "m" max_batch_size: 8', False),  # the CPU EP does not re-plan per shape
        ('name: "m" max_batch_size: 1', True),  # one size only
        ('name: "m" max_batch_size: 0', True),  # not batching
        ('name: "m" max_batch_size: 8 parameters { key: "cuda_batch_buckets" value { string_value: "off" } }', True),
    ],
)
def test_auto_or_off_leaves_batches_as_they_come(tmp_path: Path, text: str, on_gpu: bool) -> None:
    assert bucket_sizes(config(text), write(tmp_path, conv_model_bytes()), on_gpu) == ()


def test_auto_is_off_on_the_tensorrt_ep_and_a_list_still_applies(tmp_path: Path) -> None:
    """TensorRT widens one engine's shape range to the batches it sees; a session per size would build one each."""
    path = write(tmp_path, conv_model_bytes())
    assert bucket_sizes(config('name: "m" max_batch_size: 8'), path, on_gpu=True, tensorrt=True) == ()
    listed = 'name: "m" max_batch_size: 8 parameters { key: "cuda_batch_buckets" value { string_value: "2" } }'
    assert bucket_sizes(config(listed), path, on_gpu=True, tensorrt=True) == (2, 8)


def test_auto_leaves_a_model_without_convolutions_alone(tmp_path: Path) -> None:
    path = write(tmp_path, identity_model_bytes(TensorProto.FLOAT, [4]))
    assert bucket_sizes(config('name: "m" max_batch_size: 8'), path, on_gpu=True) == ()


def test_listed_sizes_apply_on_any_provider_and_always_include_the_largest(tmp_path: Path) -> None:
    text = 'name: "m" max_batch_size: 8 parameters { key: "cuda_batch_buckets" value { string_value: " 4, 2" } }'
    assert bucket_sizes(config(text), write(tmp_path, identity_model_bytes(TensorProto.FLOAT, [4])), False) == (
        2, 4, 8,
    )


@pytest.mark.parametrize(
    ("max_batch_size", "value", "says"),
    [
        (8, "1,x", "must be auto, off or batch sizes"),
        (8, "0,4", "lists [0], outside 1 to the max_batch_size 8"),
        (8, "16", "lists [16], outside 1 to the max_batch_size 8"),
        (0, "1,2", "needs a batching model"),
    ],
)
def test_bad_lists_are_refused_naming_the_parameter(tmp_path: Path, max_batch_size: int, value: str, says: str) -> None:
    text = (f'name: "m" max_batch_size: {max_batch_size} '
            f'parameters {{ key: "cuda_batch_buckets" value {{ string_value: "{value}" }} }}')
    with pytest.raises(InvalidArgument, match="cuda_batch_buckets") as caught:
        bucket_sizes(config(text), write(tmp_path, conv_model_bytes()), on_gpu=True)
    assert says in str(caught.value)


def test_padding_fills_zeros_after_the_rows_and_cutting_takes_them_back() -> None:
    pool = BufferPool()
    leases: list = []
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    names = np.array([b"a", b"b", b"c"], dtype=object)
    padded = padded_feeds({"X": x, "S": names}, 3, 4, pool, leases)
    assert padded["X"].shape == (4, 4) and padded["S"].shape == (4,)
    np.testing.assert_array_equal(padded["X"][:3], x)
    assert not padded["X"][3].any() and padded["S"][3] == b""
    assert len(leases) == 1  # strings are references, not pooled bytes
    out = np.ones((4, 2))
    unbatched = np.ones(5)
    cut = cut_rows([out, unbatched], 3, 4)
    assert cut[0].shape == (3, 2) and np.shares_memory(cut[0], out)
    assert cut[1].shape == (5,)  # dim 0 is not the padded batch: left as it is
    assert [smallest_fit((2, 4, 8), rows) for rows in (1, 2, 3, 8, 9)] == [2, 2, 4, 8, 9]


def load_conv(tmp_path: Path, max_batch_size: int, sizes: str) -> OnnxBackend:
    """The convolution model loaded as the repository loads it, with ``cuda_batch_buckets`` set to ``sizes``."""
    version = tmp_path / "1"
    version.mkdir()
    base = config(
        f'name: "conv" platform: "onnxruntime_onnx" max_batch_size: {max_batch_size} '
        f'parameters {{ key: "cuda_batch_buckets" value {{ string_value: "{sizes}" }} }}'
    )
    _, (backend,) = KIND.load("conv", 1, write(version, conv_model_bytes()), base, RepositoryOptions())
    return backend


def test_loaded_model_runs_each_batch_on_its_sizes_session(tmp_path: Path) -> None:
    backend = load_conv(tmp_path, max_batch_size=8, sizes="2,4")
    sessions = {size: sibling.session for size, sibling in backend._bucket_backends.items()}
    assert sorted(sessions) == [2, 4, 8] and sessions[8] is backend.session
    assert len({id(session) for session in sessions.values()}) == 3  # one session per size
    rng = np.random.default_rng(0)
    for rows in (1, 2, 3, 5, 8):
        x = rng.random((rows, 2, 4, 4), dtype=np.float32)
        (out,) = backend.run({"INPUT0": x}, ["OUTPUT0"])
        assert out.shape == (rows, 3, 4, 4)
        np.testing.assert_allclose(out, expected_conv(x), rtol=1e-5)
    pool = backend._pad_pool
    assert pool is not None and pool.idle() == 1  # the lease came back (the buffer grew to the largest padding)
    siblings = list(backend._bucket_backends.values())
    backend.close()
    assert all(sibling.session is None for sibling in siblings)


def test_a_batch_of_a_bucket_size_still_writes_outputs_in_place(tmp_path: Path) -> None:
    backend = load_conv(tmp_path, max_batch_size=4, sizes="2")
    destination = np.zeros(2 * 3 * 16 * 4, dtype=np.uint8)
    x = np.ones((2, 2, 4, 4), dtype=np.float32)
    for _ in range(2):  # the first run learns the output shape, the second binds it
        (out,) = backend.run({"INPUT0": x}, ["OUTPUT0"], destinations={"OUTPUT0": destination})
    assert np.shares_memory(out, destination)
    np.testing.assert_allclose(out, expected_conv(x))


def test_ragged_batching_never_gets_buckets(tmp_path: Path) -> None:
    ragged = (
        'name: "m" max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] '
        "allow_ragged_batch: true } ]"
    )
    path = write(tmp_path, conv_model_bytes())
    assert bucket_sizes(config(ragged), path, on_gpu=True) == ()
    listed = ragged + ' parameters { key: "cuda_batch_buckets" value { string_value: "2,4" } }'
    with pytest.raises(InvalidArgument, match="ragged batching"):
        bucket_sizes(config(listed), path, on_gpu=True)
    batch_input = 'name: "m" max_batch_size: 8 batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" } ]'
    assert bucket_sizes(config(batch_input), path, on_gpu=True) == ()

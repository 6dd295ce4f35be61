"""Triton's ragged batching on ONNX models, in-process: ragged inputs, every batch input kind and the
scatter batch output, with the values Triton's backend computes (cf. Triton's QA L0_batch_input)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from fastoip.core import Core
from fastoip.types import InferInput, InferRequest, InferResponse
from harness import core_on
from models import (
    RAGGED_IO_CONFIG,
    identity_model_bytes,
    ragged_batch_config,
    ragged_batch_model_bytes,
    ragged_io_model_bytes,
    write_model,
)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    root = tmp_path_factory.mktemp("repo")
    write_model(root, "ragged_batch", ragged_batch_model_bytes(), config=ragged_batch_config())
    write_model(root, "ragged_io", ragged_io_model_bytes(), config=RAGGED_IO_CONFIG)
    with core_on(root) as running:
        yield running


def _request(model: str, name: str, shape: tuple[int, ...]) -> InferRequest:
    # the values are the request's element count along its last dim, as Triton's QA sends them
    data = np.full(shape, shape[-1], np.float32)
    return InferRequest(model, inputs=[InferInput(name, "FP32", shape, data)])


def _together(core: Core, requests: list[InferRequest]) -> list[InferResponse]:
    """Send ``requests`` at once (the batcher holds them until its preferred batch is there)."""

    async def main() -> list[InferResponse]:
        return list(await asyncio.wait_for(asyncio.gather(*(core.infer_async(r) for r in requests)), 60))

    return asyncio.run(main())


def _out(response: InferResponse, name: str) -> np.ndarray:
    data = response.output(name).data
    assert data is not None
    return np.asarray(data)


def test_every_batch_input_kind_over_requests_of_one_item(core: Core) -> None:
    shapes = [(1, 1, 2), (1, 1, 4), (1, 1, 1), (1, 1, 3)]
    responses = _together(core, [_request("ragged_batch", "RAGGED_INPUT", shape) for shape in shapes])
    flat = np.concatenate([np.full(shape[-1], shape[-1], np.float32) for shape in shapes])
    for index, response in enumerate(responses):
        # every request sees the whole execution's values (the model repeats them once per batch item)
        np.testing.assert_array_equal(_out(response, "RAGGED_INPUT_OUT"), [flat])  # flat, one request after another
        np.testing.assert_array_equal(_out(response, "COUNT_OUT"), [[2, 4, 1, 3]])
        np.testing.assert_array_equal(_out(response, "ACCUMULATED_OUT"), [[2, 6, 7, 10]])
        np.testing.assert_array_equal(_out(response, "ACCUMULATED_WITH_ZERO_OUT"), [[0, 2, 6, 7, 10]])
        assert _out(response, "MAX_AS_SHAPE_OUT").shape == (1, 4)  # the largest element count, as a shape
        np.testing.assert_array_equal(_out(response, "ITEM_SHAPE_FLATTEN_OUT"), [[1, 2, 1, 4, 1, 1, 1, 3]])
        np.testing.assert_array_equal(_out(response, "ITEM_SHAPE_OUT"), [shapes[index][1:]])  # its own row


def test_batch_item_shapes_repeat_for_each_item_of_a_request(core: Core) -> None:
    # Triton's QA test_batch_item_shape: a request of batch size 2 gives two equal rows
    shapes = [(2, 1, 2), (1, 1, 2), (1, 2, 2)]
    responses = _together(core, [_request("ragged_batch", "RAGGED_INPUT", shape) for shape in shapes])
    np.testing.assert_array_equal(_out(responses[0], "ITEM_SHAPE_OUT"), [[1, 2], [1, 2]])
    np.testing.assert_array_equal(_out(responses[1], "ITEM_SHAPE_OUT"), [[1, 2]])
    np.testing.assert_array_equal(_out(responses[2], "ITEM_SHAPE_OUT"), [[2, 2]])
    flatten = [[1, 2, 1, 2, 1, 2, 2, 2]]
    np.testing.assert_array_equal(_out(responses[0], "ITEM_SHAPE_FLATTEN_OUT"), flatten * 2)
    np.testing.assert_array_equal(_out(responses[2], "ITEM_SHAPE_FLATTEN_OUT"), flatten)
    np.testing.assert_array_equal(_out(responses[1], "COUNT_OUT"), [[4, 2, 4]])  # whole shapes, batch dim included
    np.testing.assert_array_equal(_out(responses[1], "ACCUMULATED_WITH_ZERO_OUT"), [[0, 4, 6, 10]])


def test_a_request_alone_gets_its_own_batch_inputs(core: Core) -> None:
    (response,) = _together(core, [_request("ragged_batch", "RAGGED_INPUT", (4, 1, 3))])
    np.testing.assert_array_equal(_out(response, "COUNT_OUT"), [[12]] * 4)
    np.testing.assert_array_equal(_out(response, "ITEM_SHAPE_OUT"), [[1, 3]] * 4)
    assert _out(response, "MAX_AS_SHAPE_OUT").shape == (4, 12)


def test_scatter_batch_output_takes_each_request_its_input_shape(core: Core) -> None:
    # Triton's QA test_ragged_output: a flat identity, each response shaped as its own input
    lengths = [2, 4, 1, 3]
    responses = _together(core, [_request("ragged_io", "INPUT0", (1, n)) for n in lengths])
    for n, response in zip(lengths, responses, strict=True):
        output = response.output("OUTPUT0")
        assert tuple(output.shape) == (1, n)
        np.testing.assert_array_equal(_out(response, "OUTPUT0"), np.full((1, n), n, np.float32))
    statistics = core.statistics("ragged_io")
    assert any(stat.batch_size == 4 for entry in statistics for stat in entry.batch_stats), statistics


def _load_errors(root: Path) -> dict[str, str]:
    with core_on(root) as running:
        return {entry.name: entry.reason for entry in running.repository_index() if entry.state != "READY"}


def test_wiring_the_model_cannot_take_is_refused_at_load(tmp_path: Path) -> None:
    # a batch input whose target the model does not have
    config = RAGGED_IO_CONFIG.replace(
        "batch_output", 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "NOPE" data_type: TYPE_INT32 '
        'source_input: "INPUT0" } ]\nbatch_output'
    )
    write_model(tmp_path, "no_target", ragged_io_model_bytes(), config=config)
    # a ragged input the model does not take flat
    flat_config = (
        "max_batch_size: 8\n"
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    write_model(tmp_path, "not_flat", identity_model_bytes(TensorProto.FLOAT, [4]), config=flat_config)
    errors = _load_errors(tmp_path)
    assert "batch input target 'NOPE' is not an input of the model" in errors["no_target"]
    assert "expects model provides input with shape [-1] for ragged input 'INPUT0'" in errors["not_flat"]

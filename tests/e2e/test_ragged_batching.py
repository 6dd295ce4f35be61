"""Triton's ragged batching over real gRPC, as Triton's QA L0_batch_input drives it: tritonclient streams
requests of different lengths to a fastoip process; the batcher runs them as one execution, and each response
shows the batch inputs of that execution or its own part of the scatter batch output."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from models import RAGGED_IO_CONFIG, ragged_batch_config, ragged_batch_model_bytes, ragged_io_model_bytes, write_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, grpc_frontend: str):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("ragged")
    write_model(root, "ragged_batch", ragged_batch_model_bytes(), config=ragged_batch_config())
    write_model(root, "ragged_io", ragged_io_model_bytes(), config=RAGGED_IO_CONFIG)
    with ServerProcess(root, grpc_frontend=grpc_frontend) as proc:
        yield proc


def _stream(server: ServerProcess, model: str, name: str, shapes: list[tuple[int, ...]], output: str) -> list:
    """Send one request per shape on one stream (values: the shape's last dim); the answers, in order."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index, shape in enumerate(shapes):
            tensor = grpcclient.InferInput(name, list(shape), "FP32")
            tensor.set_data_from_numpy(np.full(shape, shape[-1], np.float32))
            client.async_stream_infer(model, [tensor], request_id=str(index),
                                      outputs=[grpcclient.InferRequestedOutput(output)])
        results = {}
        for _ in shapes:
            result, error = answers.get(timeout=60)
            assert error is None, error
            results[int(result.get_response().id)] = result.as_numpy(output)
    finally:
        client.stop_stream()
        client.close()
    return [results[index] for index in range(len(shapes))]


def test_scatter_output_gives_each_request_its_own_shape(server: ServerProcess) -> None:
    lengths = [2, 4, 1, 3]
    outputs = _stream(server, "ragged_io", "INPUT0", [(1, n) for n in lengths], "OUTPUT0")
    for n, output in zip(lengths, outputs, strict=True):
        np.testing.assert_array_equal(output, np.full((1, n), n, np.float32))


def test_batch_inputs_of_one_execution_reach_every_request(server: ServerProcess) -> None:
    shapes = [(1, 1, 2), (1, 1, 4), (1, 1, 1), (1, 1, 3)]
    for output, expected in (("ACCUMULATED_WITH_ZERO_OUT", [[0, 2, 6, 7, 10]]), ("COUNT_OUT", [[2, 4, 1, 3]])):
        for answer in _stream(server, "ragged_batch", "RAGGED_INPUT", shapes, output):
            np.testing.assert_array_equal(answer, expected)

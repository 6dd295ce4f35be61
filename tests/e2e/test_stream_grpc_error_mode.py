"""Triton's ``triton_grpc_error`` stream mode (issue 41; Triton's lifecycle tests read it): a ModelStreamInfer
whose client sent the header ``triton_grpc_error: true`` ends with the first error's gRPC status (its code and
message) instead of an ``error_message`` in the stream, and sends nothing after; without the header the stream goes
on past errors. Before, fastoip ignored the header: the client read an error message and the stream stayed open."""

from __future__ import annotations

import queue
import textwrap
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

# Fails every second request with INTERNAL, as Triton's execute_grpc_error model does.
EVERY_SECOND = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        out = []
        for request in requests:
            self.seen += 1
            if self.seen % 2 == 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("second request fails")))
            else:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"grpc_error_{request.param}")
    (root / "every_second" / "1").mkdir(parents=True)
    (root / "every_second" / "1" / "model.py").write_text(textwrap.dedent(EVERY_SECOND))
    (root / "every_second" / "config.pbtxt").write_text(CONFIG)
    with ServerProcess(root, grpc_frontend=request.param) as proc:
        yield proc


def _stream(server: ServerProcess, headers: dict[str, str] | None, count: int) -> list[object]:
    results: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results), headers=headers)
    got: list[object] = []
    try:
        for _ in range(count):
            x = grpcclient.InferInput("IN", [2], "FP32")
            x.set_data_from_numpy(np.ones(2, dtype=np.float32))
            try:
                client.async_stream_infer("every_second", [x])
            except InferenceServerException:  # the stream already ended: nothing more is sent
                break
            got.append(results.get(timeout=30))
            if isinstance(got[-1], InferenceServerException) and headers:
                break
        try:  # anything more on the stream would arrive now
            got.append(results.get(timeout=1))
        except queue.Empty:
            pass
    finally:
        client.stop_stream()
        client.close()
    return got


def test_the_header_ends_the_stream_with_the_error_status(server: ServerProcess) -> None:
    got = _stream(server, {"triton_grpc_error": "true"}, 4)
    # at most one answer (the model's count goes on across tests), then the error as the stream's status, and
    # nothing after it
    error = got[-1]
    assert len(got) <= 2 and not any(isinstance(g, InferenceServerException) for g in got[:-1]), got
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.INTERNAL" and "second request fails" in error.message()
    # the server is still up and serving other streams
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()


def test_without_the_header_the_stream_goes_on_past_errors(server: ServerProcess) -> None:
    got = _stream(server, None, 4)
    assert len(got) == 4
    errors = [g for g in got if isinstance(g, InferenceServerException)]
    assert len(errors) == 2 and all("second request fails" in e.message() for e in errors)
    # an error in the stream's messages, not the stream's status
    assert all(e.status() is None for e in errors)

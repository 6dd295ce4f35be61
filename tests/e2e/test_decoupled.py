"""Decoupled Python models (``model_transaction_policy { decoupled: true }``) over real sockets.

A real fastoip serves decoupled models whose ``predict`` is a generator or an
async generator; tritonclient's gRPC streaming API reads 0, 1 and 1,000
responses with Triton's ``triton_final_response`` parameter and the empty final
response it asks for (``enable_empty_final_response``), on both gRPC frontends.
Unary ModelInfer and HTTP infer to a decoupled model answer Triton's refusal.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastoip._proto import grpc_service_pb2 as pb
from python_models import ASYNC_COUNTER, COUNTER, COUNTER_CONFIG, PLAIN, WORDS, WORDS_CONFIG, write_python_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

def decoupled_repository(root: Path) -> Path:
    write_python_model(root, "plain", PLAIN, COUNTER_CONFIG.replace("model_transaction_policy { decoupled: true }", ""))
    write_python_model(root, "counter", COUNTER, COUNTER_CONFIG)
    write_python_model(root, "async_counter", ASYNC_COUNTER, COUNTER_CONFIG)
    write_python_model(root, "words", WORDS, WORDS_CONFIG)
    return root


@pytest.fixture(scope="module")
def decoupled_server(tmp_path_factory: pytest.TempPathFactory, grpc_frontend: str) -> Iterator[ServerProcess]:
    repository = decoupled_repository(tmp_path_factory.mktemp("decoupled"))
    with ServerProcess(repository, http=True, grpc_frontend=grpc_frontend) as server:
        yield server


def count_input(n: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return tensor


class Stream:
    """tritonclient's streaming API; ``read`` takes what came for one request up to its final flag."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, n: int, request_id: str, empty_final: bool = True, **parameters: Any) -> None:
        self.client.async_stream_infer(
            model, [count_input(n)], request_id=request_id, enable_empty_final_response=empty_final,
            parameters=parameters or None,
        )

    def read(self, timeout: float = 60.0) -> list[tuple[Any, Any]]:
        """Results (result, error) up to and including the first one flagged final."""
        got = []
        while True:
            result, error = self.results.get(timeout=timeout)
            got.append((result, error))
            if error is not None:
                return got
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture()
def stream(decoupled_server: ServerProcess) -> Iterator[Stream]:
    opened = Stream(decoupled_server.grpc_url)
    yield opened
    opened.close()


def indices(results: list[tuple[Any, Any]]) -> list[int]:
    return [int(result.as_numpy("INDEX")[0]) for result, _ in results if result.get_response().outputs]


@pytest.mark.parametrize("model", ["counter", "async_counter"])
@pytest.mark.parametrize("count", [0, 1, 1000])
def test_every_response_streams_then_an_empty_final_one(stream: Stream, model: str, count: int) -> None:
    stream.send(model, count, f"r{count}")
    got = stream.read()
    assert all(error is None for _, error in got)
    responses = [result.get_response() for result, _ in got]
    assert len(responses) == count + 1
    assert indices(got) == list(range(count))
    for response in responses[:-1]:  # each as it was produced: not final
        assert response.parameters["triton_final_response"].bool_param is False
        assert response.id == f"r{count}" and response.model_name == model
    final = responses[-1]  # the final flag alone: an empty response, as Triton sends it
    assert final.parameters["triton_final_response"].bool_param is True
    assert not final.outputs and final.id == f"r{count}" and final.model_name == model
    # the parameter is Triton's: the model never saw it, and it is not echoed back
    assert "triton_enable_empty_final_response" not in final.parameters


def test_without_the_flag_the_final_flag_sends_nothing(stream: Stream) -> None:
    stream.send("counter", 3, "quiet", empty_final=False)
    stream.send("counter", 1, "marker", empty_final=True)  # the same stream still answers afterwards
    got = []
    while len(got) < 5:
        got.append(stream.results.get(timeout=60))
    assert all(error is None for _, error in got)
    responses = [result.get_response() for result, _ in got]
    quiet = [r for r in responses if r.id == "quiet"]
    assert len(quiet) == 3 and all(not r.parameters["triton_final_response"].bool_param for r in quiet)
    marker = [r for r in responses if r.id == "marker"]
    assert [r.parameters["triton_final_response"].bool_param for r in marker] == [False, True]
    assert stream.results.empty()


def test_requests_on_one_stream_interleave_and_each_ends_once(stream: Stream) -> None:
    for index in range(8):
        stream.send("async_counter", 50, f"s{index}")
    finals: dict[str, int] = {}
    counts: dict[str, int] = {}
    while len(finals) < 8:
        result, error = stream.results.get(timeout=60)
        assert error is None
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals[response.id] = finals.get(response.id, 0) + 1
        else:
            counts[response.id] = counts.get(response.id, 0) + 1
    assert counts == {f"s{i}": 50 for i in range(8)} and set(finals.values()) == {1}


def test_an_error_mid_stream_is_the_final_response(stream: Stream) -> None:
    stream.send("counter", 10, "broken", fail_at=3)
    got = stream.read()
    assert indices(got[:-1]) == [0, 1, 2]
    _, error = got[-1]
    assert error is not None and "no response 3" in str(error)
    stream.send("counter", 2, "after")  # the stream goes on
    assert indices(stream.read()) == [0, 1]


def test_a_bad_empty_final_flag_is_refused(decoupled_server: ServerProcess) -> None:
    # tritonclient will not send the reserved parameter itself: the raw protobuf does
    request = pb.ModelInferRequest(model_name="counter", id="bad-flag")
    request.parameters["triton_enable_empty_final_response"].string_param = "yes"
    tensor = request.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    with grpc.insecure_channel(decoupled_server.grpc_url) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        answers = list(call(iter([request]), timeout=60))
    assert len(answers) == 1
    assert answers[0].error_message == (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    )
    assert answers[0].infer_response.id == "bad-flag"


def test_unary_infer_to_a_decoupled_model_answers_tritons_refusal(decoupled_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(decoupled_server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("counter", [count_input(2)])
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in refused.value.message()
    client.close()

    http = httpclient.InferenceServerClient(decoupled_server.http_url)
    tensor = httpclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as refused_http:
        http.infer("counter", [tensor])
    assert refused_http.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in refused_http.value.message()
    http.close()


def test_statistics_count_one_inference_per_request(decoupled_server: ServerProcess, stream: Stream) -> None:
    client = grpcclient.InferenceServerClient(decoupled_server.grpc_url)
    before = client.get_inference_statistics("async_counter", as_json=True)["model_stats"][0]
    for index in range(3):
        stream.send("async_counter", 20, f"stat{index}")
        stream.read()
    after = client.get_inference_statistics("async_counter", as_json=True)["model_stats"][0]
    client.close()
    success = int(after["inference_stats"]["success"]["count"]) - int(
        before["inference_stats"]["success"].get("count", 0)
    )
    assert success == 3
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == 3


def test_a_stream_the_client_cancels_stops_the_generator(decoupled_server: ServerProcess) -> None:
    endless = Stream(decoupled_server.grpc_url)
    endless.send("counter", 1_000_000, "endless", delay=0.01)  # hours, unless the cancel stops it
    for _ in range(3):
        result, error = endless.results.get(timeout=60)
        assert error is None and not result.get_response().parameters["triton_final_response"].bool_param
    endless.client.stop_stream(cancel_requests=True)
    endless.client.close()
    # counter has one instance: it serves another request only once the cancelled generator has stopped
    after = Stream(decoupled_server.grpc_url)
    try:
        after.send("counter", 2, "next")
        assert indices(after.read(timeout=30)) == [0, 1]
    finally:
        after.close()


def test_an_ordinary_model_on_the_stream_answers_once_whatever_the_flag(stream: Stream) -> None:
    for index in range(3):
        stream.send("plain", 7, f"plain{index}", empty_final=True)
    got = [stream.results.get(timeout=60) for _ in range(3)]
    assert all(error is None for _, error in got)
    assert sorted(result.get_response().id for result, _ in got) == ["plain0", "plain1", "plain2"]
    assert [int(result.as_numpy("INDEX")[0]) for result, _ in got] == [7, 7, 7]
    stream.send("counter", 1, "then")  # a decoupled request after them ends with its own empty final response
    assert indices(stream.read()) == [0]
    assert stream.results.empty()

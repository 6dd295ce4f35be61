"""Stateful models end to end: Triton's sequence batcher with control inputs and implicit state, over tritonclient.

The ONNX stand-in for Triton's ``simple_sequence`` accumulates: OUTPUT = INPUT + STATE_IN * (1 - START) * READY,
STATE_OUT = OUTPUT (fed back by the server), CORRID_OUT = CORRID.  Its answers show the state carried per
sequence, reset at START, kept apart between interleaved sequences, and the control values the server fed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from models import IMPLICIT_STATE_SEQUENCE_CONFIG, implicit_state_sequence_model_bytes
from serverproc import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequences")
    (root / "seq" / "1").mkdir(parents=True)
    (root / "seq" / "1" / "model.onnx").write_bytes(implicit_state_sequence_model_bytes())
    (root / "seq" / "config.pbtxt").write_text(IMPLICIT_STATE_SEQUENCE_CONFIG)
    # a direct queue delay without minimum_slot_utilization: Triton runs each batch at once, the delay unused
    (root / "seq_delay" / "1").mkdir(parents=True)
    (root / "seq_delay" / "1" / "model.onnx").write_bytes(implicit_state_sequence_model_bytes())
    (root / "seq_delay" / "config.pbtxt").write_text(IMPLICIT_STATE_SEQUENCE_CONFIG.replace(
        "sequence_batching {", "sequence_batching {\n  direct { max_queue_delay_microseconds: 3000000 }"))
    with ServerProcess(root, http=True) as proc:
        yield proc


def value(x: int) -> np.ndarray:
    return np.array([[x]], dtype=np.int32)


def grpc_step(client: grpcclient.InferenceServerClient, x: int, sequence_id: int, start: bool = False,
              end: bool = False) -> tuple[int, int]:
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(value(x))
    result = client.infer("seq", [inp], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    assert {o.name for o in result.get_response().outputs} == {"OUTPUT", "CORRID_OUT"}  # no state output
    return int(result.as_numpy("OUTPUT")[0, 0]), int(result.as_numpy("CORRID_OUT")[0, 0])


def test_interleaved_sequences_keep_their_own_state_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("seq")
    assert grpc_step(client, 1, 1001, start=True) == (1, 1001)
    assert grpc_step(client, 10, 1002, start=True) == (10, 1002)
    assert grpc_step(client, 2, 1001) == (3, 1001)
    assert grpc_step(client, 20, 1002) == (30, 1002)
    assert grpc_step(client, 3, 1001, end=True) == (6, 1001)
    assert grpc_step(client, 30, 1002, end=True) == (60, 1002)
    # the id is free again: a new sequence starts from the initial (zero) state
    assert grpc_step(client, 5, 1001, start=True, end=True) == (5, 1001)


def test_a_direct_queue_delay_without_minimum_slot_utilization_does_not_hold_a_lone_sequence(
        server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    started = time.monotonic()
    for x, flags in ((1, {"sequence_start": True}), (2, {}), (3, {"sequence_end": True})):
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(value(x))
        result = client.infer("seq_delay", [inp], sequence_id=77, **flags)
    assert int(result.as_numpy("OUTPUT")[0, 0]) == 6
    assert time.monotonic() - started < 2.5  # held for the 3 s delay, one request alone would take longer


def test_a_sequence_over_http_and_the_stream(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    totals = []
    for i, x in enumerate([4, 5, 6]):
        inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(value(x))
        result = http.infer("seq", [inp], sequence_id=77, sequence_start=i == 0, sequence_end=i == 2)
        totals.append(int(result.as_numpy("OUTPUT")[0, 0]))
    assert totals == [4, 9, 15]

    import queue

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, x in enumerate([7, 8, 9]):
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(value(x))
            client.async_stream_infer("seq", [inp], sequence_id=88, sequence_start=i == 0, sequence_end=i == 2)
        got = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("OUTPUT")[0, 0]))
    finally:
        client.stop_stream()
    assert got == [7, 15, 24]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 4242}, "must specify the START flag on the first request of the sequence"),
    ],
)
def test_requests_outside_a_sequence_get_tritons_errors(server: ServerProcess, kwargs: dict, message: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(value(1))
    with pytest.raises(InferenceServerException) as err:
        client.infer("seq", [inp], **kwargs)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in err.value.message()
    assert grpc_step(client, 1, 5, start=True, end=True) == (1, 5)  # and the model still serves


def test_the_config_shows_the_sequence_batcher_and_no_injected_inputs(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("seq").config
    assert config.HasField("sequence_batching") and not config.HasField("dynamic_batching")
    assert [t.name for t in config.input] == ["INPUT"]
    metadata = client.get_model_metadata("seq")
    assert [t.name for t in metadata.inputs] == ["INPUT"]

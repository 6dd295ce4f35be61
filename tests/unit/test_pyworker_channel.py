"""The typed records between the server and a worker: every kind round-trips; what a worker sends is checked,
and no frame it writes can run code in the server (no pickle)."""

from __future__ import annotations

import pickle
from pathlib import Path

import msgpack
import numpy as np
import pytest

from fastoip.pyworker import channel as msg

EXAMPLES = [
    msg.Load("/m/model.py", "m", 1, 0),
    msg.LoadMLServer({"name": "m", "document": {"a": [1, 2]}}, 64),
    msg.AutoComplete({"name": "m", "input": []}),
    msg.Initialize({"model_config": "{}"}, True),
    msg.Execute(7, [["r", 0, 0, {"p": 1}, [["IN", "FP32", ["b", b"\0" * 4, "<f4", [1]]]], ["OUT"], None]]),
    msg.Reply(3, [[], None, {}], None),
    msg.Reply(3, None, "it failed"),
    msg.StreamPart(3, None, True),
    msg.Finalize(),
    msg.Done({"completed": True}),
    msg.Failed("the model's words"),
    msg.Result(7, None, "boom", []),
    msg.Result(7, [None, [[], None, {}]], None, [0]),
    msg.Send(7, 0, [[], [2, "bad"], {}], False),
    msg.InferCall(4, "other", -1, ["", 0, 0, {}, [], [], None], 0, False),
    msg.CancelStream(4),
    msg.CancelledQuery(5, 7, 0),
    msg.ReadyQuery(6, "other", ""),
    msg.LoadModel(8, "other", "", {"file:1/model.onnx": b"\x01\x02"}),
    msg.UnloadModel(9, "other", False),
    msg.MetricUpdate(0, {"name": "x", "kind": 0}, {"k": "v"}, "increment", 1.0),
    msg.Log(20, "hello"),
    msg.RingBell(),
    msg.ReadinessCheck(),
    msg.Readiness(True, False, "is_ready() must return a boolean value"),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_crosses_as_itself(record: tuple) -> None:
    allowed = next(side for side in (msg.TO_WORKER, msg.TO_SERVER, msg.READINESS_TO_WORKER, msg.READINESS_TO_SERVER)
                   if type(record) in side)
    assert msg.decode(msg.encode(record), allowed) == record


def test_each_side_reads_only_its_own_records() -> None:
    with pytest.raises(msg.ProtocolError, match="misdirected"):
        msg.decode(msg.encode(msg.Execute(1, [])), msg.TO_SERVER)  # a worker cannot send the server a batch
    with pytest.raises(msg.ProtocolError, match="misdirected"):
        msg.decode(msg.encode(msg.Result(1, None, None, [])), msg.TO_WORKER)
    with pytest.raises(msg.ProtocolError, match="misdirected"):
        msg.decode(msg.encode(msg.Result(1, None, None, [])), msg.READINESS_TO_SERVER)  # not on that socket


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.touch, (marker,))

    with pytest.raises(msg.ProtocolError):
        msg.decode(pickle.dumps(("result", 1, Exploit(), None)), msg.TO_SERVER)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ([], "tagged record"),
        (["result", 1], "tagged record"),
        ([999], "unknown"),
        ([msg._TAGS[msg.Result], 1, None], "4 fields"),
        ([msg._TAGS[msg.Result], "1", None, None, []], "field is a str"),
        ([msg._TAGS[msg.Result], True, None, None, []], "field is a bool"),
        ([msg._TAGS[msg.Result], 1, None, None, None], "field is a NoneType"),  # rescheduled: a list
        ([msg._TAGS[msg.Log], 10, b"bytes"], "field is a bytes"),
        ([msg._TAGS[msg.Many], [[msg._TAGS[msg.Log], 10, "x"]]], "misdirected"),  # Many goes only to a worker
        ({"a": 1}, "tagged record"),
    ],
)
def test_a_forged_record_is_refused(raw: object, says: str) -> None:
    with pytest.raises(msg.ProtocolError, match=says):
        msg.decode(msgpack.packb(raw), msg.TO_SERVER)


def test_bytes_that_are_not_msgpack_are_refused() -> None:
    with pytest.raises(msg.ProtocolError, match="not a record"):
        msg.decode(b"\xc1\xc1\xc1", msg.TO_SERVER)


def test_numpy_scalars_cross_as_numbers_and_objects_are_refused_when_sent() -> None:
    record = msg.decode(msg.encode(msg.Done({"n": np.int64(3), "x": np.float32(0.5)})), msg.TO_SERVER)
    assert record == msg.Done({"n": 3, "x": 0.5})
    with pytest.raises(TypeError, match="plain data only"):
        msg.encode(msg.Done({"f": object()}))


def test_a_request_is_a_typed_record() -> None:
    request = msg.request_of(["id", 0, 0, {}, [], ["OUT"], None])
    assert request.request_id == "id" and request.requested == ["OUT"]
    with pytest.raises(msg.ProtocolError):
        msg.request_of(["id", 0, "flags", {}, [], [], None])

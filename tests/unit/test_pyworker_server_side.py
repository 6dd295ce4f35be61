"""The server's side of a Python worker's channel (``WorkerProcess``) driven by a fake worker, without
a server (issue 36): the fake writes with the real channel encoder (or writes what the encoder never would) on
the child's end of the socket pair the server side made, and reads what the server side answers.  The process the
server side watches is a real one (``sleep``: its exit is noticed by its pidfd); nothing else runs.

What a worker may not send ends it, with the cause logged and given to ``on_death``: a frame that is not a
record (a pickle), an unknown tag, a record only the server sends, a field of the wrong type, a 4 GiB length, a
ring record that is not a result.  What is bad but allowed (a metric's invalid name, a BLS call to a model the
Core does not know, a cancellation query for a request that does not exist) is answered with an error or False,
and the channel lives on."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from fastoip.backends.python.hosting.worker_process import WorkerDied, WorkerProcess
from fastoip.backends.python.triton import server_bridge
from fastoip.core import Core
from fastoip.pyworker import channel as msg
from fastoip.pyworker._ring import ResultRing
from fastoip.pyworker.framing import FramedSocket

WAIT_S = 15.0


class FakeWorker:
    """The child's end of the channel, in the test's hands, and a real process for the server side to watch."""

    def __init__(self) -> None:
        self.end: FramedSocket | None = None
        self.ring: ResultRing | None = None
        self.process: subprocess.Popen | None = None

    def spawn(self, child: socket.socket, fds: list[int], env: dict[str, str]) -> subprocess.Popen:
        """``fds``: the readiness socket's end, then the result ring's descriptor if there is one."""
        self.end = FramedSocket(socket.socket(fileno=os.dup(child.fileno())))
        if len(fds) > 1:
            self.ring = ResultRing(os.dup(fds[1]))
        self.process = subprocess.Popen(["sleep", "600"])
        return self.process

    def send(self, record: tuple) -> None:
        assert self.end is not None
        self.end.send_bytes(msg.encode(record))

    def send_raw(self, payload: bytes) -> None:
        assert self.end is not None
        self.end.send_bytes(payload)

    def read(self) -> tuple:
        """The next record the server side sent (a Many's first)."""
        assert self.end is not None
        record = msg.decode(self.end.recv_bytes(), msg.TO_WORKER)
        return record.records[0] if type(record) is msg.Many else record


class Deaths:
    def __init__(self) -> None:
        self.causes: list[str] = []
        self.event = threading.Event()

    def __call__(self, cause: str) -> None:
        self.causes.append(cause)
        self.event.set()


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    core = Core(tmp_path)
    try:
        yield core
    finally:
        core.close()


@pytest.fixture
def channel(core: Core) -> Iterator[tuple[WorkerProcess, FakeWorker, Deaths, list]]:
    fake, deaths, results = FakeWorker(), Deaths(), []
    assert core.server_link is not None
    link = server_bridge.link_of(core.repository.options)
    worker = WorkerProcess(
        "model 'fake' instance 0", lambda *sent: results.append(("send", *sent)), deaths,
        lambda exec_id, index: False, link,
        lambda exec_id, responses, error, rescheduled: results.append(("result", exec_id, responses, error)),
        model="fake", spawn=fake.spawn,
    )
    assert fake.end is not None
    fake.end._sock.settimeout(WAIT_S)  # (a read the server side never answers fails the test, it does not hang)
    try:
        yield worker, fake, deaths, results
    finally:
        if fake.process is not None and fake.process.poll() is None:
            fake.process.kill()
        worker.kill()


def _control_round_trip(worker: WorkerProcess, fake: FakeWorker) -> None:
    """A control message answered by the fake: the channel works both ways."""
    answer: list[object] = []
    asking = threading.Thread(target=lambda: answer.append(worker.control(msg.AutoComplete({"x": 1}), WAIT_S)))
    asking.start()
    assert fake.read() == msg.AutoComplete({"x": 1})
    fake.send(msg.Done({"completed": True}))
    asking.join(WAIT_S)
    assert answer == [{"completed": True}]


def _ended(worker: WorkerProcess, deaths: Deaths, says: str) -> None:
    assert deaths.event.wait(WAIT_S), "the server side did not end the lying worker"
    (cause,) = deaths.causes
    assert "broke the channel's protocol" in cause and says in cause, cause
    assert worker.cause == cause and not worker.alive
    with pytest.raises(WorkerDied):
        worker.control(msg.Finalize(), 1.0)


def test_a_well_behaved_fake_is_answered_and_its_results_dispatched(channel) -> None:  # type: ignore[no-untyped-def]
    worker, fake, deaths, results = channel
    _control_round_trip(worker, fake)
    fake.send(msg.Result(7, None, "the model's own error", []))
    fake.send(msg.Send(8, 0, None, True))
    fake.send(msg.Log(30, "hello"))
    _control_round_trip(worker, fake)  # (answered after the records before it were dispatched)
    assert results == [("result", 7, None, "the model's own error"), ("send", 8, 0, None, True)]
    assert worker.alive and not deaths.causes


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (pickle.dumps(("result", 1, None, None)), "a frame that is not a record"),
        (msgpack.packb([99, 1, 2]), "unknown or misdirected record tag 99"),
        (msg.encode(msg.Execute(1, [])), "unknown or misdirected record tag"),  # only the server sends batches
        (msgpack.packb([msg._TAGS[msg.Send], 1, "0", None, True]), "a Send field is a str"),
        (msgpack.packb([msg._TAGS[msg.Result], 1, None]), "a Result has 4 fields, not 2"),
        (b"", "a frame that is not a record"),
    ],
    ids=["pickle", "unknown-tag", "misdirected", "wrong-field-type", "wrong-arity", "empty"],
)
def test_a_frame_that_is_not_a_record_ends_the_worker(channel, payload: bytes, says: str) -> None:  # type: ignore[no-untyped-def]
    worker, fake, deaths, results = channel
    _control_round_trip(worker, fake)
    fake.send_raw(payload)
    _ended(worker, deaths, says)
    assert results == []  # nothing of it was dispatched


def test_a_4_gib_length_ends_the_worker_without_waiting_for_the_bytes(channel) -> None:  # type: ignore[no-untyped-def]
    worker, fake, deaths, _ = channel
    assert fake.end is not None
    fake.end._sock.sendall(struct.pack("!I", 0xFFFFFFFF) + b"x" * 16)  # (the rest never comes)
    _ended(worker, deaths, "a frame over the limit")


def test_a_ring_record_that_is_not_a_result_ends_the_worker(channel) -> None:  # type: ignore[no-untyped-def]
    worker, fake, deaths, _ = channel
    if fake.ring is None:
        pytest.skip("no shared-memory result ring here (no memfd_create)")
    assert fake.ring.put(msg.encode(msg.InferCall(1, "other", None, [], 0, False)))  # calls go on the socket
    fake.send(msg.RingBell())
    _ended(worker, deaths, "a ring record that is not a result or an answer")


def test_bad_names_and_indexes_are_answered_and_the_channel_lives(channel) -> None:  # type: ignore[no-untyped-def]
    worker, fake, deaths, results = channel
    # a metric the server refuses (a bad name, a label key that would forge a line): an error to the model
    fake.send(msg.MetricUpdate(1, {"name": "bad-name", "description": "", "kind": 0}, {}, "value", 0.0))
    reply = fake.read()
    assert type(reply) is msg.Reply and reply.call_id == 1 and "invalid metric name" in (reply.error or "")
    fake.send(msg.MetricUpdate(2, {"name": "ok", "description": "", "kind": 0}, {'a="1"} 9\nx': "v"}, "value", 0.0))
    reply = fake.read()
    assert reply.call_id == 2 and "invalid label name" in (reply.error or "")
    # a BLS call to a model the Core does not know: its error in the response (Triton's NOT_FOUND words)
    fake.send(msg.InferCall(3, "no_such_model", None, ["id", 0, 0, {}, [], [], None], 0, False))
    reply = fake.read()
    assert reply.call_id == 3 and reply.error is None
    outputs, error, _ = reply.value
    assert outputs == [] and "no_such_model" in error[1]
    # a request that was never sent asks whether it was cancelled: no
    fake.send(msg.CancelledQuery(4, 12345, -1))
    assert fake.read() == msg.Reply(4, False, None)
    # a stream cancelled that was never opened: nothing happens
    fake.send(msg.CancelStream(999))
    _control_round_trip(worker, fake)
    assert worker.alive and not deaths.causes and results == []

"""SIGTERM under gRPC load, on each frontend: readiness goes false, GOAWAY, in-flight calls finish, nothing lost.

Client threads send continuously while the server is told to stop.  Every request sent gets an answer:
a success, or a retryable UNAVAILABLE (refused before it ran).  The model writes each request's number to
a log as it runs, so "lost" is checked from both sides: nothing ran whose answer did not come back.
"""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message

from fastoip import _codec
from fastoip._proto import grpc_service_pb2 as pb
from fastoip.types import InferInput, InferRequest
from h2raw import MODEL_INFER, SERVICE, RawGrpcConnection
from serverproc import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(240)

CLIENTS = 8
GRACE_S = 2.0
WORK_MODEL = """
import os
import time
import fastoip

class Work(fastoip.Model):
    def predict(self, inputs, parameters):
        time.sleep(0.05)  # long enough that calls are in flight when the listeners close
        with open(os.environ["WORK_LOG"], "a") as log:
            log.write(f"{int(inputs['X'][0])}\\n")
        return {"OUT": inputs["X"]}
"""
WORK_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
"""


def work_request(number: int) -> bytes:
    x = np.array([number], dtype=np.int32)
    return _codec.encode_infer_request(InferRequest("work", inputs=[InferInput("X", "INT32", x.shape, x)]))


class Sender(threading.Thread):
    """Sends requests one after another on its own connection and records how each one ended."""

    def __init__(self, url: str, first_number: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)])
        self.call = self.channel.unary_unary(MODEL_INFER)
        self.number = first_number
        self.stop = stop
        self.sent: list[int] = []
        self.outcomes: dict[int, str] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            number = self.number
            self.number += 1
            self.sent.append(number)
            try:
                response = _codec.decode_infer_response(self.call(work_request(number), timeout=60))
                ok = np.asarray(response.outputs[0].data).reshape(-1).tolist() == [number]
                self.outcomes[number] = "OK" if ok else "WRONG_ANSWER"
            except grpc.RpcError as exc:
                self.outcomes[number] = exc.code().name
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    time.sleep(0.01)  # the server is going: do not spin
        self.channel.close()


class ReadinessWatcher(threading.Thread):
    """Polls ServerReady and ServerLive; records (ready, live) as seen over time."""

    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)])
        self.stop = stop
        self.seen: list[tuple[bool | None, bool | None]] = []

    def ask(self, method: str, request: Message, response_type: type[Message], field: str) -> bool | None:
        """The answer's flag, or None when the call failed (the server no longer answers)."""
        call = self.channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            return bool(getattr(call(request, timeout=5), field))
        except grpc.RpcError:
            return None

    def run(self) -> None:
        while not self.stop.is_set():
            ready = self.ask("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, "ready")
            live = self.ask("ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse, "live")
            self.seen.append((ready, live))
            time.sleep(0.05)
        self.channel.close()


def test_sigterm_under_load_loses_nothing(tmp_path: Path, grpc_frontend: str) -> None:
    root, log = tmp_path / "repo", tmp_path / "work.log"
    (root / "work" / "1").mkdir(parents=True)
    (root / "work" / "1" / "model.py").write_text(textwrap.dedent(WORK_MODEL))
    (root / "work" / "config.pbtxt").write_text(textwrap.dedent(WORK_CONFIG))
    server = ServerProcess(
        root, "--shutdown-grace", str(GRACE_S), "--exit-timeout", "30",
        env={"WORK_LOG": str(log)}, grpc_frontend=grpc_frontend,
    ).start()
    stop = threading.Event()
    senders = [Sender(server.grpc_url, 1_000_000 * (i + 1), stop) for i in range(CLIENTS)]
    watcher = ReadinessWatcher(server.grpc_url, stop)
    # An open idle connection that reads (and answers PINGs) throughout: it must see a GOAWAY or a close.
    idle = RawGrpcConnection(server.grpc_port, timeout=0.5).handshake()
    idle_reader = threading.Thread(target=idle.drain, args=(120.0,), daemon=True)
    try:
        watcher.start()
        idle_reader.start()
        for sender in senders:
            sender.start()
        assert wait_until(lambda: all(len(s.outcomes) >= 5 for s in senders), timeout=60), "load never got going"
        sent_before = sum(len(s.sent) for s in senders)
        server.signal(signal.SIGTERM)
        assert server.wait(90) == 0
        assert wait_until(lambda: all(s.sent and s.outcomes.get(s.sent[-1]) == "UNAVAILABLE" for s in senders), 30)
        idle_reader.join(30)
    finally:
        stop.set()
        for thread in [*senders, watcher]:
            thread.join(90)
        idle.close()
        server.stop()

    sent = [number for s in senders for number in s.sent]
    outcomes = {number: outcome for s in senders for number, outcome in s.outcomes.items()}
    counts = Counter(outcomes.values())
    print(f"sent {len(sent)} ({sent_before} before SIGTERM): {dict(counts)}; goaway={idle.goaway}")
    assert len(sent) == len(outcomes), "a request got no answer at all"  # every sent request was answered
    # never INTERNAL, a wrong answer ...; CANCELLED only on grpcio, at most one call per client: a call grpc's core
    # had received but grpcio's single outstanding request_call had not yet taken is cancelled by the core when the
    # server shuts down (details "CANCELLED", seen about 1 run in 8 under load); it never ran (checked below)
    allowed = {"OK", "UNAVAILABLE"} | ({"CANCELLED"} if grpc_frontend == "grpcio" else set())
    assert set(counts) <= allowed and counts["CANCELLED"] <= CLIENTS, counts
    assert counts["OK"] > sent_before, "no request was served after SIGTERM (the grace period serves)"
    executed = [int(line) for line in log.read_text().split()]
    ok = {number for number, outcome in outcomes.items() if outcome == "OK"}
    assert set(executed) == ok, "a request ran but its answer never came back, or an OK answer never ran"
    assert len(executed) == len(set(executed))  # nothing ran twice

    # Readiness went false while the server still answered liveness (the grace period), before it went away.
    states = watcher.seen
    first_not_ready = next(i for i, (ready, live) in enumerate(states) if ready is False)
    assert any(ready for ready, _ in states[:first_not_ready]), "never ready before SIGTERM"
    assert states[first_not_ready][1] is True, "readiness false only once the server no longer answered"
    # The open idle connection was told to go away (GOAWAY) before the server closed it.
    assert idle.goaway is not None, "no GOAWAY on an open connection at shutdown"
    assert "fastoip: stopped" in server.output()

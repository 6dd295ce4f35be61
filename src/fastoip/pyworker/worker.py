"""The worker process of one ``TritonPythonModel`` instance (``python -m fastoip.pyworker.worker FD``).

The server's side is ``fastoip.backends.python.triton_process``.  Messages are pickled tuples on
one socket (``multiprocessing.connection`` framing); tensors cross through
shared memory (:mod:`.transport`).

Server -> worker: ``("load", path, name, version, memory_limit_mb)``,
``("auto_complete", config)``, ``("initialize", args, decoupled)``,
``("execute", id, requests)``, ``("reply", call_id, value)`` (answers to the
worker's own calls), ``("finalize",)``.

Worker -> server: ``("ok", value)`` / ``("error", message)`` (answers to the
control messages), ``("result", id, responses | None, error | None)``,
``("send", id, index, response, final)`` (decoupled), and calls that need the
server: ``("call", call_id, what, args)`` (BLS, readiness, model control,
metrics) answered by ``("reply", ...)`` or, for a BLS stream, by several
``("stream", call_id, response, final)``.
The main thread reads; ``execute`` runs on a thread of its own (one at a time,
as an instance runs one batch at a time), so BLS answers reach it meanwhile.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from . import transport as shm
from . import utils as pb
from .runner import RequestData, TritonRunner, import_runner, request_data, response_of


class _Channel:
    """The socket to the server, shared by the reader, the execute thread and model threads."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._calls = itertools.count(1)
        self._waiting: dict[int, queue.SimpleQueue] = {}

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.connection.send_bytes(data)

    def call(self, what: str, *args: Any) -> queue.SimpleQueue:
        call_id = next(self._calls)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting[call_id] = answers
        self.send(("call", call_id, what, args))
        return answers

    def answer(self, call_id: int, value: Any, final: bool = True) -> None:
        answers = self._waiting.get(call_id)
        if answers is None:
            return
        if final:
            del self._waiting[call_id]
        answers.put((value, final))


class _WorkerBridge:
    """pb_utils' way to the server from the worker process."""

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def ask(self, what: str, *args: Any) -> Any:
        value, _ = self.channel.call(what, *args).get()
        if isinstance(value, tuple) and value and value[0] == "__error__":
            raise pb.TritonModelException(value[1])
        return value

    def infer(self, request: pb.InferenceRequest) -> pb.InferenceResponse:
        packed = shm.pack_request(request_data(request))
        answer = self.ask("infer", request.model_name, request.model_version, packed, request.timeout())
        return response_of(shm.unpack_response(answer))

    def infer_stream(self, request: pb.InferenceRequest) -> Iterator[pb.InferenceResponse]:
        packed = shm.pack_request(request_data(request))
        answers = self.channel.call("stream", request.model_name, request.model_version, packed, request.timeout())

        def responses() -> Iterator[pb.InferenceResponse]:
            while True:
                value, final = answers.get()
                if value is not None:
                    yield response_of(shm.unpack_response(value))
                if final:
                    return

        return responses()

    def model_ready(self, name: str, version: str) -> bool:
        return bool(self.ask("ready", name, version))

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self.ask("load", name, config, files)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.ask("unload", name, unload_dependents)

    def log(self, level: int, message: str) -> None:
        self.channel.send(("log", level, message))

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        if op == "value":
            return float(self.ask("metric", family, labels, op, value))
        self.channel.send(("metric", family, labels, op, value))
        return 0.0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pb.TritonModelException):
        return exc.message()
    return f"{type(exc).__name__}: {exc}"


def _limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        import resource

        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(connection: Connection) -> None:
    channel = _Channel(connection)
    bridge = _WorkerBridge(channel)
    pb.BRIDGE.current = bridge
    runner: TritonRunner | None = None
    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def execute_loop() -> None:
        while True:
            item = jobs.get()
            if item is None:
                return
            exec_id, packed = item
            assert runner is not None
            try:
                requests: list[RequestData] = [shm.unpack_request(r) for r in packed]

                def emit(index: int, response: Any, final: bool, exec_id: int = exec_id) -> None:
                    channel.send(("send", exec_id, index, shm.pack_response(response), final))

                def cancelled(index: int, exec_id: int = exec_id) -> bool:
                    return bool(bridge.ask("cancelled", exec_id, index))

                responses = runner.execute(requests, emit, cancelled)
                packed_out = None if responses is None else [shm.pack_response(r) for r in responses]
                # Drop the views on the server's segments now, so it can reuse them (see transport).
                del requests, responses
                channel.send(("result", exec_id, packed_out, None))
            except BaseException as exc:  # the model's error fails the batch; the worker lives on
                logging.getLogger("fastoip.python.worker").debug("execute failed", exc_info=True)
                channel.send(("result", exec_id, None, _describe(exc)))

    executor = threading.Thread(target=execute_loop, name="fastoip-execute", daemon=True)
    executor.start()
    while True:
        try:
            message = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the server went away: nothing to finish
        kind = message[0]
        if kind == "reply":
            channel.answer(message[1], message[2])
        elif kind == "stream":
            channel.answer(message[1], message[2], final=message[3])
        elif kind == "execute":
            jobs.put((message[1], message[2]))
        else:
            try:
                if kind == "load":
                    _, path, name, version, memory_mb = message
                    _limit_memory(memory_mb)
                    runner = import_runner(Path(path), name, version)
                    value: Any = None
                elif kind == "auto_complete":
                    assert runner is not None
                    value = runner.auto_complete(message[1])
                elif kind == "initialize":
                    assert runner is not None
                    runner.initialize(message[1], message[2])
                    value = None
                elif kind == "finalize":
                    jobs.put(None)
                    executor.join()
                    if runner is not None and runner.model is not None:
                        runner.finalize()
                    channel.send(("ok", None))
                    os._exit(0)
                else:
                    raise ValueError(f"unknown message {kind!r}")
                channel.send(("ok", value))
            except BaseException as exc:
                channel.send(("error", _describe(exc)))


def main() -> None:
    fd = int(sys.argv[1])
    # The server decides when a worker ends (finalize, or its socket closing): a Ctrl+C or SIGTERM sent to the
    # whole process group must not kill requests in flight while the server drains.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING)
    serve(Connection(fd))


if __name__ == "__main__":
    main()

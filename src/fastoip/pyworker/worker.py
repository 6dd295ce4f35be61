"""The worker process of one ``TritonPythonModel`` instance (``python -m fastoip.pyworker FD``).

The server's side is ``fastoip.backends.python.triton_process``.  Messages are pickled tuples on
one socket (:mod:`.framing`: length-prefixed); tensors cross through
shared memory (:mod:`.transport`).

Server -> worker: ``("load", path, name, version, memory_limit_mb)`` or, for an MLServer runtime,
``("load_mlserver", spec, memory_limit_mb)`` (:class:`.mlserver_runner.MLServerRunner`: loaded at once),
``("auto_complete", config)``, ``("initialize", args, decoupled)``,
``("execute", id, requests)``, ``("reply", call_id, value)`` (answers to the
worker's own calls), ``("finalize",)``, and ``("many", messages)``: what an event
loop handed over in one turn, pickled once and read here one message at a time.

Worker -> server: ``("ok", value)`` / ``("error", message)`` (answers to the
control messages), ``("result", id, responses | None, error | None)`` (through
the result ring, :mod:`.ring`, when the server passed one: ``FD RING_FD``; then
``("ring",)`` on the socket wakes the server for a run of them),
``("send", id, index, response, final)`` (decoupled), and calls that need the
server: ``("call", call_id, what, args)`` (BLS, readiness, model control,
metrics) answered by ``("reply", ...)`` or, for a BLS stream, by several
``("stream", call_id, response, final)``.
The main thread reads and runs each batch itself (one at a time, as an instance
runs one batch at a time); a thread waiting for an answer reads meanwhile
(see :class:`_Channel`).  Several requests may be waiting in the socket (the
server's ``worker_pipeline``): one ``recv`` takes them all, and they run one
after the other.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import pickle
import queue
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..allocator import settle_python_heap
from . import transport as shm
from . import utils as pb
from ._ring import ResultRing
from .framing import FramedSocket
from .mlserver_runner import MLServerRunner
from .runner import RequestData, TritonRunner, import_runner, request_data, response_of

#: The message that says "results are waiting in the ring" (the server takes the ring before every message).
RING_BELL = pickle.dumps(("ring",), protocol=pickle.HIGHEST_PROTOCOL)


class _Channel:
    """The socket to the server, shared by the main thread (which runs ``execute``) and the model's threads.

    Whoever waits reads: only the holder of the read lock reads the socket.  The main thread holds it while it
    waits for the next message; a thread waiting for the answer to its own call (BLS, readiness, cancellation)
    reads while the main thread runs the model, and hands over what is not an answer (:attr:`inbox`).  So a batch
    runs on the thread that received it: no hand-off between threads on the way in.
    """

    def __init__(self, connection: FramedSocket, ring: ResultRing | None = None) -> None:
        self.connection = connection
        #: Where results go without a system call each (:mod:`.ring`); the socket carries a wake-up for a run
        #: of them (:data:`RING_BELL`), sent before this thread waits for the server, or any other message.
        self.ring = ring
        #: Results in the ring the server has not been told of (guarded by ``_lock``).
        self._unannounced = False
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._calls = itertools.count(1)
        self._waiting: dict[int, queue.SimpleQueue] = {}
        #: Messages for the main loop that another thread read.
        self.inbox: collections.deque = collections.deque()
        #: The rest of a ``("many", messages)`` the server sent, read one at a time (guarded by the read lock).
        self._unread: collections.deque = collections.deque()

    def _read_one(self) -> tuple:
        if self._unread:
            return self._unread.popleft()
        try:
            message = pickle.loads(self.connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the server went away: nothing to finish
        if message[0] == "many":  # an event loop's turn of messages, in order
            self._unread.extend(message[1])
            return self._unread.popleft()
        return message

    def _route(self, message: tuple) -> bool:
        """Deliver an answer to its waiter; False for anything else."""
        kind = message[0]
        if kind == "reply":
            self.answer(message[1], message[2])
        elif kind == "stream":
            self.answer(message[1], message[2], final=message[3])
        else:
            return False
        return True

    def next_message(self) -> tuple:
        """The main loop's next message (answers to other threads' calls are delivered on the way)."""
        while True:
            if self.inbox:
                return self.inbox.popleft()
            with self._read_lock:
                if self.inbox:
                    message = None
                else:
                    # Before this thread may wait for the server, which may be waiting for those results
                    # (checked here, the only reader: a message seen buffered is still there).
                    if self._unannounced and not self._unread and not self.connection.has_message():
                        self.announce()
                    message = self._read_one()
            if message is not None and not self._route(message):
                return message

    def wait(self, answers: queue.SimpleQueue) -> tuple:
        """The next answer of one call: read the socket meanwhile when nobody else does."""
        while True:
            try:
                return answers.get_nowait()
            except queue.Empty:
                pass
            if self._read_lock.acquire(blocking=False):
                try:
                    if answers.empty() and (self._unread or self.connection.poll(0.005)):
                        message = self._read_one()
                        if not self._route(message):
                            self.inbox.append(message)
                finally:
                    self._read_lock.release()
            else:
                try:
                    return answers.get(timeout=0.005)
                except queue.Empty:
                    pass

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.connection.send_bytes(data)
            self._unannounced = False  # (the server takes the ring's results before any message it reads)

    def send_result(self, message: tuple) -> None:
        """A batch's result: into the ring when it fits (announced later, with the ones after it), else sent."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self.ring is not None and self.ring.put(data):
                self._unannounced = True
                return
            self.connection.send_bytes(data)
            self._unannounced = False

    def announce(self) -> None:
        """Wake the server for the results in the ring."""
        with self._lock:
            if self._unannounced:
                self.connection.send_bytes(RING_BELL)
                self._unannounced = False

    def call(self, what: str, *args: Any) -> queue.SimpleQueue:
        return self.call_with_id(what, *args)[1]

    def call_with_id(self, what: str, *args: Any) -> tuple[int, queue.SimpleQueue]:
        call_id = next(self._calls)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting[call_id] = answers
        self.send(("call", call_id, what, args))
        return call_id, answers

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
        value, _ = self.channel.wait(self.channel.call(what, *args))
        if isinstance(value, tuple) and value and value[0] == "__error__":
            raise pb.TritonModelException(value[1])
        return value

    def infer(self, request: pb.InferenceRequest) -> pb.InferenceResponse:
        try:
            packed = shm.pack_request(request_data(request))
        except OSError as exc:  # no room in shared memory: an error response, as python_backend answers it
            return pb.InferenceResponse(error=pb.TritonError(str(exc.strerror or exc), pb.TritonError.INTERNAL))
        answer = self.ask("infer", request.model_name, request.model_version, packed, request.timeout())
        return response_of(shm.unpack_response(answer))

    def infer_stream(self, request: pb.InferenceRequest) -> Iterator[pb.InferenceResponse]:
        packed = shm.pack_request(request_data(request))
        call_id, answers = self.channel.call_with_id(
            "stream", request.model_name, request.model_version, packed, request.timeout()
        )

        def responses() -> Iterator[pb.InferenceResponse]:
            while True:
                value, final = self.channel.wait(answers)
                if value is not None:
                    yield response_of(shm.unpack_response(value))
                if final:
                    return

        return pb.ResponseIterator(responses(), lambda: self.channel.send(("cancel_call", call_id)))

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


def serve(connection: FramedSocket, ring: ResultRing | None = None) -> None:
    channel = _Channel(connection, ring)
    bridge = _WorkerBridge(channel)
    pb.BRIDGE.current = bridge
    runner: TritonRunner | MLServerRunner | None = None

    def execute(exec_id: int, packed: list) -> None:
        assert runner is not None
        ordered = not getattr(runner, "decoupled", True)
        running = [True]  # (a list: the closure below reads what the finally sets; plain for mypyc)
        try:
            requests: list[RequestData] = [shm.unpack_request(r) for r in packed]

            def emit(index: int, response: Any, final: bool) -> None:
                message = ("send", exec_id, index, shm.pack_response(response), final)
                if ordered and running[0]:
                    # a non-decoupled request's one answer, sent while execute runs (from any thread, or its
                    # coroutine): it reaches the server before the batch's result (an error execute raises after
                    # it is not its answer)
                    channel.send_result(message)
                else:
                    channel.send(message)

            def cancelled(index: int) -> bool:
                return bool(bridge.ask("cancelled", exec_id, index))

            try:
                responses = runner.execute(requests, emit, cancelled)
            finally:
                running[0] = False
            packed_out = None if responses is None else [
                None if r is None else shm.pack_response(r) for r in responses  # None: its sender answers
            ]
            # Drop the views on the server's segments now, so it can reuse them (see transport).
            del requests, responses
            # Into the ring: a run of results costs the server one wake-up, and each survives this process
            # (should the next batch crash it, the server still takes this one before failing that one).
            channel.send_result(("result", exec_id, packed_out, None))
        except BaseException as exc:  # the model's error fails the batch; the worker lives on
            logging.getLogger("fastoip.python.worker").debug("execute failed", exc_info=True)
            channel.send_result(("result", exec_id, None, _describe(exc)))

    while True:
        message = channel.next_message()
        kind = message[0]
        if kind == "execute":
            execute(message[1], message[2])  # on this thread, the one that received it
        else:
            try:
                if kind == "load":
                    _, path, name, version, memory_mb = message
                    _limit_memory(memory_mb)
                    runner = import_runner(Path(path), name, version, own_process=True)
                    value: Any = None
                elif kind == "load_mlserver":
                    _, spec, memory_mb = message
                    _limit_memory(memory_mb)
                    runner = MLServerRunner(spec)
                    value = None
                elif kind == "auto_complete":
                    assert isinstance(runner, TritonRunner)
                    value = runner.auto_complete(message[1])
                elif kind == "initialize":
                    assert isinstance(runner, TritonRunner)
                    runner.initialize(message[1], message[2])
                    value = None
                elif kind == "finalize":
                    if runner is not None and runner.model is not None:
                        runner.finalize()
                    channel.send(("ok", None))
                    os._exit(0)
                else:
                    raise ValueError(f"unknown message {kind!r}")
                if kind in ("initialize", "load_mlserver"):
                    settle_python_heap()  # the model is loaded
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
    ring = ResultRing(int(sys.argv[2])) if len(sys.argv) > 2 else None
    # The model sees the argv of python_backend's stub (an embedded interpreter's ['']), not this worker's
    # descriptors: Triton's QA models run unittest.main("model"), which reads sys.argv for test names.
    sys.argv = [""]
    serve(FramedSocket(socket.socket(fileno=fd)), ring)


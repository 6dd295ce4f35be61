"""The worker process of one ``TritonPythonModel`` instance (``python -m fastoip.pyworker FD``).

The server's side is ``fastoip.backends.python.hosting.worker_process``.  Messages are :mod:`.channel`'s typed
records on one socket (:mod:`.framing`: length-prefixed, bounded); tensors cross through shared memory
(:mod:`.transport`).  This side reads :data:`.channel.TO_WORKER` records (``Load`` / ``LoadMLServer``,
``AutoComplete``, ``Initialize``, ``Execute``, ``Reply`` and ``StreamPart`` (answers to its own calls),
``Finalize``, and ``Many``: what an event loop handed over in one turn) and sends
:data:`.channel.TO_SERVER` ones: ``Done`` / ``Failed`` (answers to the control messages), ``Result`` (through
the result ring, :mod:`.ring`, when the server passed one: ``FD READY_FD RING_FD``; then ``RingBell`` on the
socket wakes the server for a run of them), ``Send`` (decoupled), and calls that need the server
(``InferCall``, ``CancelledQuery``, ``ReadyQuery``, ``LoadModel``, ``UnloadModel``, ``MetricUpdate``), each
answered by a ``Reply`` or, for a BLS stream, by several ``StreamPart``.  ``READY_FD`` is the readiness
socket: a thread of its own answers each ``ReadinessCheck`` with the model's ``is_ready()``, even while
``execute`` runs.
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
import queue
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..allocator import settle_python_heap
from . import channel as msg
from . import transport as shm
from . import utils as pb
from ._ring import ResultRing
from .framing import FramedSocket, FrameTooLarge
from .mlserver_runner import MLServerRunner
from .runner import RequestData, TritonRunner, import_runner, request_data, response_of
from .segments import HANDOVER_ENV, Segments, SharedMemoryFull, WorkerSegments

#: The message that says "results are waiting in the ring" (the server takes the ring before every message).
RING_BELL = msg.encode(msg.RingBell())


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
        #: The rest of a :class:`~.channel.Many` the server sent, read one at a time (guarded by the read lock).
        self._unread: collections.deque = collections.deque()
        #: The shared-memory segments the server handed over (None: tensors travel inside the messages).
        self.segments: Segments | None = None

    def _read_one(self) -> tuple:
        if self._unread:
            return self._unread.popleft()
        try:
            message = msg.decode(self.connection.recv_bytes(), msg.TO_WORKER)
        except (EOFError, OSError):
            os._exit(0)  # the server went away: nothing to finish
        if type(message) is msg.Many:  # an event loop's turn of messages, in order
            self._unread.extend(message.records)
            return self._unread.popleft()
        return message

    def _route(self, message: tuple) -> bool:
        """Deliver an answer to its waiter; False for anything else."""
        if type(message) is msg.Reply:
            self.answer(message.call_id, message, True)
        elif type(message) is msg.StreamPart:
            self.answer(message.call_id, message, message.final)
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

    def wait(self, answers: queue.SimpleQueue) -> Any:
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
        data = msg.encode(message)
        with self._lock:
            self.connection.send_bytes(data)
            self._unannounced = False  # (the server takes the ring's results before any message it reads)

    def send_result(self, message: tuple) -> None:
        """A batch's result: into the ring when it fits (announced later, with the ones after it), else sent."""
        data = msg.encode(message)
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

    def call(self, record: Callable[..., tuple], *args: Any) -> tuple[int, queue.SimpleQueue]:
        """Send ``record(call_id, *args)``; the queue its answers (``Reply`` or ``StreamPart`` records) come to."""
        call_id = next(self._calls)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting[call_id] = answers
        self.send(record(call_id, *args))
        return call_id, answers

    def answer(self, call_id: int, record: tuple, final: bool) -> None:
        answers = self._waiting.get(call_id)
        if answers is None:
            return
        if final:
            del self._waiting[call_id]
        answers.put(record)


class _StreamAnswers:
    """The responses of a BLS stream as they come (a class, not a generator closure: mypyc's compiled closures
    of generators lost their environment when two streams were iterated at once, python_backend's
    ``bls_decoupled/async_model.py`` pattern)."""

    def __init__(self, channel: _Channel, answers: queue.SimpleQueue) -> None:
        self._channel = channel
        self._answers = answers
        self._ended = False

    def __iter__(self) -> Iterator[pb.InferenceResponse]:
        return self

    def __next__(self) -> pb.InferenceResponse:
        while not self._ended:
            part = self._channel.wait(self._answers)
            if type(part) is msg.Reply:  # the call failed before it streamed
                self._ended = True
                raise pb.TritonModelException(part.error or "the BLS stream failed")
            self._ended = bool(part.final)
            if part.response is not None:
                return response_of(shm.unpack_response(part.response, self._channel.segments))
        raise StopIteration


def _no_room(exc: OSError | SharedMemoryFull) -> pb.InferenceResponse:
    """The error response for a BLS request whose tensors found no room in shared memory."""
    words = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return pb.InferenceResponse(error=pb.TritonError(words, pb.TritonError.INTERNAL))


class _WorkerBridge:
    """pb_utils' way to the server from the worker process."""

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def ask(self, record: Callable[..., tuple], *args: Any) -> Any:
        _, answers = self.channel.call(record, *args)
        reply = self.channel.wait(answers)
        if reply.error is not None:
            raise pb.TritonModelException(reply.error)
        return reply.value

    def infer(self, request: pb.InferenceRequest) -> pb.InferenceResponse:
        try:
            packed = shm.pack_request(request_data(request), self.channel.segments)
        except (OSError, SharedMemoryFull) as exc:  # no room in shared memory: an error response, as python_backend
            return _no_room(exc)
        answer = self.ask(
            msg.InferCall, request.model_name, request.model_version, packed, request.timeout(), False
        )
        return response_of(shm.unpack_response(answer, self.channel.segments))

    def infer_stream(self, request: pb.InferenceRequest) -> Iterator[pb.InferenceResponse]:
        try:
            packed = shm.pack_request(request_data(request), self.channel.segments)
        except (OSError, SharedMemoryFull) as exc:  # as infer: the stream is that one error response
            return iter([_no_room(exc)])
        call_id, answers = self.channel.call(
            msg.InferCall, request.model_name, request.model_version, packed, request.timeout(), True
        )
        return pb.ResponseIterator(
            _StreamAnswers(self.channel, answers), lambda: self.channel.send(msg.CancelStream(call_id))
        )

    def segment(self, nbytes: int) -> list:
        """A new segment from the server to write ``nbytes`` into: ``[index, size, pooled]`` (its descriptor is
        on the handover socket already); SharedMemoryFull with the server's words when there is no room."""
        _, answers = self.channel.call(msg.SegmentWanted, nbytes)
        reply = self.channel.wait(answers)
        if reply.error is not None:
            raise SharedMemoryFull(reply.error)
        value = reply.value
        if type(value) is not list or len(value) != 3 or type(value[0]) is not int:
            raise SharedMemoryFull(f"the server's answer for a segment is not one: {str(value)[:80]}")
        return value

    def model_ready(self, name: str, version: str) -> bool:
        return bool(self.ask(msg.ReadyQuery, name, str(version)))

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self.ask(msg.LoadModel, name, config or "", files)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.ask(msg.UnloadModel, name, bool(unload_dependents))

    def log(self, level: int, message: str) -> None:
        self.channel.send(msg.Log(int(level), str(message)))

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        if op in ("value", "family"):  # (a family of another kind is refused at once, as Triton's)
            return float(self.ask(msg.MetricUpdate, family, labels, op, float(value)))
        self.channel.send(msg.MetricUpdate(0, family, labels, op, float(value)))
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


def _answer_readiness(readiness: FramedSocket, runner_of: Callable[[], Any]) -> None:
    """The readiness socket's thread: runs the model's ``is_ready()`` for each check the server sends, while the
    main thread may be running ``execute`` (python_backend's stub answers it on its parent-message thread)."""
    while True:
        try:
            msg.decode(readiness.recv_bytes(), msg.READINESS_TO_WORKER)
        except (EOFError, OSError, FrameTooLarge, msg.ProtocolError):
            return  # the server went away (or broke the protocol): no more checks
        runner = runner_of()
        answer = runner.user_readiness() if isinstance(runner, TritonRunner) and runner.model is not None \
            else (False, True, None)
        try:
            readiness.send_bytes(msg.encode(msg.Readiness(*answer)))
        except OSError:
            return


def serve(
    connection: FramedSocket, ring: ResultRing | None = None, readiness: FramedSocket | None = None,
    handover: socket.socket | None = None,
) -> None:
    channel = _Channel(connection, ring)
    bridge = _WorkerBridge(channel)
    if handover is not None:
        channel.segments = WorkerSegments(handover, bridge.segment)
    segments = channel.segments
    pb.BRIDGE.current = bridge
    runner: TritonRunner | MLServerRunner | None = None
    if readiness is not None:
        threading.Thread(
            target=_answer_readiness, args=(readiness, lambda: runner), name="fastoip-readiness", daemon=True
        ).start()

    def execute(exec_id: int, packed: list) -> None:
        assert runner is not None
        ordered = not getattr(runner, "decoupled", True)
        running = [True]  # (a list: the closure below reads what the finally sets; plain for mypyc)
        try:
            requests: list[RequestData] = [shm.unpack_request(r, segments) for r in packed]

            def emit(index: int, response: Any, final: bool) -> None:
                message = msg.Send(exec_id, index, shm.pack_response(response, segments), final)
                if ordered and running[0]:
                    # a non-decoupled request's one answer, sent while execute runs (from any thread, or its
                    # coroutine): through the ring, so it reaches the server before the batch's result (an error
                    # execute raises after it is not its answer)
                    channel.send_result(message)
                else:
                    channel.send(message)

            def cancelled(index: int) -> bool:
                return bool(bridge.ask(msg.CancelledQuery, exec_id, index))

            try:
                responses = runner.execute(requests, emit, cancelled)
            finally:
                running[0] = False
            packed_out = None if responses is None else [
                None if r is None else shm.pack_response(r, segments) for r in responses  # None: its sender answers
            ]
            # Drop the views on the server's segments now, so it can reuse them (see transport).
            del requests, responses
            rescheduled: list[int] = list(getattr(runner, "rescheduled", ()))
            # Into the ring: a run of results costs the server one wake-up, and each survives this process
            # (should the next batch crash it, the server still takes this one before failing that one).  One
            # that reschedules requests takes the socket, behind the decoupled responses sent before it (the
            # server forgets those requests' streams when it reads it).
            send = channel.send if rescheduled else channel.send_result
            try:
                send(msg.Result(exec_id, packed_out, None, rescheduled))
            except FrameTooLarge as too_large:  # (the answer is refused, not the channel)
                channel.send_result(msg.Result(exec_id, None, f"the responses could not be sent: {too_large}", []))
        except BaseException as exc:  # the model's error fails the batch; the worker lives on
            logging.getLogger("fastoip.python.worker").debug("execute failed", exc_info=True)
            channel.send_result(msg.Result(exec_id, None, _describe(exc), []))

    def load(message: Any) -> None:
        nonlocal runner
        _limit_memory(message.memory_limit_mb)
        runner = import_runner(Path(message.path), message.name, message.version, own_process=True)

    def load_mlserver(message: Any) -> None:
        nonlocal runner
        _limit_memory(message.memory_limit_mb)
        runner = MLServerRunner(message.spec)
        settle_python_heap()  # the model is loaded

    def auto_complete(message: Any) -> Any:
        assert isinstance(runner, TritonRunner)
        return runner.auto_complete(message.config)

    def initialize(message: Any) -> None:
        assert isinstance(runner, TritonRunner)
        runner.initialize(message.args, message.decoupled)
        settle_python_heap()  # the model is loaded

    def finalize(message: Any) -> None:
        if runner is not None and runner.model is not None:
            runner.finalize()
        channel.send(msg.Done(None))
        os._exit(0)

    #: The control messages: each answered by Done (its value) or Failed (the model's words).
    control: dict[type, Callable[[Any], Any]] = {
        msg.Load: load,
        msg.LoadMLServer: load_mlserver,
        msg.AutoComplete: auto_complete,
        msg.Initialize: initialize,
        msg.Finalize: finalize,
    }
    while True:
        message = channel.next_message()
        if type(message) is msg.Execute:
            execute(message.exec_id, message.requests)  # on this thread, the one that received it
            continue
        try:
            handler = control.get(type(message))
            if handler is None:
                raise ValueError(f"unexpected message {type(message).__name__}")
            value = handler(message)
            channel.send(msg.Done(value))
        except BaseException as exc:
            channel.send(msg.Failed(_describe(exc)))


def main() -> None:
    fd = int(sys.argv[1])
    # The server decides when a worker ends (finalize, or its socket closing): a Ctrl+C or SIGTERM sent to the
    # whole process group must not kill requests in flight while the server drains.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING)
    readiness = FramedSocket(socket.socket(fileno=int(sys.argv[2]))) if len(sys.argv) > 2 else None
    ring = ResultRing(int(sys.argv[3])) if len(sys.argv) > 3 else None
    handover_fd = os.environ.pop(HANDOVER_ENV, "")  # (a model's own children do not inherit it)
    handover = socket.socket(fileno=int(handover_fd)) if handover_fd.isdigit() else None
    # The model sees the argv of python_backend's stub (an embedded interpreter's ['']), not this worker's
    # descriptors: Triton's QA models run unittest.main("model"), which reads sys.argv for test names.
    sys.argv = [""]
    serve(FramedSocket(socket.socket(fileno=fd)), ring, readiness, handover)


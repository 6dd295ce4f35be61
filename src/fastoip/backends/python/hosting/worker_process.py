"""The server's handle on one worker process (:mod:`fastoip.pyworker.worker`): start, control, execute, death.

Rules:
- The worker is ``python -m fastoip.pyworker FD`` on one end of a socket pair.
  Messages both ways are :mod:`fastoip.pyworker.channel`'s typed records; what
  the worker sends is decoded without ``pickle`` and checked (a record that is
  not one, a frame over :data:`~fastoip.pyworker.framing.FRAME_LIMIT`, a ring
  record that is not a result: the worker is killed with the cause logged, and
  restarted).  :meth:`WorkerProcess._dispatch` is the one table of what each
  record does here.
- Writes never wait (see the scheduling contract, "Python worker processes"):
  every sender (an event loop, a reader thread, a call thread) gives the
  socket what it takes at once (``MSG_DONTWAIT``); the rest waits in a backlog
  that this worker's writer thread sends, behind which every later record
  queues, in order.  A worker that does not read parks its own requests in
  that backlog, never a thread of the server's, never an event loop.
- One reader at a time takes every message the worker sends: the worker's
  reader thread, or an event loop.  Once a batch was handed over on a running
  event loop (a frontend's), the reader thread hands the socket to that loop
  after its next message (``add_reader``): the results are then read and their
  jobs finished where the frontend runs, with no thread wake-up, no GIL
  hand-over and no ``call_soon_threadsafe`` per answer.  The loop only reads
  what is there (``recv_ready``) and never waits.  The thread takes the socket
  back before a control message (finalize), when the loop stops running (it
  checks every :data:`LOOP_CHECK_S`), and when the worker's end closes.  Mode
  changes and reads happen under one lock (``_reading``), so messages are
  dispatched one reader at a time, in order.
- Control messages (load, auto-complete, initialize, finalize) wait for their
  answer.  ``submit`` sends a batch and returns at once: nobody waits per
  request; the reader hands each result to ``on_result`` (which finishes the
  jobs), decoupled responses to ``on_send``.
- The worker's own calls (BLS, readiness, model control, metrics) run on this
  worker's own few threads (:data:`CALL_THREADS`): a model that keeps many BLS
  calls waiting queues behind its own, never another model's.  A BLS call
  carries its call chain (:mod:`fastoip.scheduling.call_chain`), built here
  from what the server knows the worker holds: one that would wait for itself
  (to the calling model with one instance, or round a cycle) is refused by the
  Core with an error in its response.
- The worker's death is noticed by its process exiting (:mod:`.exits`: a
  pidfd), not only its socket closing (a child it forked may hold the socket):
  the process is reaped and :class:`WorkerDied` (with the cause: exit code or
  signal) is raised to every waiter; ``on_death(cause)`` runs once, on the
  reader thread (never on an event loop).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ....errors import InvalidArgument
from ....pyworker import channel as msg
from ....pyworker import transport as shm
from ....pyworker._ring import ResultRing, RingCorrupt
from ....pyworker.framing import FramedSocket, FrameTooLarge
from ....pyworker.segments import HANDOVER_ENV, ServerSegments
from ....scheduling.call_chain import CallChain
from ..triton import server_bridge as bridge
from . import exits

log = logging.getLogger("fastoip.python")

#: Threads of one worker that serve its calls into the server (a BLS request waits on another model): its
#: share; more calls wait for one of these, behind the same model's own.
CALL_THREADS = 8
#: What a worker may put in its result ring: a batch's result, and a non-decoupled request's answer sent while
#: its execute runs (through the ring, so that it comes before the result).
RING_RECORDS: tuple[type, ...] = (msg.Result, msg.Send)
#: How long a worker may take to start, load or initialize, and to finalize.
CONTROL_TIMEOUT_S = 300.0
FINALIZE_TIMEOUT_S = 30.0
#: How often a reader thread that lent its socket to an event loop checks that the loop still runs.
LOOP_CHECK_S = 0.5
#: How long taking the socket back from a running loop may wait for the loop to let go.
RELEASE_TIMEOUT_S = 2.0


#: Starts a worker process on the child's end of the socket pair, with the result ring's descriptors and the
#: environment: :func:`spawn_worker`, or a unit test's fake worker.
Spawn = Callable[[socket.socket, list[int], dict[str, str]], subprocess.Popen]


def spawn_worker(child: socket.socket, fds: list[int], env: dict[str, str]) -> subprocess.Popen:
    """``python -m fastoip.pyworker FD READY_FD [RING_FD]`` on ``child`` (the worker: :mod:`fastoip.pyworker.worker`),
    ``fds`` being READY_FD [RING_FD]; the segments' handover socket is the descriptor ``env`` names."""
    handover = [int(env[HANDOVER_ENV])] if env.get(HANDOVER_ENV, "").isdigit() else []
    return subprocess.Popen(
        [sys.executable, "-m", "fastoip.pyworker", str(child.fileno()), *map(str, fds)],
        pass_fds=[child.fileno(), *fds, *handover],
        env=env,
        close_fds=True,
    )


class WorkerDied(Exception):
    """The worker process is gone; ``cause`` says how (``exited with code 3``, ``was killed by SIGSEGV``)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class WorkerError(Exception):
    """The worker answered a control message with an error (the model's own)."""


class _Waiter:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class WorkerProcess:
    """One running worker."""

    def __init__(
        self,
        label: str,
        on_send: Callable[[int, int, Any, bool], None],
        on_death: Callable[[str], None],
        is_cancelled: Callable[[int, int], bool] | None = None,
        link: bridge.ServerLink = bridge.UNLINKED,
        on_result: Callable[[int, Any, Any, list], None] | None = None,
        model: str = "",
        chain_of: Callable[[], CallChain] | None = None,
        spawn: Spawn = spawn_worker,
    ) -> None:
        self.label = label
        self.model = model
        #: The call chain of a BLS call this worker makes now (``scheduling.call_chain``: its instance and the
        #: chains of the requests it holds), from what the server knows it holds; a cycle is refused by the Core.
        self._chain_of = chain_of
        #: The Core this worker's calls (BLS, readiness, model control) go to: the one that loaded its model.
        self._link = link
        self._is_cancelled = is_cancelled
        self._on_send = on_send
        self._on_death = on_death
        #: Guards what waits to be written: ``_turn``, ``_backlog``, ``_writing``, ``_flush_scheduled``.  Held
        #: only for encoding and non-blocking sends, never while the socket is full.
        self._out_lock = threading.Lock()
        self._out_ready = threading.Condition(self._out_lock)
        #: Records an event loop handed over this turn, sent together at its end (one encoding, one write).
        self._turn: list[tuple] = []
        self._flush_scheduled = False
        #: Framed bytes the socket did not take at once; this worker's writer thread sends them, in order.
        self._backlog: collections.deque = collections.deque()
        self._writing = False
        self._writer: threading.Thread | None = None
        self._state = threading.Lock()
        self._control: _Waiter | None = None
        self._on_result = on_result or (lambda exec_id, responses, error, rescheduled: None)
        #: The worker's BLS streams in flight (their jobs), by call id: ``ResponseIterator.cancel()`` cancels one.
        self._outgoing: dict[int, Any] = {}
        #: This worker's share of threads for its calls into the server.
        self._calls = ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix=f"fastoip-calls-{label}")
        #: What each record the worker sends does here (the one table).
        self._handlers: dict[type, Callable[[Any], None]] = {
            msg.Result: self._on_result_record,
            msg.Send: self._on_send_record,
            msg.Done: self._on_control_answer,
            msg.Failed: self._on_control_answer,
            msg.InferCall: self._queue_call,
            msg.CancelledQuery: self._queue_call,
            msg.ReadyQuery: self._queue_call,
            msg.LoadModel: self._queue_call,
            msg.UnloadModel: self._queue_call,
            msg.MetricUpdate: self._on_metric,
            msg.CancelStream: self._on_cancel_stream,
            msg.Log: self._on_log,
            msg.RingBell: self._on_ring_bell,
            msg.SegmentWanted: self._queue_call,
        }
        self._dead = False
        self.cause: str | None = None
        #: Why the worker was ended for breaking the protocol (its cause says so).
        self._violation: str | None = None
        #: Held while reading or dispatching messages and while the reader changes (re-entrant: a finished job's
        #: callback may hand this worker its next batch).
        self._reading_lock = threading.RLock()
        self._reading = threading.Condition(self._reading_lock)
        #: The event loop that reads this worker's messages now, or None: the reader thread (guarded by _reading).
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A running loop that handed over a batch: the reader thread gives it the socket after its next message.
        self._wanted: asyncio.AbstractEventLoop | None = None
        #: A message the loop could not read: the reader thread ends the worker's channel.
        self._broken = False
        parent, child = socket.socketpair()
        #: The worker's results (most of them) arrive here; the socket wakes the reader for them.  Without
        #: ``memfd_create`` (not Linux) every message takes the socket.
        self._ring: ResultRing | None = None
        try:
            self._ring = ResultRing.create()
        except (AttributeError, OSError) as exc:
            log.warning("%s: no shared-memory result ring (%s): results take the socket", label, exc)
        ring_fds = [self._ring.fd] if self._ring is not None else []
        #: The readiness socket: the model's own ``is_ready()`` is asked here, answered by a thread of the worker
        #: even while ``execute`` runs (one check at a time: ``_readiness_lock``).
        ready_parent, ready_child = socket.socketpair()
        self._readiness_socket = ready_parent
        self._readiness = FramedSocket(ready_parent)
        self._readiness_lock = threading.Lock()
        env = dict(os.environ)
        # The tensor segments: made here, handed to the worker as descriptors on a socket of their own, named by
        # index in messages (pyworker/segments.py); an index it may not use ends it.
        handover, handover_child = socket.socketpair()
        #: This worker's shared-memory segments, as the server sees them.
        self.segments = ServerSegments(
            handover, lambda why: self._refuse("a segment it may not use", msg.ProtocolError(why))
        )
        env[HANDOVER_ENV] = str(handover_child.fileno())
        # (from the package's own file: a compiled module's ``__file__`` does not say where it lies)
        package = sys.modules[__name__.partition(".")[0]].__file__ or ""
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(package)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        try:
            self.process = spawn(child, [ready_child.fileno(), *ring_fds], env)
        except BaseException:
            self.segments.close()
            ready_parent.close()
            raise
        finally:
            child.close()
            ready_child.close()
            handover_child.close()
        self.pid = self.process.pid
        self._socket = parent
        self._connection = FramedSocket(parent)
        self._reader = threading.Thread(target=self._read, name=f"fastoip-worker-{self.pid}", daemon=True)
        self._reader.start()
        link.workers.add(self)
        # Its exit, even while a child it forked keeps the socket open: the reader then reads the end.
        self._unwatch = exits.watch(self.pid, self._on_exit)

    def _on_exit(self) -> None:
        """The process exited (the exit watcher's thread): end the channel, whoever else holds its other end."""
        for end in (self._socket, self._readiness_socket):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- the model's own readiness ------------------------------------------------------------------------------
    def ask_readiness(self) -> tuple[bool, bool, str | None]:
        """The model's ``is_ready()``: ``(defined, ready, error)``; waits for the worker's answer (callers bound
        the wait: :mod:`..triton.user_readiness`).  WorkerDied when the worker is gone."""
        with self._readiness_lock:
            if self.cause is not None:
                raise WorkerDied(self.cause)
            try:
                self._readiness.send_bytes(msg.encode(msg.ReadinessCheck()))
                answer = msg.decode(self._readiness.recv_bytes(), msg.READINESS_TO_SERVER)
            except (EOFError, OSError) as gone:
                raise WorkerDied(self.cause or f"closed its readiness socket ({gone})") from None
            except (FrameTooLarge, msg.ProtocolError) as bad:
                self._refuse("a readiness answer that is not one", bad)
                # its death is handled before the answer (a request that follows starts a new worker, it is not
                # handed to this one as it dies); an event loop that holds the socket reads the end itself (no loop
                # waits here: readiness that may wait is asked off the loops, server/readiness.py)
                if threading.current_thread() is not self._reader:
                    self._reader.join(RELEASE_TIMEOUT_S * 5)
                raise WorkerDied(f"broke the channel's protocol ({bad})") from None
            defined, ready, error = answer  # (a Readiness: decode checked its fields' types)
            return bool(defined), bool(ready), error

    # -- sending (never waits: see the module's rules) ----------------------------------------------------------
    def _send(self, message: tuple) -> None:
        """Send ``message`` behind everything handed over before it; WorkerDied when the worker is gone,
        TypeError or FrameTooLarge (a ValueError) when it cannot cross.  Never waits for the worker."""
        if self.cause is not None:
            raise WorkerDied(self.cause)
        data = msg.encode(message)  # (a message that is not plain data fails here, on the sender's thread)
        self._connection.check(len(data))
        with self._out_lock:
            held, self._turn = self._turn, []  # in order, behind the records an event loop has not sent yet
            frames = self._encoded(held)
            frames.append(data)
            self._put(frames)

    def _put(self, frames: list[bytes]) -> None:
        """Give ``frames`` to the socket, or to the backlog behind what waits there (the out lock is held)."""
        if not frames:
            return
        if self._writing:
            self._backlog.append(self._connection.framed(frames))
            return
        try:
            rest = self._connection.try_send_many(frames)
        except OSError:
            return  # the worker is gone: its reader fails or resends what it had (pending there)
        if rest is not None:
            self._backlog.append(rest)
            self._writing = True
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_backlog, name=f"fastoip-worker-writer-{self.pid}", daemon=True
                )
                self._writer.start()
            else:
                self._out_ready.notify()

    def _write_backlog(self) -> None:
        """This worker's writer thread: sends what the socket did not take at once, waiting for the worker to
        read (only this thread waits for it)."""
        while True:
            with self._out_lock:
                while not self._backlog:
                    self._writing = False
                    if self._dead:
                        return
                    self._out_ready.wait()
                parts = list(self._backlog)
                self._backlog.clear()
            try:
                for part in parts:
                    self._connection.send_raw(part)
            except OSError:  # the worker is gone: its reader handles the death; nothing more is written
                with self._out_lock:
                    self._backlog.clear()
                    self._writing = False
                return

    def _encoded(self, messages: list[tuple]) -> list[bytes]:
        """What goes on the socket for ``messages``, in order: one message as itself, several as one ``Many``.

        A message that cannot be encoded or is over the frame limit is left out: a batch's fails its jobs (a
        model's parameter that is not plain data), anything else is logged."""
        if not messages:
            return []
        if len(messages) > 1:
            try:
                data = msg.encode(msg.Many(messages))
                if len(data) <= self._connection.limit:
                    return [data]
            except Exception:
                pass
        out = []
        for message in messages:
            try:
                data = msg.encode(message)
                self._connection.check(len(data))
                out.append(data)
            except Exception as exc:
                if type(message) is msg.Execute:
                    self._on_result(message.exec_id, None, f"the request could not be sent to the worker: {exc}", [])
                else:
                    log.error("%s: a %s could not be sent to the worker: %s", self.label, type(message).__name__, exc)
        return out

    def _flush_turn(self) -> None:
        """The event loop's deferred write of the batches it handed over during this turn (never waits)."""
        with self._out_lock:
            self._flush_scheduled = False
            held, self._turn = self._turn, []
            self._put(self._encoded(held))

    def control(self, message: tuple, timeout: float = CONTROL_TIMEOUT_S) -> Any:
        """Send a control message and wait for its answer (WorkerError with the model's message)."""
        self._release_loop()  # the reader thread reads the answer: the loop may stop, or be the caller
        waiter = _Waiter()
        with self._state:
            if self.cause is not None:
                raise WorkerDied(self.cause)
            self._control = waiter
        self._send(message)
        if not waiter.event.wait(timeout):
            raise WorkerDied(f"did not answer {type(message).__name__} within {timeout:.0f} s")
        answer = waiter.value
        if type(answer) is str:
            raise WorkerDied(answer)
        if type(answer) is msg.Failed:
            raise WorkerError(answer.message)
        return answer.value

    def submit(self, exec_id: int, requests: list, defer: bool = False) -> None:
        """Send one batch and return; its result comes to ``on_result(exec_id, responses, error)`` on the
        reader thread (decoupled responses and the worker's calls meanwhile).  WorkerDied if it is gone.

        ``defer`` (nobody on this thread will wait for the batch): on an event loop's thread the write waits for
        the end of the loop's turn (``call_soon``), so the batches handed over while it reads a socket full of
        requests go out in one write and the loop drops the GIL once for them, not once per request (a dropped
        GIL may go to the reader thread for a while)."""
        if self.cause is not None:
            raise WorkerDied(self.cause)
        message = msg.Execute(exec_id, requests)
        loop = asyncio._get_running_loop() if defer else None
        if loop is None:
            reading = self._loop
            if reading is not None and not reading.is_running():
                self._release_loop()  # nobody would read the answer this caller waits for
            try:
                self._send(message)
            except (TypeError, ValueError) as exc:  # it cannot cross: the batch fails, the channel lives
                self._on_result(exec_id, None, f"the request could not be sent to the worker: {exc}", [])
            return
        if self._loop is None and self._wanted is None:
            self._wanted = loop  # its results are read there from the next message on
        with self._out_lock:
            self._turn.append(message)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        loop.call_soon(self._flush_turn)

    # -- reading -------------------------------------------------------------------------------------------
    def _read(self) -> None:
        """The reader thread: takes every message the worker sends (several per wake-up when they queued up),
        until the worker closes its end; while an event loop reads them it waits."""
        reading = self._reading
        while True:
            with reading:
                if self._loop is not None:
                    while self._loop is not None:
                        if not reading.wait(LOOP_CHECK_S):
                            loop = self._loop
                            if loop is not None and (loop.is_closed() or not loop.is_running()):
                                self._loop = None  # it stopped: its registration is stale, its callback stands down
                    self._connection.blocking()  # (the loop made the descriptor non-blocking)
                broken = self._broken
            if broken:
                break
            message = self._read_one()  # (outside the lock: only this thread reads now)
            if message is None:
                with reading:
                    self._take_ring()  # what the worker finished before it ended is answered, not failed
                break
            with reading:
                self._take_ring()
                self._dispatch(message)
                wanted = self._wanted
                if wanted is not None:
                    self._wanted = None
                    try:
                        wanted.call_soon_threadsafe(self._attach, wanted)
                        self._loop = wanted
                    except RuntimeError:  # closed meanwhile
                        pass
        self._died()

    def _refuse(self, what: str, reason: BaseException) -> None:
        """The worker broke the protocol: log why and end it (its death is handled as any other: it restarts)."""
        if self._violation is None:
            self._violation = f"{what}: {reason}"
            log.error("%s: its worker sent %s (%s): killing it", self.label, what, reason)
        try:
            self.process.kill()
        except OSError:
            pass

    # -- reading on an event loop ---------------------------------------------------------------------------
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: read this worker's messages here from now on (the reader thread has let go)."""
        with self._reading:
            if self._loop is not loop:
                return  # taken back meanwhile
            try:
                loop.add_reader(self._connection.fileno(), self._on_readable, loop)
            except (OSError, ValueError, RuntimeError):
                self._loop = None
                self._reading.notify_all()
                return
        self._on_readable(loop)  # what the thread left buffered, or what came meanwhile

    def _on_readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, when the worker's socket is readable: dispatch every whole message there is."""
        with self._reading_lock:  # (the condition's own lock, taken without the condition's Python wrapper)
            if self._loop is not loop:  # the thread took the socket back
                self._stop_reading(loop)
                return
            try:
                messages, closed = self._connection.recv_ready()
            except FrameTooLarge as too_large:
                self._refuse("a frame over the limit", too_large)
                messages, closed = [], True
                self._broken = True
            self._take_ring()
            for data in messages:
                try:
                    message = msg.decode(data, msg.TO_SERVER)
                except msg.ProtocolError as bad:
                    self._refuse("a frame that is not a record", bad)
                    self._broken = closed = True
                    break
                self._dispatch(message)
            if closed:  # the thread reads the end and handles the death (never on the loop)
                self._stop_reading(loop)
                self._loop = None
                self._reading.notify_all()

    def _stop_reading(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.remove_reader(self._connection.fileno())
        except (OSError, ValueError, RuntimeError):
            pass

    def _detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: give the socket back to the reader thread."""
        with self._reading:
            if self._loop is loop:
                self._stop_reading(loop)
                self._loop = None
                self._reading.notify_all()

    def _release_loop(self) -> None:
        """The reader thread reads again (before a control message waits for its answer; when a blocking caller
        finds the loop stopped).  A running loop lets go on its own thread; a stopped one is simply left."""
        self._wanted = None
        loop = self._loop
        if loop is None:
            return
        if asyncio._get_running_loop() is loop:
            self._detach(loop)
            return
        if loop.is_running():
            try:
                loop.call_soon_threadsafe(self._detach, loop)
            except RuntimeError:
                pass
            else:
                with self._reading:
                    if self._reading.wait_for(lambda: self._loop is not loop, RELEASE_TIMEOUT_S):
                        return
        with self._reading:
            if self._loop is loop:
                self._loop = None  # its callback, should it still run, stands down
                self._reading.notify_all()

    def _read_one(self) -> tuple | None:
        """The next message (the read lock is held), or None when the worker is gone (or was ended for what it
        sent)."""
        try:
            return msg.decode(self._connection.recv_bytes(), msg.TO_SERVER)
        except (EOFError, OSError):
            return None
        except FrameTooLarge as too_large:
            self._refuse("a frame over the limit", too_large)
            return None
        except msg.ProtocolError as bad:
            self._refuse("a frame that is not a record", bad)
            return None

    def _take_ring(self) -> None:
        """Dispatch the results waiting in the ring (the reading lock is held): before any message read from the
        socket, which the worker sent after them."""
        if self._ring is None:
            return
        try:
            records = self._ring.take()
        except RingCorrupt as corrupt:
            log.error("%s: its result ring was written over (%s): ending the worker", self.label, corrupt)
            self._ring = None  # (nothing more is read from it)
            self.process.kill()  # its end closes: the reader handles the death (what it ran fails, it restarts)
            return
        for data in records:
            try:
                message = msg.decode(data, RING_RECORDS)
            except msg.ProtocolError as bad:
                self._refuse("a ring record that is not a result or an answer", bad)
                self._ring = None
                return
            self._dispatch(message)

    def _dispatch(self, message: tuple) -> None:
        handler = self._handlers.get(type(message))
        if handler is None:  # (decode lets through only what the table names)
            self._refuse("a record with no handler", TypeError(type(message).__name__))
            return
        handler(message)

    # -- what each record does ------------------------------------------------------------------------------------
    def _on_result_record(self, message: Any) -> None:
        try:
            self._on_result(message.exec_id, message.responses, message.error, message.rescheduled)
        except Exception:
            log.exception("%s: finishing a batch failed", self.label)

    def _on_send_record(self, message: Any) -> None:
        try:
            self._on_send(message.exec_id, message.request_index, message.response, message.final)
        except Exception:
            log.exception("%s: delivering a decoupled response failed", self.label)

    def _on_control_answer(self, message: Any) -> None:
        waiter = self._control
        self._control = None
        if waiter is not None:
            waiter.value = message
            waiter.event.set()

    def _queue_call(self, message: Any) -> None:
        try:
            self._calls.submit(self._serve_call, message)
        except RuntimeError:  # shut down: the worker is ending
            pass

    def _on_metric(self, message: Any) -> None:
        if message.call_id:
            self._queue_call(message)
            return
        try:
            self._link.custom_metrics.apply(message.family, message.labels, message.op, message.value)
        except Exception as exc:
            log.warning("%s: custom metric: %s", self.label, exc)

    def _on_cancel_stream(self, message: Any) -> None:
        job = self._outgoing.get(message.call_id)
        if job is not None:
            job.cancel()

    def _on_log(self, message: Any) -> None:
        logging.getLogger("fastoip.python.model").log(message.level, "%s: %s", self.label, message.message)

    def _on_ring_bell(self, message: Any) -> None:
        pass  # a wake-up for the ring's results, taken before this message

    def _died(self) -> None:
        with self._state:
            if self._dead:
                return
            self._dead = True
        if self._unwatch is not None:
            self._unwatch()
        self._link.workers.discard(self)
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            cause = f"was killed by {name}"
        else:
            cause = f"exited with code {code}"
        if self._violation is not None:
            cause = f"was killed: it broke the channel's protocol ({self._violation})"
        with self._state:
            self.cause = cause
            control = self._control
            self._control = None
        with self._out_lock:
            self._out_ready.notify_all()  # the writer thread ends
        self._calls.shutdown(wait=False, cancel_futures=True)
        if control is not None:
            control.value = cause
            control.event.set()
        try:
            self._on_death(cause)  # (what it moves to a replacement is read from these segments first)
        finally:
            self.segments.close()

    # -- the worker's calls into the server (on this worker's call threads) ----------------------------------------
    def _chain(self) -> CallChain:
        chain_of = self._chain_of
        return chain_of() if chain_of is not None else ()

    def _serve_call(self, message: Any) -> None:
        call_id = message.call_id
        reply: tuple
        try:
            kind = type(message)
            if kind is msg.InferCall:
                if message.stream:
                    self._serve_stream(message)
                    return
                request = shm.unpack_request(message.request, self.segments)
                answer = self._link.infer(message.model, message.version, request, message.timeout_us, self._chain())
                reply = msg.Reply(call_id, shm.pack_response(answer, self.segments), None)
            elif kind is msg.CancelledQuery:
                asked = self._is_cancelled
                cancelled = asked is not None and asked(message.exec_id, message.request_index)
                reply = msg.Reply(call_id, bool(cancelled), None)
            elif kind is msg.ReadyQuery:
                reply = msg.Reply(call_id, self._link.model_ready(message.name, message.version), None)
            elif kind is msg.LoadModel:
                self._link.load_model(message.name, message.config, message.files)
                reply = msg.Reply(call_id, None, None)
            elif kind is msg.UnloadModel:
                self._link.unload_model(message.name, message.unload_dependents)
                reply = msg.Reply(call_id, None, None)
            elif kind is msg.SegmentWanted:
                reply = msg.Reply(call_id, self.segments.grant(message.nbytes), None)
            elif kind is msg.MetricUpdate:
                value = self._link.custom_metrics.apply(message.family, message.labels, message.op, message.value)
                reply = msg.Reply(call_id, value, None)
            else:
                reply = msg.Reply(call_id, None, f"unknown call {kind.__name__}")
        except Exception as exc:
            reply = msg.Reply(call_id, None, str(exc))
        try:
            try:
                self._send(reply)
            except (TypeError, ValueError) as unsendable:  # the answer cannot cross (over the frame limit): say so
                self._send(msg.Reply(call_id, None, f"the answer could not be sent to the model: {unsendable}"))
        except WorkerDied:
            pass

    def _serve_stream(self, message: Any) -> None:
        call_id = message.call_id

        def deliver(data: Any, final: bool) -> None:
            if final:
                self._outgoing.pop(call_id, None)
            try:
                try:
                    self._send(msg.StreamPart(call_id, shm.pack_response(data, self.segments), final))
                except (TypeError, ValueError) as unsendable:  # this response cannot cross: the stream ends with why
                    job = self._outgoing.pop(call_id, None)
                    if job is not None:
                        job.cancel()
                    why = f"a response could not be sent to the model: {unsendable}"
                    failed = bridge.error_data(InvalidArgument(why))
                    self._send(msg.StreamPart(call_id, failed, True))
            except WorkerDied:
                pass

        request = shm.unpack_request(message.request, self.segments)
        job = self._link.stream(message.model, message.version, request, deliver, message.timeout_us, self._chain())
        if job is not None and not job.finished:
            self._outgoing[call_id] = job
            if job.finished:  # it ended meanwhile: deliver() may have run before the entry existed
                self._outgoing.pop(call_id, None)

    # -- ending ---------------------------------------------------------------------------------------------
    def finalize(self) -> None:
        """Run the model's ``finalize`` and let the process exit; kill it if it does not."""
        try:
            self.control(msg.Finalize(), FINALIZE_TIMEOUT_S)
        except (WorkerDied, WorkerError) as exc:
            if self.cause is None:
                log.warning("%s: finalize: %s", self.label, exc)
        self.kill()

    def kill(self) -> None:
        self._release_loop()  # (before the socket closes: a loop must not watch a closed descriptor)
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=10)
        for end in (self._connection, self._readiness):
            try:
                end.close()
            except OSError:
                pass
        if self._ring is not None and not self._reader.is_alive():  # (a reader still running may take from it)
            self._ring.close()

    @property
    def alive(self) -> bool:
        return self.cause is None

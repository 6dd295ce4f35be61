"""The server's handle on one worker process (:mod:`fastoip.pyworker.worker`): start, control, execute, death.

Rules:
- The worker is ``python -m fastoip.pyworker FD`` on one end of a
  socket pair; one reader at a time takes every message it sends: the worker's
  reader thread, or an event loop.
- Results read on the event loop: once a batch was handed over on a running
  event loop (a frontend's), the reader thread hands the socket to that loop
  after its next message (``add_reader``): the results are then read and their
  jobs finished where the frontend runs, with no thread wake-up, no GIL
  hand-over and no ``call_soon_threadsafe`` per answer.  The thread takes the
  socket back before a control message (finalize), when the loop stops
  running (it checks every :data:`LOOP_CHECK_S`), and when the worker's end
  closes (the thread reads the end and handles the death, as before).  Mode
  changes and reads happen under one lock (``_reading``), so messages are
  dispatched one reader at a time, in order.
- Control messages (load, auto-complete, initialize, finalize) wait for their
  answer.  ``submit`` sends a batch and returns at once: nobody waits per
  request; the reader hands each result to ``on_result`` (which finishes the
  jobs), decoupled responses to ``on_send``, and the worker's own calls (BLS,
  readiness, model control, metrics) to a small shared thread pool.
- When the socket closes, the process is reaped and :class:`WorkerDied` (with the
  cause: exit code or signal) is raised to every waiter; ``on_death(cause)``
  runs once, on the reader thread (never on an event loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...pyworker import transport as shm
from ...pyworker._ring import ResultRing, RingCorrupt
from ...pyworker.framing import FramedSocket
from . import server_bridge as bridge

log = logging.getLogger("fastoip.python")

#: Threads that serve the workers' calls into the server (BLS requests wait on other models).
_CALLS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="fastoip-bls")
#: How long a worker may take to start, load or initialize, and to finalize.
CONTROL_TIMEOUT_S = 300.0
FINALIZE_TIMEOUT_S = 30.0
#: How often a reader thread that lent its socket to an event loop checks that the loop still runs.
LOOP_CHECK_S = 0.5
#: How long taking the socket back from a running loop may wait for the loop to let go.
RELEASE_TIMEOUT_S = 2.0
#: How soon the loop tries its deferred write again while another thread writes to the same worker.
FLUSH_RETRY_S = 0.0005


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
        on_result: Callable[[int, Any, Any], None] | None = None,
    ) -> None:
        self.label = label
        #: The Core this worker's calls (BLS, readiness, model control) go to: the one that loaded its model.
        self._link = link
        self._is_cancelled = is_cancelled
        self._on_send = on_send
        self._on_death = on_death
        self._write_lock = threading.Lock()
        #: Messages the event loop handed over, written at the end of its turn (guarded by the outbox lock, which
        #: is never held while writing: the loop never waits for a write to append); pickled together, as one
        #: ``("many", messages)`` (one pickling and one unpickling for a turn's batches, not one each).
        self._outbox_lock = threading.Lock()
        self._outbox: list[tuple] = []
        self._flush_scheduled = False
        self._state = threading.Lock()
        self._control: _Waiter | None = None
        self._on_result = on_result or (lambda exec_id, responses, error: None)
        #: The worker's BLS streams in flight (their jobs), by call id: ``ResponseIterator.cancel()`` cancels one.
        self._outgoing: dict[int, Any] = {}
        self._dead = False
        self.cause: str | None = None
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
        env = dict(os.environ)
        #: The worker's tensor segments are named with this token; a name it sends without it is refused.
        self.segment_token = shm.new_token()
        env[shm.TOKEN_ENV] = self.segment_token
        # (from the package's own file: a compiled module's ``__file__`` does not say where it lies)
        package = sys.modules[__name__.partition(".")[0]].__file__ or ""
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(package)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fastoip.pyworker", str(child.fileno()), *map(str, ring_fds)],
            pass_fds=[child.fileno(), *ring_fds],
            env=env,
            close_fds=True,
        )
        child.close()
        self.pid = self.process.pid
        self._connection = FramedSocket(parent)
        self._reader = threading.Thread(target=self._read, name=f"fastoip-worker-{self.pid}", daemon=True)
        self._reader.start()

    # -- sending -----------------------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        loop = self._loop
        if loop is not None and asyncio._get_running_loop() is loop:
            self._defer(message, loop)  # the loop that reads never waits for the write lock
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # (a message it cannot take fails here)
        try:
            with self._write_lock:
                with self._outbox_lock:  # in order, behind the batches the event loop has not sent yet
                    held, self._outbox = self._outbox, []
                self._write([*self._pickled(held), data] if held else [data])
        except OSError:
            raise WorkerDied(self.cause or "closed its channel") from None

    def _write(self, messages: list[bytes]) -> None:
        """Send ``messages`` (the write lock is held).  On the loop that reads this worker, never wait while it
        still reads: what the socket does not take at once waits for the worker with the reader thread reading
        again (the worker may itself be waiting for its results to be read before it reads more)."""
        loop = self._loop
        if loop is None or asyncio._get_running_loop() is not loop:
            self._connection.send_many(messages)
            return
        rest = self._connection.try_send_many(messages)
        if rest is not None:
            self._detach(loop)
            self._connection.send_raw(rest)

    def _pickled(self, messages: list[tuple]) -> list[bytes]:
        """What goes on the socket for ``messages``, in order: one message as itself, several as one ``many``.

        A message that cannot be pickled is left out: a batch's fails its jobs (as it did when each batch was
        pickled on its own, in ``submit``), anything else is logged."""
        try:
            if len(messages) == 1:
                return [pickle.dumps(messages[0], protocol=pickle.HIGHEST_PROTOCOL)]
            return [pickle.dumps(("many", messages), protocol=pickle.HIGHEST_PROTOCOL)]
        except Exception:
            pass
        out = []
        for message in messages:
            try:
                out.append(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                if message[0] == "execute":
                    self._on_result(message[1], None, f"the request could not be sent to the worker: {exc}")
                else:
                    log.error("%s: a '%s' message could not be sent to the worker: %s", self.label, message[0], exc)
        return out

    def _flush_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop's deferred write of the batches it handed over during this turn.  The loop never
        waits for another thread's write (that thread may wait for the worker, which may wait for this loop to
        read): it tries again shortly."""
        if not self._write_lock.acquire(blocking=False):
            loop.call_later(FLUSH_RETRY_S, self._flush_later, loop)
            return
        try:
            with self._outbox_lock:
                self._flush_scheduled = False
                held, self._outbox = self._outbox, []
            if held:
                self._write(self._pickled(held))
        except OSError:
            pass  # the worker died: its reader fails or resends those batches (they are pending there)
        finally:
            self._write_lock.release()

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
            raise WorkerDied(f"did not answer '{message[0]}' within {timeout:.0f} s")
        kind, value = waiter.value
        if kind == "died":
            raise WorkerDied(value)
        if kind == "error":
            raise WorkerError(value)
        return value

    def submit(self, exec_id: int, requests: list, defer: bool = False) -> None:
        """Send one batch and return; its result comes to ``on_result(exec_id, responses, error)`` on the
        reader thread (decoupled responses and the worker's calls meanwhile).  WorkerDied if it is gone.

        ``defer`` (nobody on this thread will wait for the batch): on an event loop's thread the write waits for
        the end of the loop's turn (``call_soon``), so the batches handed over while it reads a socket full of
        requests go out in one write and the loop drops the GIL once for them, not once per request (a dropped
        GIL may go to the reader thread for a while)."""
        if self.cause is not None:
            raise WorkerDied(self.cause)
        message = ("execute", exec_id, requests)
        loop = asyncio._get_running_loop() if defer else None
        if loop is None:
            reading = self._loop
            if reading is not None and not reading.is_running():
                self._release_loop()  # nobody would read the answer this caller waits for
            self._send(message)
            return
        if self._loop is None and self._wanted is None:
            self._wanted = loop  # its results are read there from the next message on
        self._defer(message, loop)

    def _defer(self, message: tuple, loop: asyncio.AbstractEventLoop) -> None:
        """``message`` goes out at the end of this turn of ``loop`` (this thread's), with what else it sends."""
        if self.cause is not None:
            raise WorkerDied(self.cause)
        with self._outbox_lock:
            self._outbox.append(message)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        loop.call_soon(self._flush_later, loop)

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
            messages, closed = self._connection.recv_ready()
            self._take_ring()
            for data in messages:
                try:
                    message = pickle.loads(data)
                except Exception:
                    log.exception("%s: unreadable message from its worker", self.label)
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
        """The next message (the read lock is held), or None when the worker is gone."""
        try:
            return pickle.loads(self._connection.recv_bytes())
        except (EOFError, OSError):
            return None
        except Exception:
            log.exception("%s: unreadable message from its worker", self.label)
            return None

    def _take_ring(self) -> None:
        """Dispatch the results waiting in the ring (the reading lock is held): before any message read from the
        socket, which the worker sent after them."""
        if self._ring is None:
            return
        try:
            records = self._ring.take()
        except RingCorrupt as exc:
            log.error("%s: its result ring was written over (%s): ending the worker", self.label, exc)
            self._ring = None  # (nothing more is read from it)
            self.process.kill()  # its end closes: the reader handles the death (what it ran fails, it restarts)
            return
        for data in records:
            try:
                message = pickle.loads(data)
            except Exception:
                log.exception("%s: unreadable result from its worker", self.label)
                continue
            self._dispatch(message)

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "result":
            _, exec_id, responses, error = message
            try:
                self._on_result(exec_id, responses, error)
            except Exception:
                log.exception("%s: finishing a batch failed", self.label)
        elif kind in ("ok", "error"):
            waiter = self._control
            self._control = None
            if waiter is not None:
                waiter.value = (kind, message[1])
                waiter.event.set()
        elif kind == "send":
            _, exec_id, index, response, final = message
            try:
                self._on_send(exec_id, index, response, final)
            except Exception:
                log.exception("%s: delivering a decoupled response failed", self.label)
        elif kind == "call":
            _CALLS.submit(self._serve_call, message[1], message[2], message[3])
        elif kind == "cancel_call":
            job = self._outgoing.get(message[1])
            if job is not None:
                job.cancel()
        elif kind == "ring":
            pass  # a wake-up for the ring's results, taken before this message
        elif kind == "log":
            logging.getLogger("fastoip.python.model").log(message[1], "%s: %s", self.label, message[2])
        elif kind == "metric":
            try:
                bridge.CUSTOM_METRICS.apply(message[1], message[2], message[3], message[4])
            except Exception as exc:
                log.warning("%s: custom metric: %s", self.label, exc)

    def _died(self) -> None:
        with self._state:
            if self._dead:
                return
            self._dead = True
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
        shm.remove_files_of(self.segment_token)
        with self._state:
            self.cause = cause
            control = self._control
            self._control = None
        if control is not None:
            control.value = ("died", cause)
            control.event.set()
        self._on_death(cause)

    def _serve_call(self, call_id: int, what: str, args: tuple) -> None:
        try:
            if what == "infer":
                name, version, packed, timeout = args
                request = shm.unpack_request(packed, self.segment_token)
                answer: Any = shm.pack_response(self._link.infer(name, version, request, timeout))
            elif what == "stream":
                name, version, packed, timeout = args

                def deliver(data: Any, final: bool) -> None:
                    if final:
                        self._outgoing.pop(call_id, None)
                    try:
                        self._send(("stream", call_id, shm.pack_response(data), final))
                    except WorkerDied:
                        pass

                job = self._link.stream(name, version, shm.unpack_request(packed, self.segment_token), deliver, timeout)
                if job is not None and not job.finished:
                    self._outgoing[call_id] = job
                    if job.finished:  # it ended meanwhile: deliver() may have run before the entry existed
                        self._outgoing.pop(call_id, None)
                return
            elif what == "cancelled":
                answer = bool(self._is_cancelled(*args)) if self._is_cancelled is not None else False
            elif what == "ready":
                answer = self._link.model_ready(*args)
            elif what == "load":
                self._link.load_model(*args)
                answer = None
            elif what == "unload":
                self._link.unload_model(*args)
                answer = None
            elif what == "metric":
                answer = bridge.CUSTOM_METRICS.apply(*args)
            else:
                answer = ("__error__", f"unknown call '{what}'")
        except Exception as exc:
            answer = ("__error__", str(exc))
        try:
            self._send(("reply", call_id, answer))
        except WorkerDied:
            pass

    # -- ending ---------------------------------------------------------------------------------------------
    def finalize(self) -> None:
        """Run the model's ``finalize`` and let the process exit; kill it if it does not."""
        try:
            self.control(("finalize",), FINALIZE_TIMEOUT_S)
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
        try:
            self._connection.close()
        except OSError:
            pass
        if self._ring is not None and not self._reader.is_alive():  # (a reader still running may take from it)
            self._ring.close()

    @property
    def alive(self) -> bool:
        return self.cause is None

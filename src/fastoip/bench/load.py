"""Load generators: closed loop (concurrency C) and open loop (request rate), gRPC here.

Every generator has the same small interface (:class:`Generator`): start at a
concurrency or a rate, ``cut(a, b)`` the completions whose end time falls in
``[a, b)`` (``time.perf_counter_ns`` clock, CLOCK_MONOTONIC on Linux, so the
same in every process of the machine), ``stop()`` and drain.

gRPC calls carry the pre-encoded ModelInferRequest bytes on a raw channel
method (``request_serializer=None, response_deserializer=None``): no protobuf
object is built per request.  Two clients:

- ``future``: grpcio's sync channel, ``future()`` + done callback; the callback
  records the latency and sends the next request.  Callbacks run on grpcio's
  channel threads; the main thread only sleeps.
- ``aio``: grpc.aio, one coroutine per outstanding request on an event loop
  in a dedicated thread.  Also the ``--streaming`` client where the native
  one (:mod:`fastoip.bench.nativeload`) is not built or cannot carry the load.

Which client carries a level is decided in :mod:`fastoip.bench.generators`.
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .target import TlsSettings
from .tls import grpc_aio_channel, grpc_channel
from .verify import ResponseCheck

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
#: See fastoip.bench.generators for the measurements behind it.
DEFAULT_GRPC_CLIENT = "auto"
#: A send later than this behind its schedule counts as late (request-rate mode).
LATE_NS = 1_000_000
now_ns = time.perf_counter_ns


#: --grpc-compression-algorithm: grpc.Compression values.
COMPRESSION = {"none": 0, "deflate": 1, "gzip": 2}


def channel_options(index: int, compression: str = "none") -> list[tuple[str, Any]]:
    """Options of the index-th load channel: no size caps, its own TCP connection, the compression asked for."""
    return [
        ("grpc.default_compression_algorithm", COMPRESSION[compression]),
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
        # Without this grpcio shares one subchannel (= one TCP connection)
        # between channels with equal arguments.
        ("grpc.use_local_subchannel_pool", 1),
        ("fastoip.bench.channel", index),
    ]


@dataclass
class LoadSpec:
    """Everything a generator needs; picklable (sent to worker processes)."""

    protocol: str  # grpc | http
    host: str
    port: int
    requests: list[bytes]
    check: ResponseCheck
    client: str = DEFAULT_GRPC_CLIENT  # auto | future | aio (gRPC only)
    streaming: bool = False
    #: gRPC channels (TCP connections) per generator; 0 = automatic.
    channels: int = 0
    timeout_s: float = 60.0
    #: Open loop: at most this many requests in flight; sends wait (and count as late) beyond it.
    max_outstanding: int = 4096
    distribution: str = "constant"  # constant | poisson
    seed: int = 0
    extra: dict = field(default_factory=dict)
    #: gRPC metadata on every call (perf_analyzer's -H).
    metadata: tuple[tuple[str, str], ...] = ()
    compression: str = "none"  # none | gzip | deflate
    #: TLS to the target (--ssl-grpc-*, or an https:// URL with --ssl-https-*); None: plaintext.
    tls: TlsSettings | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass
class Sample:
    """What a generator observed in one window."""

    lat_ns: np.ndarray
    errors: dict[str, int]
    sent: int = 0
    late: int = 0
    cpu_ns: int = 0
    #: End time (``now_ns`` clock) of each success, aligned with ``lat_ns`` (--profile-export-file).
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @staticmethod
    def merge(samples: list[Sample]) -> Sample:
        errors: dict[str, int] = {}
        for s in samples:
            for code, n in s.errors.items():
                errors[code] = errors.get(code, 0) + n
        lat = np.concatenate([s.lat_ns for s in samples]) if samples else np.empty(0, np.int64)
        return Sample(
            lat,
            errors,
            sum(s.sent for s in samples),
            sum(s.late for s in samples),
            sum(s.cpu_ns for s in samples),
            np.concatenate([s.end_ns for s in samples]) if samples else np.empty(0, np.int64),
        )


class Recorder:
    """Completions and failures with their end times; thread-safe, cut into windows by time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok: list[tuple[int, int]] = []
        self._err: list[tuple[int, str]] = []
        self.sent = 0
        self.late = 0
        self._sent_mark = 0
        self._late_mark = 0
        self._cpu_mark = time.process_time_ns()

    def ok(self, end: int, latency: int) -> None:
        with self._lock:
            self._ok.append((end, latency))

    def error(self, end: int, code: str) -> None:
        with self._lock:
            self._err.append((end, code))

    def cut(self, a: int, b: int) -> Sample:
        """Completions ending in [a, b); later ones stay for the next window, earlier ones are dropped."""
        with self._lock:
            ok, self._ok = self._ok, []
            err, self._err = self._err, []
        keep_ok = [item for item in ok if item[0] >= b]
        keep_err = [item for item in err if item[0] >= b]
        if keep_ok or keep_err:
            with self._lock:
                self._ok[:0] = keep_ok
                self._err[:0] = keep_err
        if ok:
            pairs = np.array(ok, dtype=np.int64)
            mask = (pairs[:, 0] >= a) & (pairs[:, 0] < b)
            lat, ends = pairs[mask, 1], pairs[mask, 0]
        else:
            lat = ends = np.empty(0, np.int64)
        errors: dict[str, int] = {}
        for end, code in err:
            if a <= end < b:
                errors[code] = errors.get(code, 0) + 1
        sent, late, cpu = self.sent, self.late, time.process_time_ns()
        sample = Sample(lat, errors, sent - self._sent_mark, late - self._late_mark, cpu - self._cpu_mark, ends)
        self._sent_mark, self._late_mark, self._cpu_mark = sent, late, cpu
        return sample


class Generator:
    """The interface of every load generator."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.recorder = Recorder()

    def start_concurrency(self, concurrency: int) -> None:
        raise NotImplementedError

    def start_rate(self, rate: float) -> None:
        raise NotImplementedError

    def cut(self, a: int, b: int) -> Sample:
        return self.recorder.cut(a, b)

    def stop(self, drain_s: float = 10.0) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LoopThreadGenerator(Generator):
    """A generator whose load runs on a thread of its own (``_run(mode, level)``, an asyncio loop).

    ``_run`` sets ``self._ready`` once the load is going, or ``self._error`` if it could not start.
    """

    thread_name = "fastoip-bench-loop"

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self, mode: str, level: float) -> None:
        raise NotImplementedError

    def _start(self, mode: str, level: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(mode, level), name=self.thread_name, daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def start_concurrency(self, concurrency: int) -> None:
        self._start("concurrency", concurrency)

    def start_rate(self, rate: float) -> None:
        self._start("rate", rate)


def schedule(rate: float, distribution: str, seed: int) -> Iterator[float]:
    """Successive gaps in ns of an open-loop schedule."""
    mean = 1e9 / rate
    if distribution == "poisson":
        rng = random.Random(seed)
        while True:
            yield rng.expovariate(1.0) * mean
    while True:
        yield mean


def auto_channels(concurrency: int) -> int:
    """Connections per generator when --grpc-channels is not given (see the measurements in cli.py)."""
    return max(1, min(4, concurrency))


def status_name(code: Any) -> str:
    return code.name if code is not None else "UNKNOWN"


# --------------------------------------------------------------------------- grpcio futures
class GrpcFutureLoad(Generator):
    """Sync grpcio channel, ``future()`` + done callbacks."""

    MAX_DEPTH = 16

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        import grpc

        if spec.streaming:
            raise ValueError("streaming needs the aio client")
        self._grpc = grpc
        self._channels: list[Any] = []
        self._calls: list[Any] = []
        self._requests = spec.requests
        self._next = 0
        self._running = False
        self._open = False
        self._inflight: set = set()
        self._send_lock = threading.Lock()
        self._tls = threading.local()
        self._backlog: queue.Queue[int | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._ok_lengths = spec.check.lengths

    def _open_channels(self, count: int) -> None:
        for index in range(count):
            channel = grpc_channel(self.spec.address, channel_options(index, self.spec.compression), self.spec.tls)
            self._channels.append(channel)
            self._calls.append(channel.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None))

    def _send(self, slot: int) -> None:
        # Counted, started and put in flight under the lock ``stop`` takes to end the run: a request a callback
        # thread sends as the run stops is either not sent or in flight when ``stop`` drains (it was counted as
        # sent but missing from ``_inflight`` for a moment, and its outcome could miss the sample).
        with self._send_lock:
            if not self._running:
                return
            k = self._next
            self._next = k + 1 if k + 1 < len(self._requests) else 0
            call = self._calls[slot % len(self._calls)]
            self.recorder.sent += 1
            t0 = now_ns()
            future = call.future(self._requests[k], timeout=self.spec.timeout_s, metadata=self.spec.metadata or None)
            self._inflight.add(future)
        future.add_done_callback(partial(self._done, t0, slot))

    def _done(self, t0: int, slot: int, future: Any) -> None:
        t1 = now_ns()
        try:
            response = future.result()
        except self._grpc.RpcError as exc:
            self.recorder.error(t1, status_name(exc.code()))
        except self._grpc.FutureCancelledError:
            self.recorder.error(t1, "CANCELLED")
        else:
            if len(response) in self._ok_lengths or self.spec.check.slow_ok(response):
                self.recorder.ok(t1, t1 - t0)
            else:
                self.recorder.error(t1, "BAD_RESPONSE")
        # only now: stop() drains until nothing is in flight, and must find this outcome recorded
        self._inflight.discard(future)
        if self._running and not self._open:
            # A future that is already done runs its callback inside add_done_callback:
            # bound that recursion and hand deep chains to the backlog thread.
            depth = getattr(self._tls, "depth", 0)
            if depth >= self.MAX_DEPTH:
                self._backlog.put(slot)
                return
            self._tls.depth = depth + 1
            try:
                self._send(slot)
            except Exception:  # noqa: BLE001 - channel closed under us while stopping
                pass
            finally:
                self._tls.depth = depth

    def _backlog_loop(self) -> None:
        while True:
            slot = self._backlog.get()
            if slot is None:
                return
            if self._running:
                try:
                    self._send(slot)
                except Exception:  # noqa: BLE001
                    pass

    def _start_threads(self, *targets: Any) -> None:
        for target in targets:
            thread = threading.Thread(target=target, name="fastoip-bench-load", daemon=True)
            thread.start()
            self._threads.append(thread)

    def start_concurrency(self, concurrency: int) -> None:
        self._open_channels(self.spec.channels or auto_channels(concurrency))
        self._running, self._open = True, False
        self._start_threads(self._backlog_loop)
        for slot in range(concurrency):
            self._send(slot)

    def start_rate(self, rate: float) -> None:
        self._open_channels(self.spec.channels or auto_channels(int(rate // 1000) + 1))
        self._running, self._open = True, True
        self._start_threads(partial(self._schedule_loop, rate))

    def _schedule_loop(self, rate: float) -> None:
        gaps = schedule(rate, self.spec.distribution, self.spec.seed)
        due = now_ns()
        slot = 0
        while self._running:
            now = now_ns()
            if due > now:
                time.sleep((due - now) / 1e9)
                continue
            if len(self._inflight) >= self.spec.max_outstanding:
                time.sleep(0.0005)
                continue
            if now - due > LATE_NS:
                self.recorder.late += 1
            try:
                self._send(slot)
            except Exception:  # noqa: BLE001
                return
            slot += 1
            due += int(next(gaps))

    def stop(self, drain_s: float = 10.0) -> None:
        with self._send_lock:  # no send is half done from here on (see _send)
            self._running = False
        self._backlog.put(None)
        for thread in self._threads:
            thread.join(timeout=drain_s)
        deadline = time.monotonic() + drain_s
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.005)
        for future in list(self._inflight):
            future.cancel()
        self._threads.clear()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self._calls.clear()


# --------------------------------------------------------------------------- grpc.aio
class GrpcAioLoad(LoopThreadGenerator):
    """grpc.aio on an event loop in its own thread; unary or bidirectional streaming."""

    thread_name = "fastoip-bench-aio"

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._running = False
        self._next = 0

    # The loop thread -------------------------------------------------------------
    def _run(self, mode: str, level: float) -> None:
        try:
            asyncio.run(self._main(mode, level))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc
            self._ready.set()

    async def _main(self, mode: str, level: float) -> None:
        import grpc

        self._grpc = grpc
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        count = self.spec.channels or auto_channels(int(level) if mode == "concurrency" else int(level // 1000) + 1)
        options = [channel_options(i, self.spec.compression) for i in range(count)]
        channels = [grpc_aio_channel(self.spec.address, option, self.spec.tls) for option in options]
        calls: list[Any]  # raw-bytes multicallables (no serializers), unary or streaming
        if self.spec.streaming:
            calls = [
                c.stream_stream(STREAM_METHOD, request_serializer=None, response_deserializer=None) for c in channels
            ]
        else:
            calls = [c.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None) for c in channels]
        self._running = True
        tasks: set = set()
        if mode == "concurrency":
            worker = self._stream_worker if self.spec.streaming else self._unary_worker
            tasks = {asyncio.ensure_future(worker(calls[i % count])) for i in range(int(level))}
        else:
            tasks = {asyncio.ensure_future(self._scheduler(calls, level))}
        self._ready.set()
        await self._stop_event.wait()
        self._running = False
        _done, pending = await asyncio.wait(tasks, timeout=self.spec.extra.get("drain_s", 10.0))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for channel in channels:
            await channel.close(grace=None)

    def _take(self) -> bytes:
        k = self._next
        self._next = k + 1 if k + 1 < len(self.spec.requests) else 0
        return self.spec.requests[k]

    def _record(self, t0: int, response: bytes | None, code: str | None) -> None:
        t1 = now_ns()
        if code is not None:
            self.recorder.error(t1, code)
        elif response is not None and (
            len(response) in self.spec.check.lengths or self.spec.check.slow_ok(response)
        ):
            self.recorder.ok(t1, t1 - t0)
        else:
            self.recorder.error(t1, "BAD_RESPONSE")

    async def _one(self, call: Any, request: bytes) -> None:
        self.recorder.sent += 1
        t0 = now_ns()
        try:
            response = await call(request, timeout=self.spec.timeout_s, metadata=self.spec.metadata or None)
        except self._grpc.aio.AioRpcError as exc:
            self._record(t0, None, status_name(exc.code()))
        except asyncio.CancelledError:
            self._record(t0, None, "CANCELLED")
            raise
        else:
            self._record(t0, response, None)

    async def _unary_worker(self, call: Any) -> None:
        while self._running:
            await self._one(call, self._take())

    async def _stream_worker(self, method: Any) -> None:
        from .verify import decode_stream_frame

        while self._running:
            stream = method(timeout=None, metadata=self.spec.metadata or None)
            try:
                while self._running:
                    self.recorder.sent += 1
                    t0 = now_ns()
                    await stream.write(self._take())
                    frame = await stream.read()
                    if frame is self._grpc.aio.EOF:
                        code = await stream.code()
                        self._record(t0, None, status_name(code) if code != self._grpc.StatusCode.OK else "STREAM_EOF")
                        break
                    # Field 1 (error_message) first means the server reported an error in-band.
                    if frame[:1] == b"\x0a":
                        message, _ = decode_stream_frame(frame)
                        if message:
                            self._record(t0, None, "STREAM_ERROR")
                            continue
                    self._record(t0, frame, None)
                if not self._running:
                    await stream.done_writing()
            except self._grpc.aio.AioRpcError as exc:
                self._record(now_ns(), None, status_name(exc.code()))
            finally:
                stream.cancel()

    async def _scheduler(self, calls: list[Any], rate: float) -> None:
        gaps = schedule(rate, self.spec.distribution, self.spec.seed)
        loop = asyncio.get_running_loop()
        inflight: set = set()
        due = now_ns()
        slot = 0
        try:
            while self._running:
                now = now_ns()
                if due > now:
                    await asyncio.sleep((due - now) / 1e9)
                    continue
                if len(inflight) >= self.spec.max_outstanding:
                    await asyncio.sleep(0.0005)
                    continue
                if now - due > LATE_NS:
                    self.recorder.late += 1
                task = loop.create_task(self._one(calls[slot % len(calls)], self._take()))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                slot += 1
                due += int(next(gaps))
        finally:
            if inflight:
                await asyncio.wait(set(inflight), timeout=self.spec.extra.get("drain_s", 10.0))

    # The interface ---------------------------------------------------------------
    def stop(self, drain_s: float = 10.0) -> None:
        self.spec.extra["drain_s"] = drain_s
        if self._loop is not None and self._stop_event is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop_event.set)
            except RuntimeError:  # loop already closed
                pass
        if self._thread is not None:
            self._thread.join(drain_s + 5)

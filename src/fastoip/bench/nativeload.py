"""The native gRPC load generator: ``fastoip.bench._h2client`` (nghttp2 in client mode, C loop, no GIL).

Closed loop only (concurrency C), unary ModelInfer or ``--streaming``
ModelStreamInfer (one stream per request in flight, the next request sent
when its answer is in, as the aio client), plaintext, no compression: the
cases where the grpcio clients were the bottleneck.  Everything else
(request-rate mode, TLS, gzip/deflate) stays on the grpcio
clients of :mod:`fastoip.bench.load`; :func:`native_usable` says which.

The engine runs on a thread of its own and records each completion (end time,
latency or error code) in preallocated C arrays; ``cut`` drains them into
numpy arrays and keeps the completions that end after the window for the next
one, as :class:`fastoip.bench.load.Recorder` does.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import numpy as np

from .load import INFER_METHOD, STREAM_METHOD, Generator, LoadSpec, Sample, auto_channels

try:
    from . import _h2client
except ImportError:  # built only where libnghttp2's headers exist
    _h2client = None  # type: ignore[assignment]

#: grpc-status codes by number (the gRPC spec's names, as grpc.StatusCode spells them).
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)


#: Unary calls whose largest request is this big or bigger get a connection each (up to LARGE_CONNECTIONS).
LARGE_REQUEST_BYTES = 64 * 1024
LARGE_CONNECTIONS = 16
#: Smaller unary calls share connections, this many calls in flight on each at most.
STREAMS_PER_CONNECTION = 100


def native_connections(concurrency: int, request_bytes: int, streaming: bool = False) -> int:
    """Connections for ``concurrency`` calls when ``--grpc-channels`` is not given.

    Measured against fastoip's server (benchmarks/RESULTS.md, 2026-11-27, server CPU per request under each
    layout): small unary calls cost the server ~20 % less over one connection than over four (the layout of
    h2load's faster run: more requests per read, more answers per write), and 602 KB calls ~30 % less with a
    connection per call than over four (as h2load's faster layout there).  Small messages on streams
    (ModelStreamInfer) likewise cost it ~12 % less over one connection than over four (8 rounds of 8), so they
    share connections as small unary calls do; large messages on streams keep min(C, 4) (not measured).
    """
    if request_bytes >= LARGE_REQUEST_BYTES:
        return auto_channels(concurrency) if streaming else max(1, min(concurrency, LARGE_CONNECTIONS))
    return max(1, -(-concurrency // STREAMS_PER_CONNECTION))


def native_available() -> bool:
    return _h2client is not None


def native_usable(spec: LoadSpec, mode: str) -> bool:
    """Whether the native client can carry this load (else a grpcio client does)."""
    return (
        native_available()
        and spec.protocol == "grpc"
        and mode == "concurrency"
        and spec.tls is None
        and spec.compression == "none"
    )


def error_name(code: int) -> str:
    if 0 <= code < len(STATUS_NAMES):
        return STATUS_NAMES[code]
    return str(_h2client.ERROR_NAMES.get(code, "UNKNOWN")) if _h2client is not None else "UNKNOWN"


class NativeGrpcLoad(Generator):
    """``concurrency`` unary calls in flight on ``channels`` HTTP/2 connections, driven from C."""

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        if _h2client is None:
            raise RuntimeError("fastoip.bench._h2client is not built (libnghttp2 headers missing)")
        if not native_usable(spec, "concurrency"):
            raise ValueError("the native client runs plaintext, uncompressed closed-loop load only")
        self._engine: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ok_end = np.empty(0, np.int64)
        self._ok_lat = np.empty(0, np.int64)
        self._err_end = np.empty(0, np.int64)
        self._err_code = np.empty(0, np.int64)
        self._sent = self._sent_mark = 0
        self._cpu_mark = time.process_time_ns()
        #: The HTTP/2 connections the load runs on (set when it starts).
        self.connections = 0

    def _connect(self, count: int) -> list[int]:
        fds = []
        for _ in range(count):
            sock = socket.create_connection((self.spec.host, self.spec.port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            fds.append(sock.detach())
        return fds

    def start_concurrency(self, concurrency: int) -> None:
        largest = max((len(request) for request in self.spec.requests), default=0)
        count = min(self.spec.channels or native_connections(concurrency, largest, self.spec.streaming), concurrency)
        fds = self._connect(count)
        self.connections = count
        self._engine = _h2client.Engine(
            fds,
            list(self.spec.requests),
            self.spec.check,
            self.spec.address,
            STREAM_METHOD if self.spec.streaming else INFER_METHOD,
            self.spec.metadata,
            self.spec.timeout_s,
            self.spec.streaming,
        )
        drain_s = float(self.spec.extra.get("drain_s", 10.0))
        self._cpu_mark = time.process_time_ns()
        self._thread = threading.Thread(
            target=self._run, args=(concurrency, drain_s), name="fastoip-bench-native", daemon=True
        )
        self._thread.start()

    def _run(self, concurrency: int, drain_s: float) -> None:
        try:
            self._engine.run(concurrency, drain_s)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc

    def start_rate(self, rate: float) -> None:
        raise ValueError("the native client has no request-rate mode (a grpcio client carries it)")

    def cut(self, a: int, b: int) -> Sample:
        if self._engine is None:
            return Sample(np.empty(0, np.int64), {})
        ok_end, ok_lat, err_end, err_code, sent = self._engine.drain()
        ok_end = np.concatenate([self._ok_end, ok_end])
        ok_lat = np.concatenate([self._ok_lat, ok_lat])
        err_end = np.concatenate([self._err_end, err_end])
        err_code = np.concatenate([self._err_code, err_code])
        later = ok_end >= b
        self._ok_end, self._ok_lat = ok_end[later], ok_lat[later]
        inside = (ok_end >= a) & ~later
        later_err = err_end >= b
        self._err_end, self._err_code = err_end[later_err], err_code[later_err]
        errors: dict[str, int] = {}
        codes, counts = np.unique(err_code[(err_end >= a) & ~later_err], return_counts=True)
        for code, n in zip(codes.tolist(), counts.tolist(), strict=True):
            name = error_name(int(code))
            errors[name] = errors.get(name, 0) + int(n)
        cpu = time.process_time_ns()
        sample = Sample(ok_lat[inside], errors, sent - self._sent_mark, 0, cpu - self._cpu_mark, ok_end[inside])
        self._sent_mark, self._cpu_mark = sent, cpu
        return sample

    def stop(self, drain_s: float = 10.0) -> None:
        if self._engine is not None:
            self._engine.stop()
        if self._thread is not None:
            self._thread.join(drain_s + 5)
            self._thread = None
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread is None:
            self._engine = None  # closes the connections

"""Which load generator carries a level, and the factory that builds it.

The generators live in :mod:`fastoip.bench.load` (the interface and the gRPC
clients) and :mod:`fastoip.bench.httpload` (HTTP/1.1, built on that interface);
this module sits above both, so neither imports the other's siblings back.

Which is faster depends on the level.  Measured against the ceiling server
(server on CPU 0, client on CPU 1 of this project's 2-vCPU VM, 1.5 s points,
medians of 5 interleaved pairs on a shared, noisy machine): c=1 future 1433
req/s (p50 421 µs) vs aio 1174 (p50 584 µs); c=8 a tie (4858 vs 4251, 2 of
5 pairs to aio); c=64 aio 5645 vs 4947 (4 of 5 pairs); open loop at 1500/s
aio costs 277 client CPU-µs a request vs 329.  Hence ``auto`` (the default):
future below concurrency 8, where its lower per-call latency matters most,
aio from 8 up and in request-rate mode.  One channel vs min(C, 4) channels
made no measurable difference at c=64.

Both grpcio clients stay far below h2load at high rates (grpcio's C core and
asyncio per call), so ``auto`` takes the native client
(:mod:`fastoip.bench.nativeload`, nghttp2 from C) wherever it can carry the
load: closed loop (unary or ``--streaming``), plaintext, uncompressed, and the
extension built.
"""

from __future__ import annotations

from .httpload import HttpLoad
from .load import Generator, GrpcAioLoad, GrpcFutureLoad, LoadSpec
from .nativeload import NativeGrpcLoad, native_usable

#: ``auto`` picks aio from this concurrency up (and in request-rate mode).
AIO_FROM_CONCURRENCY = 8


def resolve_client(spec: LoadSpec, mode: str, level: float) -> str:
    """The client that carries a level: ``http``, ``native-stream``, ``aio-stream``, ``native``, ``future`` or
    ``aio``."""
    if spec.protocol == "http":
        return "http"
    if spec.streaming:
        native = spec.client in ("auto", "native") and native_usable(spec, mode)
        return "native-stream" if native else "aio-stream"
    if spec.client != "auto":
        return spec.client
    if native_usable(spec, mode):
        return "native"
    return "aio" if mode != "concurrency" or level >= AIO_FROM_CONCURRENCY else "future"


def make_generator(spec: LoadSpec, mode: str = "concurrency", level: float = 1) -> Generator:
    """The generator for a spec and the level it will run (``auto`` resolves by level)."""
    client = resolve_client(spec, mode, level)
    if client == "http":
        return HttpLoad(spec)
    if client in ("native", "native-stream"):
        return NativeGrpcLoad(spec)
    if client in ("aio", "aio-stream"):
        return GrpcAioLoad(spec)
    return GrpcFutureLoad(spec)

"""``fastoip bench``: throughput and latency of any Open Inference Protocol (V2) server.

A perf_analyzer-class load generator written for Python clients that must keep
up with a fast server: requests are encoded once, calls carry raw bytes (no
protobuf objects on the hot path), responses are checked by length after one
full decode, and several client processes can share the load.

Modules, one job each:

- :mod:`.target`   URL parsing and the error type of the package.
- :mod:`.control`  the non-inference RPCs: readiness, metadata, config, statistics.
- :mod:`.inputs`   model metadata/config -> tensor shapes -> encoded requests.
- :mod:`.verify`   decode responses, check shapes, reference outputs of the demo models.
- :mod:`.probe`    each distinct request sent once before the load, its response fully checked.
- :mod:`.load`     gRPC load generators (future callbacks, grpc.aio, streaming).
- :mod:`.httpload` HTTP/1.1 keep-alive load generator over asyncio.
- :mod:`.generators` which load generator carries a level, and the factory that builds it.
- :mod:`.shm`      ``--shared-memory system|cuda``: tensors in shared-memory regions.
- :mod:`.tls`      TLS for the bench's connections (perf_analyzer's ``--ssl-*`` flags).
- :mod:`.procs`    the same generators spread over several client processes.
- :mod:`.measure`  windows, stability, percentiles, server-side statistics deltas.
- :mod:`.report`   the result schema, the table, JSON, CSV and ``compare``.
- :mod:`.perf_analyzer` perf_analyzer compatibility: its CSV layout, GPU metrics, the flags refused.
- :mod:`.progress` the live progress line.
- :mod:`.ceiling`  a fixed-response server: the client's own limit.
- :mod:`.local`    start/stop a local fastoip on the demo repository, CPU pinning.
- :mod:`.cli`      the command line that ties them together.
"""

from __future__ import annotations

from .target import BenchError, Target

__all__ = ["BenchError", "Target"]

"""The native frontend's calls: one object per HTTP/2 stream, from first message to trailers.

Rules:
- Everything here runs on the connection's event loop; model execution does
  not, but for one case: a dynamic batcher without a queue delay whose CPU
  batches take under ``scheduling.batcher.INLINE_MAX_NS`` runs the loop pass's
  burst on the loop when it releases the burst's wake-up (the thread hop cost
  more than the model).  Infer requests start through :class:`CoreCalls` (the
  one place that calls ``Core.start``) and their completion comes back to the
  loop by :func:`fastoip.core.on_loop`.
- ModelInfer / ModelStreamInfer use the codec (no protobuf objects); every
  other RPC is the transport-free translation in :mod:`.service`, cheap ones on
  the loop, the rest (model load, shared memory, settings) on a small pool.
- A call answers once: ``finished`` guards against a late completion after a
  cancel, a deadline or a reset.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from threading import get_ident
from typing import Any, Final, Protocol, cast

from google.protobuf.message import DecodeError, Message

from ... import _codec
from ..._codec import encode_infer_response_parts
from ...core import CallContext, Core, FinishedCall, Ticket, on_loop
from ...errors import InferenceError
from ...tracing import FrontendTrace
from ...types import InferRequest, InferResponse
from ..forward_headers import HeaderForwarder, forwarder
from ..restricted import RestrictedFeatures, Restriction, grpc_method_restrictions
from . import protocol as wire  # gRPC over HTTP/2 rules (fastoip.wire is the codecs)
from .limits import RequestBudget
from .mlserver_shapes import answers_as_mlserver
from .service import (
    CANCELLABLE_RPCS,
    CLIENT_AWARE_RPCS,
    HEALTH_SERVICE,
    HEALTH_UNARY,
    SERVICE,
    UNARY,
    GrpcService,
    accept_mlserver_shapes,
    decode_request,
    encode_final,
    encode_partial,
    error_echo,
    last_response,
    take_empty_final_flag,
)

log = logging.getLogger("fastoip.grpc")

#: An output at least this large goes out from its array instead of being copied into the response message
#: (``_codec.encode_infer_response_parts``); smaller ones are copied, cheaper than a part of their own.
LARGE_OUTPUT: Final = 64 * 1024

#: RPCs cheap enough to answer on the loop (no I/O, no model load, bounded work).  The readiness RPCs
#: (:data:`READINESS_RPCS`) are, unless a model's own ``is_ready`` may make them wait: those go to the Core's
#: readiness pool (``Core.readiness_waits``).
INLINE_RPCS = frozenset({
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
    "ModelStatistics", "RepositoryIndex", "Check",
})


#: Readiness RPC -> (model, version) its request asks about (model None: the server's readiness).
READINESS_RPCS: Final[dict[str, Callable[[Any], tuple[str | None, str]]]] = {
    "ServerReady": lambda request: (None, ""),
    "ModelReady": lambda request: (request.name, request.version),
}


def health_asks(request: Any) -> tuple[str | None, str]:
    """grpc.health.v1 Check: the server's readiness, or a model's (its service name)."""
    return (request.service or None) if request.service != SERVICE else None, ""


class CoreCalls:
    """Every call the native frontend makes into the Core (``Core.start``, the one verb).

    ``start`` starts without blocking; ``on_finished(job)`` runs on the loop,
    where ``job.error`` (an InferenceError or None) and ``job.response`` are read.
    Direct-scheduler models go to the Core's worker pool (the loop does not lend
    its thread: ``caller_runs`` stays False); only a quick dynamic batcher's burst
    runs on the loop (see the module rules).
    """

    def __init__(self, core: Core, loop: asyncio.AbstractEventLoop, forward: HeaderForwarder | None = None) -> None:
        self.core = core
        self.loop = loop
        #: Triton's --grpc-header-forward-pattern (None: no metadata becomes a parameter).
        self.forward = forward
        #: Stream request bytes held, per stream and server-wide (issue 27; the server sets its own).
        self.budget = RequestBudget()
        #: ``--mlserver-grpc-stream``: ModelStreamInfer answers models from model-settings.json with MLServer's
        #: bare ModelInferResponse messages (:mod:`.mlserver_shapes`).
        self.mlserver_streams = False

    def start(
        self,
        request: InferRequest,
        deadline_ns: int,
        on_finished: Callable[[FinishedCall], None],
        headers: dict[bytes, bytes] | None = None,
        on_response: Callable[[FinishedCall, InferResponse], None] | None = None,
        frontend_trace: FrontendTrace | None = None,
    ) -> Ticket:
        """Start ``request``; raises InferenceError when it cannot start (unknown model, shutting down).

        ``headers``: the call's request headers, for the Core's tracing (read only while tracing is on).
        ``on_response`` (from :meth:`on_loop`): where a decoupled model's responses go.
        """
        if self.forward is not None:
            self.forward.apply(headers, request.parameters)
        # no deadline and nothing to trace (tracing was off when the call began: it has no frontend trace): the
        # Core needs no context
        call: CallContext | None = None
        if deadline_ns or frontend_trace is not None:
            call = CallContext(deadline_ns, trace_headers=headers, frontend_trace=frontend_trace)
        # (this runs on the loop's thread: the completion's hop knows it by its ident)
        return self.core.start(request, call, on_loop(self.loop, on_finished, get_ident()), on_response)

    def on_loop(
        self, on_response: Callable[[FinishedCall, InferResponse], None]
    ) -> Callable[[FinishedCall, InferResponse], None]:
        """``on_response`` run on the loop (the responses of one job keep their order: one thread sends them)."""
        return on_loop(self.loop, on_response, get_ident())

    @staticmethod
    def cancel(job: Ticket) -> None:
        """The client went away or its deadline passed: a queued job leaves its queue."""
        job.cancel()


class Responder(Protocol):
    """What a call needs from its connection to answer."""

    #: The peer's address (host), for what is bounded per client (shared-memory registrations).
    peer: str

    def send_headers(self, stream_id: int) -> None: ...
    def send_message(self, stream_id: int, message: bytes | list[bytes | memoryview]) -> None: ...
    def finish(self, stream_id: int, code: int, message: str = "") -> None: ...
    def answer(self, stream_id: int, message: bytes | list[bytes | memoryview]) -> None:
        """A unary call's whole answer: headers, its one message, OK (``send_headers``, ``send_message``,
        ``finish(OK)`` in one call)."""
        ...


class Call:
    """One RPC on one stream; the connection feeds it messages and the end of the request side."""

    __slots__ = ("stream_id", "out", "deadline_ns", "finished", "headers_sent", "messages", "headers")
    #: Whether the request side is a stream of messages (it may idle between them).
    streaming = False

    def __init__(self, stream_id: int, out: Responder, deadline_ns: int) -> None:
        self.stream_id = stream_id
        self.out = out
        self.deadline_ns = deadline_ns
        self.finished = False
        self.headers_sent = False
        self.messages: list[wire.Payload] = []
        #: The request's headers (set by the connection); the Core's tracing reads traceparent from them.
        self.headers: dict[bytes, bytes] | None = None

    def on_message(self, data: wire.Payload) -> None:
        self.messages.append(data)

    def on_end(self) -> None:
        """The client half-closed: a unary call has its request now."""
        if self.finished:
            return
        if len(self.messages) != 1:
            self.fail(wire.INTERNAL, f"a unary call takes one request message, received {len(self.messages)}")
            return
        self.run(self.messages.pop())

    def run(self, data: wire.Payload) -> None:
        raise NotImplementedError

    def working(self) -> bool:
        """Whether a request of this call is being worked on while its request side is open (streams only)."""
        return False

    def cancel(self) -> None:
        """Reset by the client, connection lost, or deadline: stop; the answer (if any) is the caller's."""
        self.finished = True

    def fail(self, code: int, message: str) -> None:
        if not self.finished:
            self.finished = True
            self.out.finish(self.stream_id, code, message)

    def reply(self, message: bytes | list[bytes | memoryview]) -> None:
        """The one response message of a unary call, then OK."""
        if self.finished:
            return
        self.finished = True
        self.headers_sent = True
        self.out.answer(self.stream_id, message)


class InferCall(Call):
    """ModelInfer: codec in, Core completion path, codec out."""

    __slots__ = ("core", "job", "frontend")

    def __init__(self, stream_id: int, out: Responder, deadline_ns: int, core: CoreCalls) -> None:
        super().__init__(stream_id, out, deadline_ns)
        self.core = core
        self.job: Ticket | None = None
        #: Triton's GRPC_WAITREAD_* / GRPC_SEND_* timestamps while tracing is on (the headers arrived now).
        self.frontend: FrontendTrace | None = None
        if core.core.tracing:
            self.frontend = FrontendTrace()
            self.frontend.stamp("GRPC_WAITREAD_START")

    def run(self, data: wire.Payload) -> None:
        frontend = self.frontend
        if frontend is not None:
            frontend.stamp("GRPC_WAITREAD_END")
        request = decode_request(data)  # the codec reads any buffer; views on it stay valid
        if not isinstance(request, InferRequest):
            loose = accept_mlserver_shapes(self.core.core, request)
            if loose is None:
                self.fail(wire.INVALID_ARGUMENT, request.status_message)
                return
            request = loose
        try:
            self.job = self.core.start(request, self.deadline_ns, self.done, self.headers, frontend_trace=frontend)
        except InferenceError as exc:
            self.fail(wire.status_code(exc.grpc_code), exc.message)

    def done(self, job: FinishedCall) -> None:
        self.job = None
        frontend = self.frontend
        try:
            if self.finished:
                return
            if job.error is not None:
                self.fail(wire.status_code(job.error.grpc_code), job.error.message)
                return
            response = job.response
            assert response is not None  # no error: a response is set
            if frontend is not None:
                frontend.stamp("GRPC_SEND_START")
            try:
                # outputs of LARGE_OUTPUT bytes or more are sent from their arrays (no encode copy)
                body = encode_infer_response_parts(response, LARGE_OUTPUT)
            except Exception as exc:  # an output the codec cannot encode: the client hears why
                self.fail(wire.INTERNAL, f"cannot encode the response: {exc}")
                return
            self.reply(body[0] if len(body) == 1 and type(body[0]) is bytes else body)
            if frontend is not None:
                frontend.stamp("GRPC_SEND_END")  # the response queued on the connection
        finally:
            if frontend is not None:
                frontend.done()

    def cancel(self) -> None:
        super().cancel()
        if self.job is not None:
            self.core.cancel(self.job)
        if self.frontend is not None:
            self.frontend.done()


#: The request header that asks for Triton's stream error mode (its grpc frontend's ``triton_grpc_error``).
GRPC_ERROR_HEADER = b"triton_grpc_error"


class StreamInferCall(Call):
    """ModelStreamInfer: every request starts as it arrives, every response goes out as it finishes.

    An error on one request is that response's ``error_message``; the stream
    ends (OK) once the client half-closed and every request was answered.  A
    decoupled model's responses go out as they are produced (see :mod:`.service`).
    With the header ``triton_grpc_error: true`` (Triton's stream mode) the first
    error ends the stream with its gRPC status instead, and cancels the rest.
    """

    __slots__ = ("core", "jobs", "started", "answered", "half_closed", "partial_sink", "empty_final", "held",
                 "held_bytes", "traces", "wait_start_ns", "mlserver_jobs")
    streaming = True

    def __init__(self, stream_id: int, out: Responder, deadline_ns: int, core: CoreCalls) -> None:
        super().__init__(stream_id, out, deadline_ns)
        self.core = core
        self.jobs: set[Ticket] = set()
        self.started = 0
        self.answered = 0
        self.half_closed = False
        self.partial_sink = core.on_loop(self.partial)
        #: Jobs whose request asked for an empty final response.
        self.empty_final: set[Ticket] = set()
        #: issue 27: each unanswered job's message size, counted in core.budget until it is answered.
        self.held: dict[Ticket, int] = {}
        self.held_bytes = 0
        #: Triton's GRPC_WAITREAD_* / GRPC_SEND_* timestamps of each traced request of the stream, by job.
        self.traces: dict[Ticket, FrontendTrace] = {}
        #: When the stream began waiting for its next message (its GRPC_WAITREAD_START if that one is traced).
        self.wait_start_ns = time.monotonic_ns()
        #: Jobs answered with MLServer's stream messages (``CoreCalls.mlserver_streams``).
        self.mlserver_jobs: set[Ticket] = set()

    def on_message(self, data: wire.Payload) -> None:
        if self.finished:
            return
        size = len(data)
        refusal = self.core.budget.take(self.held_bytes, size)
        if refusal is not None:  # issue 27: too many request bytes waiting: the stream ends
            log.warning("gRPC ModelStreamInfer ended: %s", refusal)
            self.drop_jobs()
            self.fail(wire.RESOURCE_EXHAUSTED, refusal)
            return
        self.started += 1
        frontend: FrontendTrace | None = None
        if self.core.core.tracing:
            # as Triton's stream reader: waiting for this message began when the previous one was read
            now = time.monotonic_ns()
            frontend = FrontendTrace()
            frontend.stamp("GRPC_WAITREAD_START", self.wait_start_ns)
            frontend.stamp("GRPC_WAITREAD_END", now)
            self.wait_start_ns = now
        else:
            self.wait_start_ns = time.monotonic_ns()
        try:
            request = decode_request(data)  # the codec reads any buffer
        except BaseException:
            self.core.budget.give(size)
            raise
        if not isinstance(request, InferRequest):
            loose = accept_mlserver_shapes(self.core.core, request)
            if loose is None:
                self.core.budget.give(size)
                self.answer(_codec.encode_stream_response(None, request.status_message))
                return
            request = loose
        mlserver = self.core.mlserver_streams and answers_as_mlserver(self.core.core, request)
        try:
            empty_final = take_empty_final_flag(request) if request.parameters else False
            job = self.core.start(
                request, self.deadline_ns, self.done, self.headers, self.partial_sink, frontend_trace=frontend
            )
        except InferenceError as exc:
            self.core.budget.give(size)
            # MLServer's servicer, and Triton's triton_grpc_error mode: an error ends the stream with its status
            if mlserver or self.errors_end_stream():
                self.drop_jobs()
                self.fail(wire.status_code(exc.grpc_code), exc.message)
                return
            self.answer(_codec.encode_stream_response(error_echo(request), exc.message))
            return
        if mlserver:
            self.mlserver_jobs.add(job)
        if frontend is not None:
            self.traces[job] = frontend  # done() runs later, on this loop
        self.held[job] = size
        self.held_bytes += size
        self.jobs.add(job)
        if empty_final:
            self.empty_final.add(job)

    def working(self) -> bool:
        return bool(self.jobs)

    def errors_end_stream(self) -> bool:
        """Whether the client asked for Triton's ``triton_grpc_error`` mode (read on an error only)."""
        headers = self.headers
        return headers is not None and headers.get(GRPC_ERROR_HEADER) == b"true"

    def release(self, job: Ticket) -> None:
        size = self.held.pop(job, 0)
        if size:
            self.held_bytes -= size
            self.core.budget.give(size)

    def partial(self, job: FinishedCall, response: InferResponse) -> None:
        """A decoupled model's response that is not the last (on the loop, in the order produced)."""
        if not self.finished:
            self.send(_codec.encode_infer_response(response) if job in self.mlserver_jobs else encode_partial(response))

    def done(self, job: FinishedCall) -> None:
        self.jobs.discard(job)
        self.release(job)
        frontend = self.traces.pop(job, None) if self.traces else None
        try:
            if self.finished:
                return
            if frontend is not None:
                frontend.stamp("GRPC_SEND_START")
            response = job.response
            error = job.error
            if self.mlserver_jobs and job in self.mlserver_jobs:
                self.mlserver_jobs.discard(job)
                self.done_as_mlserver(job)
            elif error is not None and self.errors_end_stream():  # Triton's mode: the stream ends with it
                self.drop_jobs()
                self.fail(wire.status_code(error.grpc_code), error.message)
            elif response is None:  # an error, or a decoupled request's final flag
                self.answer(encode_final(job, job in self.empty_final))
                self.empty_final.discard(job)
            else:
                if self.empty_final:  # asked for by a request that had one response anyway
                    self.empty_final.discard(job)
                try:
                    body = _codec.encode_stream_response(last_response(job))
                except Exception as exc:
                    body = _codec.encode_stream_response(
                        error_echo(job.request), f"cannot encode the response: {exc}"
                    )
                self.answer(body)
            if frontend is not None:
                frontend.stamp("GRPC_SEND_END")  # the response queued on the connection
        finally:
            if frontend is not None:
                frontend.done()

    def done_as_mlserver(self, job: FinishedCall) -> None:
        """MLServer's last message of one request: its bare response (none after a decoupled request's
        stream), or its error as the stream's status."""
        error = job.error
        if error is not None:
            self.drop_jobs()
            self.fail(wire.status_code(error.grpc_code), error.message)
            return
        response = job.response
        try:
            self.answer(None if response is None else _codec.encode_infer_response(response))
        except Exception as exc:  # an output the codec cannot encode: the client hears why
            self.drop_jobs()
            self.fail(wire.INTERNAL, f"cannot encode the response: {exc}")

    def send(self, body: bytes) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            self.out.send_headers(self.stream_id)
        self.out.send_message(self.stream_id, body)

    def answer(self, body: bytes | None) -> None:
        """The last message of one request (None: the request ends without one)."""
        if body is not None:
            self.send(body)
        self.answered += 1
        self.end_when_answered()

    def on_end(self) -> None:
        self.half_closed = True
        self.end_when_answered()

    def end_when_answered(self) -> None:
        if self.half_closed and self.answered == self.started and not self.finished:
            self.finished = True
            if not self.headers_sent:
                self.headers_sent = True
                self.out.send_headers(self.stream_id)
            self.out.finish(self.stream_id, wire.OK)

    def cancel(self) -> None:
        super().cancel()
        self.drop_jobs()

    def drop_jobs(self) -> None:
        """Cancel every unanswered request of the stream and give their bytes back to the budget."""
        for job in list(self.jobs):
            self.core.cancel(job)
            self.release(job)
        self.jobs.clear()
        self.empty_final.clear()
        self.mlserver_jobs.clear()
        for frontend in self.traces.values():
            frontend.done()
        self.traces.clear()


class UnaryCall(Call):
    """Any other unary RPC: protobuf in, the service's translation, protobuf out."""

    __slots__ = ("method", "request_type", "inline", "executor", "loop", "gone", "readiness")

    def __init__(
        self,
        stream_id: int,
        out: Responder,
        deadline_ns: int,
        method: Callable[[Message], Message],
        request_type: type[Message],
        inline: bool,
        executor: Executor,
        loop: asyncio.AbstractEventLoop,
        gone: threading.Event | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        """``gone``: set when the call is cancelled (reset, connection lost, deadline), for a method that stops
        then (``CANCELLABLE_RPCS``).  ``readiness`` (a readiness RPC): what it asks, and the pool for a readiness
        that may wait on model code."""
        super().__init__(stream_id, out, deadline_ns)
        self.method = method
        self.request_type = request_type
        self.inline = inline
        self.executor = executor
        self.loop = loop
        self.gone = gone
        self.readiness = readiness

    def cancel(self) -> None:
        self.finished = True
        if self.gone is not None:  # issue 37: a load whose client went away stops at its next step
            self.gone.set()

    def run(self, data: wire.Payload) -> None:
        try:
            request = self.request_type.FromString(bytes(data))
        except DecodeError as exc:
            self.fail(wire.INVALID_ARGUMENT, f"malformed {self.request_type.DESCRIPTOR.name}: {exc}")
            return
        executor = self.executor
        inline = self.inline
        readiness = self.readiness
        if readiness is not None:  # issue 36: a model's own is_ready never holds the loop
            model, version = readiness.asks(request)
            if readiness.core.readiness_waits(model, version):
                inline, executor = False, readiness.core.readiness_pool
        if inline:
            self.complete(*self.invoke(request))
        else:
            try:
                future = self.loop.run_in_executor(executor, self.invoke, request)
            except RuntimeError:  # the control pool is shut down: the server is stopping
                self.fail(wire.UNAVAILABLE, "the server is shutting down")
                return
            except InferenceError as full:  # the readiness pool is full (core/readiness_pool.py)
                self.fail(wire.status_code(full.grpc_code), full.message)
                return
            future.add_done_callback(lambda f: self.complete(*f.result()))

    def invoke(self, request: Message) -> tuple[int, bytes | str]:
        """(OK, response bytes) or (status, message); runs on the loop or a pool thread."""
        try:
            return wire.OK, self.method(request).SerializeToString()
        except InferenceError as exc:
            return wire.status_code(exc.grpc_code), exc.message
        except Exception as exc:  # a bug: the client gets UNKNOWN as grpcio would answer, the log the trace
            log.exception("gRPC %s failed", self.request_type.DESCRIPTOR.name)
            return wire.UNKNOWN, f"{type(exc).__name__}: {exc}"

    def complete(self, code: int, result: bytes | str) -> None:
        if code == wire.OK:
            assert isinstance(result, bytes)
            self.reply(result)
        else:
            assert isinstance(result, str)
            self.fail(code, result)


class Readiness:
    """What a readiness RPC asks about (``asks(request)`` -> (model or None, version)), and the Core it asks."""

    __slots__ = ("asks", "core")

    def __init__(self, asks: Callable[[Any], tuple[str | None, str]], core: Core) -> None:
        self.asks = asks
        self.core = core


class Dispatcher:
    """``:path`` -> a new call for that RPC (None for paths this server does not serve)."""

    def __init__(
        self,
        core: Core,
        loop: asyncio.AbstractEventLoop,
        executor: Executor,
        restricted: RestrictedFeatures | None = None,
        forward_header_pattern: str | None = None,
    ) -> None:
        self.core_calls = CoreCalls(core, loop, forwarder(forward_header_pattern))
        #: :path of a restricted RPC -> the header it needs (--grpc-restricted-protocol); empty: none.
        self.restricted: dict[bytes, Restriction] = {
            path.encode(): restriction
            for path, restriction in grpc_method_restrictions(
                restricted or RestrictedFeatures({}), SERVICE, HEALTH_SERVICE
            ).items()
        }
        self.loop = loop
        self.executor = executor
        service = GrpcService(core)
        self.unary: dict[bytes, tuple[Callable[[Message], Message], type[Message], bool]] = {}
        for name, (request_type, _) in UNARY.items():
            self.unary[f"/{SERVICE}/{name}".encode()] = (getattr(service, name), request_type, name in INLINE_RPCS)
        #: RPCs told the peer's address (bounded per client), with their method.
        self.client_aware: dict[bytes, Callable[..., Message]] = {
            f"/{SERVICE}/{name}".encode(): getattr(service, name) for name in CLIENT_AWARE_RPCS
        }
        #: RPCs that stop when their client goes away, with their method.
        self.cancellable: dict[bytes, Callable[..., Message]] = {
            f"/{SERVICE}/{name}".encode(): getattr(service, name) for name in CANCELLABLE_RPCS
        }
        for name, (request_type, _) in HEALTH_UNARY.items():
            check = cast("Callable[[Message], Message]", service.HealthCheck)
            self.unary[f"/{HEALTH_SERVICE}/{name}".encode()] = (check, request_type, True)
        #: Readiness RPCs' paths -> what each asks (answered off the loop when a model's is_ready may wait).
        self.readiness: dict[bytes, Readiness] = {
            f"/{SERVICE}/{name}".encode(): Readiness(asks, core) for name, asks in READINESS_RPCS.items()
        }
        for name in HEALTH_UNARY:
            self.readiness[f"/{HEALTH_SERVICE}/{name}".encode()] = Readiness(health_asks, core)
        self.infer_path = f"/{SERVICE}/ModelInfer".encode()
        self.stream_path = f"/{SERVICE}/ModelStreamInfer".encode()

    def new_call(self, path: bytes, stream_id: int, out: Responder, deadline_ns: int) -> Call | None:
        if path == self.infer_path:
            return InferCall(stream_id, out, deadline_ns, self.core_calls)
        if path == self.stream_path:
            return StreamInferCall(stream_id, out, deadline_ns, self.core_calls)
        entry = self.unary.get(path)
        if entry is None:
            return None
        method, request_type, inline = entry
        aware = self.client_aware.get(path)
        if aware is not None:  # (rare RPCs: registrations)
            peer = out.peer
            method = lambda request: aware(request, client=peer)  # noqa: E731
        gone: threading.Event | None = None
        cancellable = self.cancellable.get(path)
        if cancellable is not None:  # (rare RPCs: loads)
            gone = threading.Event()
            event = gone
            method = lambda request: cancellable(request, client_gone=event)  # noqa: E731
        return UnaryCall(
            stream_id, out, deadline_ns, method, request_type, inline, self.executor, self.loop, gone,
            self.readiness.get(path),
        )


def deadline_from(timeout_ns: int | None) -> int:
    """Absolute monotonic deadline for a grpc-timeout (0: none)."""
    return time.monotonic_ns() + timeout_ns if timeout_ns else 0

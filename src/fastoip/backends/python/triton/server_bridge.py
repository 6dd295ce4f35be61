"""What Triton Python models reach in the server: BLS calls through the Core, model control, logs, custom metrics.

Rules:
- Each Core has its own :class:`ServerLink` (kept by the Core's
  :class:`~fastoip.core_link.CoreLink`, which rides in its repository's
  options to the models it loads), so with several Cores in one process (embedded
  servers) a model's BLS calls go to the Core that loaded it.  BLS requests go
  through ``Core.infer`` / ``Core.start`` (the batcher, statistics and
  everything else a client's request gets), never a socket.  Every Core call of
  the Python backend is in this module.
- Errors of a BLS call come back inside the response (a ``TritonError`` with
  Triton's code), as Triton's ``exec()`` returns them.
- Custom metric families (``pb_utils.MetricFamily``) live in the Core's
  :class:`~fastoip.metrics.custom.CustomMetrics` (``ServerLink.custom_metrics``),
  exported on ``/metrics`` after the server's own families.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ....core_link import CoreAccess, CoreLink
from ....errors import (
    AlreadyExists,
    Cancelled,
    InferenceError,
    InternalError,
    InvalidArgument,
    NotFound,
    Unavailable,
    UnknownError,
    Unsupported,
)
from ....metrics.custom import MetricError
from ....pyworker import utils as pb
from ....scheduling.call_chain import CallChain
from ....types import InferInput, InferRequest, InferResponse, RequestedOutput

log = logging.getLogger("fastoip.python.model")

#: A response as plain data (see ``triton_runner.ResponseData``).
ResponseData = tuple[list, "tuple[int, str] | None", dict]


class ServerLink:
    """What one Core's Triton Python models reach in it: BLS, readiness, model control, custom metrics.

    One per Core (:func:`link_of`: the Core's :class:`~fastoip.core_link.CoreLink` keeps it); it registers
    :meth:`end_workers` with the Core's link, which runs it when the shutdown ran past ``--exit-timeout``."""

    def __init__(self, core_link: CoreLink) -> None:
        self.core_link = core_link
        #: The worker processes of this Core's models, for :meth:`end_workers`: each adds itself when it starts
        #: and leaves when it died (a plain set: the compiled WorkerProcess takes no weak references).
        self.workers: set[Any] = set()
        #: Set by :meth:`end_workers`: a worker that dies now is not restarted.
        self.stopping = False
        #: The metric families this Core's models define (exported by the Core).
        self.custom_metrics = core_link.custom_metrics
        core_link.on_end(self.end_workers)

    def end_workers(self) -> int:
        """Kill every worker process of this Core's models (the server's shutdown ran past ``--exit-timeout``):
        what they ran fails, and none is restarted.  How many were running."""
        self.stopping = True
        ended = 0
        for worker in list(self.workers):
            if worker.alive:
                worker.process.kill()
                ended += 1
        return ended

    def call_of(self, data: Any, chain: CallChain = ()) -> Any:
        """The call context of a BLS request: its call chain (the instances waiting for it) and its trace parent
        (``trace=request.trace()``) when it has one."""
        trace = data[6]
        call_type = self.core_link.call_type
        if (trace is None and not chain) or call_type is None:
            return None
        parent = (int(trace[0]), dict(trace[1] or {})) if trace is not None else None
        return call_type(trace_parent=parent, chain=chain)

    def _core(self) -> CoreAccess:
        core = self.core_link.core
        if core is None:
            raise InternalError("BLS: this model's repository has no server core")
        return core

    def infer(
        self, model_name: str, model_version: Any, data: Any, timeout_us: int = 0, chain: CallChain = ()
    ) -> ResponseData:
        """One BLS request through the Core (``chain``: the instances waiting for it); its error inside the
        result."""
        try:
            request = infer_request(model_name, model_version, data, timeout_us)
            return response_data(self._core().infer(request, self.call_of(data, chain)))
        except InferenceError as exc:
            return error_data(exc)

    def stream(
        self,
        model_name: str,
        model_version: Any,
        data: Any,
        deliver: Callable[[ResponseData | None, bool], None],
        timeout_us: int = 0,
        chain: CallChain = (),
    ) -> Any:
        """A BLS request whose responses (a decoupled model's stream) go to ``deliver(response, final)``; the
        request's job (``cancel()`` cancels it), or None when it failed before it started."""
        try:
            request = infer_request(model_name, model_version, data, timeout_us)

            def on_response(job: Any, response: InferResponse) -> None:
                deliver(response_data(response), False)

            def on_done(job: Any) -> None:
                if job.error is not None:
                    deliver(error_data(job.error), True)
                elif job.response is not None:
                    deliver(response_data(job.response), True)
                elif job.final_alone:  # Triton's iterator yields an empty last response for a final flag alone
                    deliver(empty_response(), True)
                else:  # the final flag came with the last response, already delivered
                    deliver(None, True)

            return self._core().start(request, self.call_of(data, chain), on_done, on_response)
        except InferenceError as exc:
            deliver(error_data(exc), True)
            return None

    def model_ready(self, name: str, version: str) -> bool:
        try:
            return self._core().model_ready(name, version)
        except InferenceError:
            return False

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        parameters: dict[str, Any] = {}
        if config:
            parameters["config"] = config
        for path, content in (files or {}).items():
            parameters[path if path.startswith("file:") else f"file:{path}"] = content
        try:
            self._core().load_model(name, parameters or None)
        except InferenceError as exc:
            raise pb.TritonModelException(str(exc)) from None

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        try:
            self._core().unload_model(name)
        except InferenceError as exc:
            raise pb.TritonModelException(str(exc)) from None


def link_of(options: Any) -> ServerLink:
    """The Python models' link to the Core whose repository options these are (``RepositoryOptions.server_link``);
    models loaded without a Core get one whose calls fail clearly."""
    core_link = getattr(options, "server_link", None)
    if not isinstance(core_link, CoreLink):
        return UNLINKED
    return core_link.state("python", lambda: ServerLink(core_link))


#: The link of models loaded without a Core (a repository built outside one): their calls fail clearly.
UNLINKED: ServerLink = ServerLink(CoreLink())


_CODES: list[tuple[type[InferenceError], int]] = [
    (InvalidArgument, pb.TritonError.INVALID_ARG),
    (NotFound, pb.TritonError.NOT_FOUND),
    (Unavailable, pb.TritonError.UNAVAILABLE),
    (Unsupported, pb.TritonError.UNSUPPORTED),
    (AlreadyExists, pb.TritonError.ALREADY_EXISTS),
    (Cancelled, pb.TritonError.CANCELLED),
    (UnknownError, pb.TritonError.UNKNOWN),
]


def code_of(error: BaseException) -> int:
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return pb.TritonError.INTERNAL


def error_of(code: int, message: str) -> InferenceError:
    """A model's ``TritonError`` as the server's error (its protocol status follows the code)."""
    for cls, known in _CODES:
        if known == code:
            return cls(message)
    return InternalError(message)


def infer_request(model_name: str, model_version: Any, data: Any, timeout_us: int = 0) -> InferRequest:
    request_id, correlation_id, flags, parameters, inputs, requested, _ = data
    parameters = dict(parameters)
    if correlation_id:
        parameters["sequence_id"] = correlation_id
    if flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = True
    if flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = True
    if timeout_us:
        parameters.setdefault("timeout", int(timeout_us))
    version = "" if model_version in (None, -1, "-1", "") else str(model_version)
    return InferRequest(
        model_name,
        version,
        request_id,
        parameters,
        [InferInput(name, datatype, tuple(array.shape), array) for name, datatype, array in inputs],
        [RequestedOutput(name) for name in requested],
    )


def response_data(response: InferResponse) -> ResponseData:
    outputs = [(o.name, o.datatype, o.data) for o in response.outputs if o.data is not None]
    return outputs, None, dict(response.parameters)


def empty_response() -> ResponseData:
    """A response with no outputs, no error and no parameters: what Triton's ``exec(decoupled=True)`` iterator
    yields last when the called model sent its final flag alone (request_executor.cc's ``InferResponseComplete``)."""
    return [], None, {}


def error_data(error: BaseException) -> ResponseData:
    return [], (code_of(error), str(error)), {}


class _RunningChain(threading.local):
    """The call chain of the in-process instance running on this thread (``()`` elsewhere: the model's own
    threads hold no instance)."""

    chain: CallChain = ()


#: Set by an in-process instance while it runs a batch (:meth:`InProcessBridge.running`).
_RUNNING = _RunningChain()


class InProcessBridge:
    """pb_utils' bridge when the model runs in the server process (its calls go to ``link``'s Core)."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    @staticmethod
    @contextlib.contextmanager
    def running(chain: CallChain) -> Iterator[None]:
        """``chain``: the call chain of BLS calls made on this thread while the block runs (an instance's batch)."""
        previous = _RUNNING.chain
        _RUNNING.chain = chain
        try:
            yield
        finally:
            _RUNNING.chain = previous

    def infer(self, request: pb.InferenceRequest) -> pb.InferenceResponse:
        from ....pyworker.runner import request_data, response_of

        return response_of(
            self.link.infer(
                request.model_name, request.model_version, request_data(request), request.timeout(), _RUNNING.chain
            )
        )

    def infer_stream(self, request: pb.InferenceRequest) -> Any:
        import queue

        from ....pyworker.runner import request_data, response_of

        answers: queue.SimpleQueue = queue.SimpleQueue()
        job = self.link.stream(
            request.model_name,
            request.model_version,
            request_data(request),
            lambda data, final: answers.put((data, final)),
            request.timeout(),
            _RUNNING.chain,
        )

        def responses() -> Any:
            while True:
                data, final = answers.get()
                if data is not None:
                    yield response_of(data)
                if final:
                    return

        return pb.ResponseIterator(responses(), job.cancel if job is not None else None)

    def model_ready(self, name: str, version: str) -> bool:
        return self.link.model_ready(name, version)

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self.link.load_model(name, config, files)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.link.unload_model(name, unload_dependents)

    def log(self, level: int, message: str) -> None:
        log.log(level, message)

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        try:
            return self.link.custom_metrics.apply(family, labels, op, value)
        except MetricError as exc:
            raise pb.TritonModelException(str(exc)) from None

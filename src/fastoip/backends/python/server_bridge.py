"""What Triton Python models reach in the server: BLS calls through the Core, model control, logs, custom metrics.

Rules:
- Each Core has its own :class:`ServerLink` (it rides in its repository's
  options to the models it loads), so with several Cores in one process (embedded
  servers) a model's BLS calls go to the Core that loaded it.  BLS requests go
  through ``Core.infer`` / ``Core.start`` (the batcher, statistics and
  everything else a client's request gets), never a socket.  Every Core call of
  the Python backend is in this module.
- Errors of a BLS call come back inside the response (a ``TritonError`` with
  Triton's code), as Triton's ``exec()`` returns them.
- Custom metric families (``pb_utils.MetricFamily``) live in :data:`CUSTOM_METRICS`
  and are exported on ``/metrics`` after the server's own families.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from ...errors import (
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
from ...metric_names import histogram_buckets_error, label_names_error, metric_name_error
from ...metrics import EXPORTED_NAMES, exposition_text
from ...pyworker import utils as pb
from ...types import InferInput, InferRequest, InferResponse, RequestedOutput

log = logging.getLogger("fastoip.python.model")

#: A response as plain data (see ``triton_runner.ResponseData``).
ResponseData = tuple[list, "tuple[int, str] | None", dict]


class CoreLike(Protocol):
    def infer(self, request: InferRequest, call: Any = None) -> InferResponse: ...

    def start(
        self,
        request: InferRequest,
        call: Any,
        on_done: Callable[[Any], object],
        on_response: Callable[[Any, InferResponse], object] | None = None,
    ) -> Any: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    def unload_model(self, name: str) -> None: ...


class ServerLink:
    """The Core that one repository's Triton Python models reach: BLS, readiness, model control.

    Made before its Core (the repository's options carry it to the models), attached when the Core is built."""

    def __init__(self) -> None:
        self.core: CoreLike | None = None
        self._call_type: Callable[..., Any] | None = None
        #: The worker processes of this Core's models, for :meth:`end_workers`: each adds itself when it starts
        #: and leaves when it died (a plain set: the compiled WorkerProcess takes no weak references).
        self.workers: set[Any] = set()
        #: Set by :meth:`end_workers`: a worker that dies now is not restarted.
        self.stopping = False

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

    def attach(self, core: CoreLike, call_type: Callable[..., Any]) -> None:
        """``call_type``: the Core's ``CallContext`` (the backends never import the Core)."""
        self.core = core
        self._call_type = call_type

    def call_of(self, data: Any) -> Any:
        """The call context of a BLS request: its trace parent (``trace=request.trace()``) when it has one."""
        trace = data[6]
        if trace is None or self._call_type is None:
            return None
        return self._call_type(trace_parent=(int(trace[0]), dict(trace[1] or {})))

    def _core(self) -> CoreLike:
        core = self.core
        if core is None:
            raise InternalError("BLS: this model's repository has no server core")
        return core

    def infer(self, model_name: str, model_version: Any, data: Any, timeout_us: int = 0) -> ResponseData:
        """One BLS request through the Core; its error inside the result."""
        try:
            request = infer_request(model_name, model_version, data, timeout_us)
            return response_data(self._core().infer(request, self.call_of(data)))
        except InferenceError as exc:
            return error_data(exc)

    def stream(
        self,
        model_name: str,
        model_version: Any,
        data: Any,
        deliver: Callable[[ResponseData | None, bool], None],
        timeout_us: int = 0,
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
                else:
                    deliver(None, True)

            return self._core().start(request, self.call_of(data), on_done, on_response)
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


#: The link of models loaded without one (a repository built outside a Core): their calls fail clearly.
UNLINKED: ServerLink = ServerLink()


def link_of(options: Any) -> ServerLink:
    """The server link a repository's options carry (see ``RepositoryOptions.server_link``)."""
    link = getattr(options, "server_link", None)
    return link if isinstance(link, ServerLink) else UNLINKED


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


def error_data(error: BaseException) -> ResponseData:
    return [], (code_of(error), str(error)), {}


class InProcessBridge:
    """pb_utils' bridge when the model runs in the server process (its calls go to ``link``'s Core)."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    def infer(self, request: pb.InferenceRequest) -> pb.InferenceResponse:
        from ...pyworker.runner import request_data, response_of

        return response_of(
            self.link.infer(request.model_name, request.model_version, request_data(request), request.timeout())
        )

    def infer_stream(self, request: pb.InferenceRequest) -> Any:
        import queue

        from ...pyworker.runner import request_data, response_of

        answers: queue.SimpleQueue = queue.SimpleQueue()
        job = self.link.stream(
            request.model_name,
            request.model_version,
            request_data(request),
            lambda data, final: answers.put((data, final)),
            request.timeout(),
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
        return CUSTOM_METRICS.apply(family, labels, op, value)


# -- custom metrics ------------------------------------------------------------------------------------------
_KIND_NAMES = {
    pb.MetricFamily.COUNTER: "counter",
    pb.MetricFamily.GAUGE: "gauge",
    pb.MetricFamily.HISTOGRAM: "histogram",
}


class _Series:
    __slots__ = ("value", "buckets", "counts", "total", "count")

    def __init__(self, buckets: list[float] | None) -> None:
        self.value = 0.0
        self.buckets = buckets or []
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0


class CustomMetrics:
    """Model-defined metric families, by name; each series by its labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, tuple[int, str, dict[tuple, _Series]]] = {}

    def apply(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        name, kind = str(family["name"]), int(family["kind"])
        # (the worker checked them; a worker may lie, and one bad name would fail the whole scrape)
        problem = metric_name_error(family["name"], EXPORTED_NAMES) or label_names_error(labels, kind == 2)
        if problem is not None:
            raise pb.TritonModelException(problem)
        if kind not in _KIND_NAMES:
            raise pb.TritonModelException(f"unknown metric kind {kind!r}")
        buckets = family.get("buckets")
        if kind == pb.MetricFamily.HISTOGRAM and op != "family":
            problem = histogram_buckets_error(buckets)
            if problem is not None:
                raise pb.TritonModelException(problem)
        key = tuple(sorted(labels.items()))
        with self._lock:
            known = self._families.get(name)
            if known is None:
                # The first family of a name keeps its description (Triton's registry does).
                known = (kind, str(family.get("description", "")), {})
                self._families[name] = known
            elif known[0] != kind:
                raise pb.TritonModelException(
                    f"Error when creating MetricFamily: metric family '{name}' already exists with another kind")
            if op == "family":
                return 0.0
            series = known[2].get(key)
            if series is None:
                series = _Series(buckets)
                known[2][key] = series
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.total += value
                series.count += 1
                for i, bound in enumerate(series.buckets):
                    if value <= bound:
                        series.counts[i] += 1
            if op == "value" and kind == pb.MetricFamily.HISTOGRAM:
                return float(series.count)
            return series.value

    def families(self) -> list[Metric]:
        out = []
        with self._lock:
            for name, (kind, description, series_by_labels) in sorted(self._families.items()):
                family = Metric(name, description, _KIND_NAMES[kind])
                family.name = name  # as the model named it (no "_total" appended)
                for key, series in series_by_labels.items():
                    labels = dict(key)
                    if kind == pb.MetricFamily.HISTOGRAM:
                        for bound, cumulative in zip(series.buckets, _cumulative(series.counts), strict=True):
                            family.add_sample(f"{name}_bucket", {**labels, "le": _bound(bound)}, cumulative)
                        family.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, series.count)
                        family.add_sample(f"{name}_sum", labels, series.total)
                        family.add_sample(f"{name}_count", labels, series.count)
                    else:
                        family.add_sample(name, labels, series.value)
                out.append(family)
        return out

    def text(self) -> str:
        families = self.families()
        return exposition_text(families) if families else ""


def _cumulative(counts: list[int]) -> list[int]:
    # observe() counts each value in every bucket whose bound it is under: already cumulative.
    return counts


def _bound(value: float) -> str:
    # As Triton's prometheus-cpp writes a bound: 1 as "1", 0.1 as "0.1" (its tests read le="1").
    return format(value, ".16g")


CUSTOM_METRICS = CustomMetrics()

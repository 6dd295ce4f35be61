"""One instance of the user's model class (lifecycle, health, requests in flight) and the lanes schedulers use."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...._proto import model_config_pb2 as mc
from ....content_types import ModelContentTypes
from ....errors import InferenceError, InternalError, InvalidArgument, Unavailable
from ....lifecycle import SHUTDOWN, STARTUP, hook_names
from ....model import Model
from ....model_config import ModelSpec, version_name
from ....scheduling.contract import END_OF_STREAM, RESPONDS_LATER, Execution, Results
from ....types import InferResponse
from ..describe import describe as _describe
from ..event_loop import EVENT_LOOP, call
from .decoupled import ModelFailed, close, drive, drive_here, is_async, values_of
from .payloads import PayloadCodec, batch_key

if TYPE_CHECKING:
    from ....scheduling.job import Job

log = logging.getLogger("fastoip.python")

#: How long an unload waits for requests in flight on an instance before running its shutdown hooks.
DRAIN_TIMEOUT_S = 60.0
#: How long a health check waits for an async ``is_ready`` / ``is_alive``.
HEALTH_TIMEOUT_S = 5.0


class _Host:
    """One instance of the user's class: lifecycle, health, in-flight tracking."""

    def __init__(
        self,
        cls: type[Model],
        name: str,
        version: int,
        folder: Path,
        config: mc.ModelConfig,
        spec: ModelSpec,
        parameters: dict[str, str],
        extra: dict,
        index: int,
        defaults: ModelContentTypes,
        batchable: bool,
    ) -> None:
        self.name = name
        self.version_str = version_name(config, version)
        self.spec = spec
        # A class may bring its own payload codec (an MLServer runtime takes and gives whole requests).
        self.payloads = getattr(cls, "payload_codec", PayloadCodec)(name, self.version_str, spec, defaults)
        self.batchable = batchable
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self.lanes = 0
        self._state = threading.Condition()
        self._in_flight = 0
        self._started = False
        self._stopped = False
        # Built in two steps: the attributes below exist before the user's __init__ runs.
        model: Any = cls.__new__(cls)
        model.name = name
        model.version = version
        model.path = folder
        model.config = config
        model.parameters = dict(parameters)
        model.extra = extra
        model.instance = index
        self.model = model
        try:
            model.__init__()
        except Exception as exc:
            raise InvalidArgument(f"model '{name}': {cls.__qualname__}() failed: {_describe(exc)}") from exc
        self._wants_parameters = _takes_parameters(model.predict)
        #: A decoupled model whose ``predict`` is an async generator: its generations run on the model loop alone,
        #: each holding no thread (``start_generation``), at most ``lanes`` at a time.
        self.streams_async = self.decoupled and inspect.isasyncgenfunction(model.predict)
        #: Where generations that finish after ``execute`` returned record their executions (the repository's).
        self.record: Callable[[int, int, int, int, int], None] | None = None

    def start(self) -> None:
        model = self.model
        try:
            call(model.load)
        except Exception as exc:
            raise InvalidArgument(f"model '{self.name}': load() failed: {_describe(exc)}") from exc
        self._started = True
        for hook in hook_names(type(model), STARTUP):
            try:
                call(getattr(model, hook))
            except Exception as exc:
                raise InvalidArgument(f"model '{self.name}': on_startup hook {hook} failed: {_describe(exc)}") from exc

    def stop(self, drain: bool = True) -> None:
        """Wait for requests in flight, then the shutdown hooks (reverse order) and ``unload()``."""
        with self._state:
            if self._stopped:
                return
            self._stopped = True
            self._state.notify_all()  # (a thread waiting for room to start a generation hears it: refused)
            if drain and not self._state.wait_for(lambda: self._in_flight == 0, DRAIN_TIMEOUT_S):
                log.warning("model '%s': %d requests still running at unload", self.name, self._in_flight)
        if not self._started:
            return
        model = self.model
        for hook in hook_names(type(model), SHUTDOWN):
            try:
                call(getattr(model, hook))
            except Exception:
                log.exception("model '%s': on_shutdown hook %s failed", self.name, hook)
        unload = getattr(model, "unload", None)
        if callable(unload):
            try:
                call(unload)
            except Exception:
                log.exception("model '%s': unload() failed", self.name)

    # -- health -------------------------------------------------------------------------
    def healthy(self, method: str) -> bool:
        if self._stopped:
            return False
        try:
            return bool(call(getattr(self.model, method), timeout=HEALTH_TIMEOUT_S))
        except Exception as exc:
            log.warning("model '%s': %s() failed: %s", self.name, method, _describe(exc))
            return False

    # -- requests ------------------------------------------------------------------------------
    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        """Run ``jobs``: per job an InferResponse or its error, and per predict call
        ``(batch_size, job_count, decode_ns, predict_ns, encode_ns)`` for the statistics."""
        with self._state:
            if self._stopped:
                error = Unavailable(f"model '{self.name}' is unloaded")
                return [error for _ in jobs], []
            self._in_flight += 1
        try:
            return self._execute(jobs)
        finally:
            with self._state:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._state.notify_all()

    def _execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        if self.decoupled:
            return self._execute_decoupled(jobs)
        results: Results = [InternalError("not run") for _ in jobs]  # each replaced below
        executions: list[Execution] = []
        for indices in self._groups(jobs):
            group = [jobs[i] for i in indices]
            try:
                t0 = time.monotonic_ns()
                payload, parameters = self.payloads.decode(group)
                t1 = time.monotonic_ns()
                value = self._predict(payload, parameters)
                t2 = time.monotonic_ns()
                responses = self.payloads.encode(value, group)
                t3 = time.monotonic_ns()
                executions.append((sum(job.batch_size for job in group), len(group), t1 - t0, t2 - t1, t3 - t2))
                for index, response in zip(indices, responses, strict=True):
                    results[index] = response
            except InferenceError as exc:
                for index in indices:
                    results[index] = exc
            except Exception as exc:  # a bug in the backend itself: still answer every job
                log.exception("model '%s': request failed", self.name)
                error = InternalError(f"model '{self.name}': {_describe(exc)}")
                for index in indices:
                    results[index] = error
        return results, executions

    def _execute_decoupled(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        """One ``predict`` per job; each value it produces is encoded and sent as soon as it exists."""
        results: Results = []
        executions: list[Execution] = []
        for job in jobs:
            try:
                t0 = time.monotonic_ns()
                payload, parameters = self.payloads.decode([job])
                t1 = time.monotonic_ns()
                encode_ns, last = self._stream(self._predict(payload, parameters), job)
                t2 = time.monotonic_ns()
                executions.append((job.batch_size, 1, t1 - t0, t2 - t1 - encode_ns, encode_ns))
                if job.decoupled:
                    results.append(END_OF_STREAM)
                else:  # a caller without a response sink (warm-up): the last response stands for all
                    results.append(last or self.payloads.empty_response(job))
            except InferenceError as exc:
                results.append(exc)
            except Exception as exc:  # a bug in the backend itself: still answer the job
                log.exception("model '%s': request failed", self.name)
                results.append(InternalError(f"model '{self.name}': {_describe(exc)}"))
        return results, executions

    def _stream(self, produced: Any, job: Job) -> tuple[int, InferResponse | None]:
        """Send each response ``produced`` gives; the time spent encoding them, and the last response."""
        if is_async(produced):
            return self._stream_async(produced, job)
        encode_ns = 0
        last = None
        values = values_of(produced)
        try:
            while True:
                try:
                    value = next(values)
                except StopIteration:
                    break
                except InferenceError:
                    raise
                except Exception as exc:
                    log.exception("model '%s': predict failed", self.name)
                    raise InternalError(f"model '{self.name}': predict failed: {_describe(exc)}") from None
                started = time.monotonic_ns()
                last = self.payloads.encode(value, [job])[0]
                encode_ns += time.monotonic_ns() - started
                if not job.send(last):  # finished meanwhile (the client cancelled): stop producing
                    break
        finally:
            close(produced)
        return encode_ns, last

    def _stream_async(self, produced: Any, job: Job) -> tuple[int, InferResponse | None]:
        """``_stream`` of an async generator: driven on the model loop in one go, each response encoded and sent
        from there (no thread hand-off per response)."""
        sent: list[InferResponse] = []
        encode_ns = 0

        def deliver(value: Any) -> bool:
            nonlocal encode_ns
            started = time.monotonic_ns()
            response = self.payloads.encode(value, [job])[0]
            encode_ns += time.monotonic_ns() - started
            sent[:] = [response]
            return job.send(response)  # False once finished meanwhile (the client cancelled): stop producing

        try:
            drive(produced, deliver)
        except ModelFailed as failed:
            if isinstance(failed.cause, InferenceError):
                raise failed.cause from None
            log.error("model '%s': predict failed", self.name, exc_info=failed.cause)
            raise InternalError(f"model '{self.name}': predict failed: {_describe(failed.cause)}") from None
        return encode_ns, (sent[0] if sent else None)

    # -- async generations that hold no thread ---------------------------------------------------------------
    def has_room(self) -> bool:
        """A generation may start now without waiting for another to end."""
        return not self._stopped and self._in_flight < max(self.lanes, 1)

    def start_generation(self, job: Job) -> InferenceError | None:
        """Start ``job``'s generation on the model loop and return (None), or the error it fails with at once.

        Everything the generation does (decoding, ``predict``, encoding and sending each response, finishing the
        job) runs on the model loop: no thread waits for it.  At most ``lanes`` run at a time: a thread that is
        not an event loop's waits here for room; an event loop's (the direct scheduler hands a job over there
        after ``has_room``) never waits, and may pass the bound by the calls that raced it."""
        with self._state:
            if not self._stopped and asyncio._get_running_loop() is None:
                self._state.wait_for(lambda: self._stopped or self._in_flight < max(self.lanes, 1))
            if self._stopped:
                return Unavailable(f"model '{self.name}' is unloaded")
            self._in_flight += 1
        try:
            EVENT_LOOP.submit(self._generate(job), self._generation_ended)
        except BaseException:
            self._generation_ended(None)
            raise
        return None

    async def _generate(self, job: Job) -> None:
        """One generation on the model loop, from its request to its job's end (``_execute_decoupled``'s twin
        for a job that holds no thread: change both)."""
        try:
            if job.finished:  # cancelled before its turn came
                return
            t0 = time.monotonic_ns()
            payload, parameters = self.payloads.decode([job])
            t1 = time.monotonic_ns()
            encode_ns = 0

            def deliver(value: Any) -> bool:
                nonlocal encode_ns
                started = time.monotonic_ns()
                response = self.payloads.encode(value, [job])[0]
                encode_ns += time.monotonic_ns() - started
                return job.send(response)  # False once finished meanwhile (the client cancelled): stop producing

            await drive_here(self._predict(payload, parameters), deliver)
            t2 = time.monotonic_ns()
            job.compute_end_ns = t2
            if self.record is not None:  # recorded before the caller hears of the end (as run_jobs does)
                self.record(job.batch_size, 1, t1 - t0, t2 - t1 - encode_ns, encode_ns)
            job.end_stream()
        except ModelFailed as failed:
            if isinstance(failed.cause, InferenceError):
                job.fail(failed.cause)
            else:
                log.error("model '%s': predict failed", self.name, exc_info=failed.cause)
                job.fail(InternalError(f"model '{self.name}': predict failed: {_describe(failed.cause)}"))
        except InferenceError as exc:
            job.fail(exc)
        except Exception as exc:  # a bug in the backend itself: still answer the job
            log.exception("model '%s': request failed", self.name)
            job.fail(InternalError(f"model '{self.name}': {_describe(exc)}"))

    def _generation_ended(self, error: BaseException | None) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()

    def _groups(self, jobs: Sequence[Job]) -> list[list[int]]:
        if not self.batchable or len(jobs) == 1:
            return [[i] for i in range(len(jobs))]
        groups: dict[tuple, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(batch_key(job), []).append(index)
        return list(groups.values())

    def _predict(self, payload: Any, parameters: dict) -> Any:
        predict = self.model.predict
        try:
            if self._wants_parameters:
                return call(predict, payload, parameters)
            return call(predict, payload)
        except InferenceError:
            raise
        except Exception as exc:
            log.exception("model '%s': predict failed", self.name)
            raise InternalError(f"model '{self.name}': predict failed: {_describe(exc)}") from None


def _takes_parameters(method: Callable[..., Any]) -> bool:
    """Whether ``predict`` accepts a second positional argument (the request parameters)."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    positional = 0
    for param in signature.parameters.values():
        if param.kind == param.VAR_POSITIONAL:
            return True
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


class PythonInstance:
    """What a scheduler holds: one lane into one model object."""

    # A Backend (scheduling/contract.py) of its own: its model reads whole requests (parameters, content types).

    def __init__(self, host: _Host) -> None:
        self.host = host
        host.lanes += 1

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        return self.host.execute(jobs)

    def is_ready(self) -> bool:
        return self.host.healthy("is_ready")

    def readiness_waits(self) -> bool:
        """The model's own ``is_ready`` (one that overrides ``Model``'s) may wait (an awaitable, up to
        :data:`HEALTH_TIMEOUT_S`)."""
        return type(self.host.model).is_ready is not Model.is_ready

    def is_alive(self) -> bool:
        return self.host.healthy("is_alive")

    def close(self) -> None:
        host = self.host
        host.lanes -= 1
        if host.lanes <= 0:
            host.stop()


class AsyncStreamInstance(PythonInstance):
    """A lane into a decoupled model whose ``predict`` is an async generator: ``execute`` starts each generation
    on the model loop and returns (its jobs are ``RESPONDS_LATER``; the generation finishes them), so a stream
    holds no executor thread, and the direct scheduler may hand a job over on the event loop that enqueued it."""

    def takes_without_waiting(self, job: Job) -> bool:
        return job.decoupled and self.host.has_room()

    def record_executions_to(self, record: Callable[[int, int, int, int, int], None]) -> None:
        self.host.record = record

    def execute(self, jobs: Sequence[Job]) -> tuple[Results, list[Execution]]:
        if not all(job.decoupled for job in jobs):  # a caller without a response sink (warm-up): as any model
            return self.host.execute(jobs)
        results: Results = []
        for job in jobs:
            failed = self.host.start_generation(job)
            results.append(RESPONDS_LATER if failed is None else failed)
        return results, []

"""Trace settings as Triton keeps them (global and per model), which requests are traced, and where traces go.

Rules (Triton's ``src/tracer.cc``, ``docs/protocol/extension_trace.md``):
- The global setting starts from the command line (:mod:`.config`).  The trace
  settings API changes it, or a model's own setting: a model keeps the fields
  the API specified for it and mirrors the global setting in every other one,
  also when the global setting changes later.  A null (HTTP) or empty (gRPC)
  value clears a field: a model's goes back to mirroring, the global one back
  to the command line's value; a model with no field of its own has no setting.
- ``trace_level`` is OFF, or TIMESTAMPS and/or TENSORS (OFF beside another
  level is refused).  ``trace_rate`` N traces the N-th, 2N-th, ... request a
  setting sees.  ``trace_count`` is the number of traces left (-1: no limit);
  it counts down and is answered as it stands.  ``log_frequency`` (triton mode):
  0 writes each trace to ``trace_file`` as it finishes; N writes every N traces
  to the next ``trace_file.<k>``, and the rest when ``trace_count`` runs out or
  the setting is replaced or the server stops.  Batched traces of every setting
  (the global one and each model's) hold at most ``PENDING_LIMIT_BYTES`` of
  tensor text together (``HeldTraces``): a batch whose trace takes them past it
  is written early (issue 27: TENSORS traces and a huge ``log_frequency`` kept
  ~1.3 MB a request in memory; issue 37: the bound was per setting, so each
  model's setting could hold as much).  A trace records at most
  ``record.TRACE_TENSOR_BYTES`` of tensor data, noted ``"truncated"`` past it.
- An update replaces the setting object (its counters start again); traces in
  flight finish under the setting that sampled them.  A setting that cannot
  trace (rate 0; triton mode without a trace file) is refused unless its level
  is OFF.  ``trace_file`` and ``trace_mode`` are the command line's only.
- OpenTelemetry mode: a request whose caller sent a valid W3C ``traceparent``
  is traced whatever the rate and count, while the level is not OFF; TENSORS
  is not recorded there (Triton's OpenTelemetry mode does not support it).
- ``active`` is False when no setting can trace: the Core then skips every
  other step of tracing (the only cost of tracing being off).
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument, Unsupported
from .config import LEVELS, TraceConfig
from .context import TraceHeaders, w3c_carrier
from .record import TraceRecord
from .triton_file import TraceFile

log = logging.getLogger("fastoip.tracing")

#: The API's setting names -> the fields it may change.
#: Tensor text (TENSORS traces) all settings may hold batched for ``log_frequency`` before a batch is written anyway.
PENDING_LIMIT_BYTES = 64 * 1024 * 1024


class HeldTraces:
    """What every setting's unwritten batch holds, counted together (one per TraceManager)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0

    def add(self, size: int) -> int:
        """Count ``size`` more; the total now."""
        with self._lock:
            self.bytes += size
            return self.bytes

    def release(self, size: int) -> None:
        with self._lock:
            self.bytes -= size


def _tensor_text_bytes(entries: list[dict[str, Any]]) -> int:
    """About what a trace's entries hold: the length of their tensors' data text, 256 bytes an entry besides."""
    total = 0
    for entry in entries:
        total += 256
        tensor = entry.get("tensor")
        if isinstance(tensor, dict):
            data = tensor.get("data")
            if isinstance(data, str):
                total += len(data)
    return total


UPDATABLE = {"trace_level": "levels", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
FIELDS = tuple(UPDATABLE.values())
#: Every name the API answers or takes in triton mode.
SETTING_NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


class TraceSetting:
    """One setting in force (the global one or a model's) and its sampling state; never changed, replaced."""

    def __init__(
        self,
        levels: tuple[str, ...],
        rate: int,
        count: int,
        log_frequency: int,
        file: TraceFile | None,
        mode: str,
        specified: frozenset[str],
        held: HeldTraces | None = None,
    ) -> None:
        """``held``: the count every setting of the server shares of what their batches hold."""
        self.levels = levels
        self.rate = rate
        #: Traces left to take (-1: no limit); counts down.
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.mode = mode
        #: The fields the trace settings API set (a model's others mirror the global setting).
        self.specified = specified
        self.timestamps = "TIMESTAMPS" in levels
        self.tensors = "TENSORS" in levels and mode == "triton"
        if not levels:
            self.invalid_reason = "tracing is disabled"
        elif rate == 0:
            self.invalid_reason = "sample rate must be non-zero"
        elif mode == "triton" and file is None:
            self.invalid_reason = "trace file name is not given"
        else:
            self.invalid_reason = ""
        #: True when some request could be traced under this setting.
        self.can_trace = bool(levels) and (mode == "opentelemetry" or file is not None)
        self._lock = threading.Lock()
        self._seen = 0
        self._taken = 0
        self._collected = 0
        self._pending: list[dict[str, Any]] = []
        self._pending_traces = 0
        self._pending_bytes = 0
        self._held = held if held is not None else HeldTraces()

    def sample(self, forced: bool) -> bool:
        """Count one request; True when it is traced (``forced``: the caller's trace context asks for it)."""
        with self._lock:
            hit = False
            if self.rate:
                if (self.invalid_reason or self.count == 0) and not forced:
                    return False
                self._seen += 1
                hit = self._seen % self.rate == 0
                if hit and self.count > 0:
                    self.count -= 1
                elif hit and self.count == 0:
                    hit = False
            if hit or forced:
                self._taken += 1
                return True
            return False

    def collect(self, entries: list[dict[str, Any]]) -> None:
        """One finished trace's entries (triton mode): to the file now, or batched per ``log_frequency``."""
        file = self.file
        if file is None:
            return
        with self._lock:
            self._collected += 1
            if self.log_frequency == 0:
                batch = None
            else:
                size = _tensor_text_bytes(entries)
                self._pending += entries
                self._pending_traces += 1
                self._pending_bytes += size
                held = self._held.add(size)
                if self._pending_traces < self.log_frequency and held < PENDING_LIMIT_BYTES and not (
                    self.count == 0 and self._collected == self._taken
                ):
                    return
                self._held.release(self._pending_bytes)
                batch, self._pending, self._pending_traces, self._pending_bytes = self._pending, [], 0, 0
        if batch is None:
            file.append(entries)
        else:
            file.write_indexed(batch)

    def close(self) -> None:
        """Write what is still batched (the setting is replaced, or the server stops)."""
        with self._lock:
            self._held.release(self._pending_bytes)
            batch, self._pending, self._pending_traces, self._pending_bytes = self._pending, [], 0, 0
        if batch and self.file is not None:
            self.file.write_indexed(batch)


@dataclass
class Trace:
    """A traced request: its record and the setting that sampled it (which writes it)."""

    record: TraceRecord
    setting: TraceSetting

    @property
    def timestamps(self) -> bool:
        return self.setting.timestamps

    @property
    def tensors(self) -> bool:
        return self.setting.tensors


class TraceManager:
    """The trace settings and the way out for traces (Triton's TraceManager)."""

    def __init__(self, config: TraceConfig | None = None, exporter: Any | None = None) -> None:
        """``exporter``: an :class:`~.otel.OtelExporter` (made here from ``config`` in OpenTelemetry mode when not
        given)."""
        config = config or TraceConfig()
        self.config = config
        self.mode = config.mode
        self._files: dict[str, TraceFile] = {}
        #: What every setting's batch holds, together (issue 37).
        self.held = HeldTraces()
        if self.mode == "opentelemetry" and exporter is None:
            from .otel import OtelExporter

            exporter = OtelExporter(config)
        self._exporter = exporter
        self._default = self._setting(config.levels, config.rate, config.count, config.log_frequency, frozenset())
        self._global = self._setting(config.levels, config.rate, config.count, config.log_frequency, frozenset())
        self._models: dict[str, TraceSetting] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        if self._global.levels and self._global.invalid_reason and self.mode == "triton":
            log.warning("tracing is on (%s) but %s: nothing is traced until one is given",
                        ",".join(self._global.levels), self._global.invalid_reason)
        #: False when no setting can trace (the Core's one check per request).
        self.active = self._global.can_trace

    def _setting(
        self, levels: tuple[str, ...], rate: int, count: int, log_frequency: int, specified: frozenset[str]
    ) -> TraceSetting:
        path = self.config.file
        file = None
        if path:
            file = self._files.get(path)
            if file is None:
                file = self._files[path] = TraceFile(path)
        return TraceSetting(levels, rate, count, log_frequency, file, self.mode, specified, self.held)

    # -- the trace settings API ----------------------------------------------------------------
    def settings(self, model: str = "") -> dict[str, list[str]]:
        """The setting in force for ``model`` (its own, else the global one), in the API's form."""
        setting = self._models.get(model, self._global) if model else self._global
        values = {
            "trace_level": list(setting.levels) or ["OFF"],
            "trace_rate": [str(setting.rate)],
            "trace_count": [str(setting.count)],
        }
        if self.mode == "triton":
            values["log_frequency"] = [str(setting.log_frequency)]
            values["trace_file"] = [self.config.file]
        values["trace_mode"] = [self.mode]
        if self.mode == "opentelemetry":
            config = self.config
            values["url"] = [config.otel_url]
            values["resource"] = [f"{key}={value}" for key, value in config.otel_resource.items()]
            values["bsp_max_queue_size"] = [str(config.bsp_max_queue_size)]
            values["bsp_schedule_delay"] = [str(config.bsp_schedule_delay_ms)]
            values["bsp_max_export_batch_size"] = [str(config.bsp_max_export_batch_size)]
        return values

    def update(self, changes: dict[str, list[str] | None], model: str = "") -> dict[str, list[str]]:
        """Apply ``changes`` (None or [] clears a field) to ``model``'s setting, or the global one."""
        given, cleared = _parse_changes(changes)
        replaced: list[TraceSetting] = []
        with self._lock:
            self._apply(model, given, cleared, replaced)
            if not model:  # models mirror the global setting in the fields they did not set
                for name in list(self._models):
                    self._apply(name, {}, set(), replaced)
            self.active = self._global.can_trace or any(s.can_trace for s in self._models.values())
        for old in replaced:
            old.close()
        return self.settings(model)

    def _apply(self, model: str, given: dict[str, Any], cleared: set[str], replaced: list[TraceSetting]) -> None:
        current = self._models.get(model) if model else self._global
        fallback = self._global if model else self._default
        specified = ((current.specified if current is not None else frozenset()) - cleared) | set(given)
        values: dict[str, Any] = {}
        for name in FIELDS:
            if name in given:
                values[name] = given[name]
            elif name in specified and current is not None:
                values[name] = getattr(current, name)
            else:
                values[name] = getattr(fallback, name)
        if model and not specified:
            old = self._models.pop(model, None)
            if old is not None:
                replaced.append(old)
            return
        setting = self._setting(values["levels"], values["rate"], values["count"], values["log_frequency"],
                                frozenset(specified))
        if setting.invalid_reason and setting.levels:
            raise InvalidArgument(f"Attempting to set invalid trace setting :{setting.invalid_reason}")
        if current is not None:
            replaced.append(current)
        if model:
            self._models[model] = setting
        else:
            self._global = setting

    # -- requests --------------------------------------------------------------------------------
    def begin(self, model: str, version: str, request_id: str, headers: TraceHeaders | None) -> Trace | None:
        """A Trace when this request of ``model`` is traced, else None (call only while ``active``)."""
        setting = self._models.get(model, self._global)
        if not setting.can_trace:
            return None
        carrier: dict[str, str] = {}
        forced = False
        if self._exporter is not None and headers is not None:
            carrier = w3c_carrier(headers)
            forced = bool(carrier) and self._exporter.is_valid_parent(carrier)
        if not setting.sample(forced):
            return None
        return Trace(TraceRecord(next(self._ids), model, version, request_id, carrier=carrier), setting)

    def child(self, model: str, version: str, request_id: str, parent: tuple[int, dict[str, str]]) -> Trace | None:
        """The trace of a request another traced request made (BLS): traced whenever its model's setting traces
        at all (no sampling: its parent was sampled), with ``parent_id`` and the parent's W3C context, as Triton's
        ``TRITONSERVER_InferenceTraceSpawnChildTrace``."""
        setting = self._models.get(model, self._global)
        if not setting.can_trace:
            return None
        parent_id, carrier = parent
        record = TraceRecord(next(self._ids), model, version, request_id, carrier=dict(carrier), parent_id=parent_id)
        return Trace(record, setting)

    def finish(self, trace: Trace) -> None:
        """The traced request is done (its record filled): write it, or export its spans."""
        if self._exporter is not None:
            self._exporter.export(trace.record)
        else:
            trace.setting.collect(trace.record.triton_entries())

    def close(self) -> None:
        """At shutdown: write what settings still batch, export what spans are queued."""
        with self._lock:
            settings = [self._global, *self._models.values()]
        for setting in settings:
            setting.close()
        if self._exporter is not None:
            self._exporter.shutdown()


def _parse_changes(changes: dict[str, list[str] | None]) -> tuple[dict[str, Any], set[str]]:
    """The API's changes as field values and cleared fields, with Triton's checks and words."""
    given: dict[str, Any] = {}
    cleared: set[str] = set()
    for key, value in changes.items():
        if key == "trace_file":
            raise Unsupported("trace file location can not be updated through network protocol")
        if key == "trace_mode":
            raise Unsupported("trace mode can not be updated through network protocol (--trace-config mode=...)")
        field = UPDATABLE.get(key)
        if field is None:
            raise InvalidArgument(f"unknown trace setting '{key}' (known: {', '.join(SETTING_NAMES)})")
        if not value:
            cleared.add(field)
            continue
        if key == "trace_level":
            given[field] = _levels(value)
            continue
        if len(value) != 1:
            raise InvalidArgument(f"expect only 1 value for '{key}'")
        minimum, maximum = (-1, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
        try:
            number = int(value[0])
        except ValueError:
            raise InvalidArgument(f"Unable to parse '{key}', got: {value[0]}") from None
        if not minimum <= number <= maximum:
            raise InvalidArgument(
                f"Unable to parse '{key}', value is out of range [ {minimum}, {maximum} ], got: {value[0]}"
            )
        given[field] = number
    return given, cleared


def _levels(values: list[str]) -> tuple[str, ...]:
    if "OFF" in values:
        if len(values) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ()
    for value in values:
        if value not in LEVELS:
            raise InvalidArgument(f"trace_level: expected OFF, TIMESTAMPS or TENSORS, got '{value}'")
    return tuple(level for level in LEVELS if level in values)

"""A loaded model version: config, backend instances, scheduler, statistics.

Rules:
- ``prepare`` turns an InferRequest into a Job or raises InvalidArgument with a
  message that names the model, the tensor, what was expected and what came.
  Nothing invalid ever reaches a scheduler.
- A LoadedModel is immutable once ready; model control swaps whole objects.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path

from .._proto import model_config_pb2 as mc
from ..classification import class_count
from ..cuda import pinned_allocator
from ..errors import InvalidArgument
from ..metrics import MetricsConfig, VersionCounters
from ..model_config import ModelSpec, TensorSpec, model_spec, version_name
from ..scheduling.buffers import BufferPool
from ..scheduling.contract import Backend, ExecutionContext, SchedulerFactory, TensorModel
from ..scheduling.execute import TensorBackend
from ..scheduling.job import Job, input_signature, ragged_signature
from ..scheduling.ragged import RaggedPlan
from ..types import InferInput, InferRequest, InferResponse

log = logging.getLogger("fastoip.repository")


#: Each load of a model version gets the next number: what the response cache keys on, so that a reload with
#: other weights under the same name and version never answers from the previous load's entries (issue 27).
_load_serials = itertools.count(1)


class _InputRule:
    """What ``prepare`` reads of one config input a request, as a compiled class's fields (the spec's
    ``TensorSpec`` is an interpreted dataclass: a dictionary look-up an attribute)."""

    __slots__ = ("datatype", "accepted", "spec")

    def __init__(self, spec: TensorSpec) -> None:
        self.datatype = spec.datatype
        #: The spec's own remembered shapes (``TensorSpec.accepts`` fills this dict).
        self.accepted: dict[tuple, bool] = spec.accepted
        self.spec = spec


class LoadedModel:
    """One version of one model, ready to serve."""

    def __init__(
        self,
        name: str,
        version: int,
        path: Path,
        config: mc.ModelConfig,
        backends: Sequence[Backend | TensorModel],
        executor: Executor,
        scheduler_factory: SchedulerFactory,
        model_dir: Path | None = None,
        metrics_config: MetricsConfig | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.load_serial = next(_load_serials)
        #: The version as clients name it: the number, or an MLServer model's label (``version_name``).
        self.version_str = version_name(config, version)
        self.path = path
        self.config = config
        #: The model's folder (what holds config.pbtxt, label files, a chat template).
        self.model_dir: Path = model_dir or path.parent.parent
        # the model directory holds the label files; ``path`` is a file in its version directory unless given
        self.spec: ModelSpec = model_spec(config, model_dir or path.parent.parent)
        # The spec's facts prepare reads per request, as this (compiled) class's own fields: the spec is an
        # interpreted dataclass, whose attributes cost a dictionary look-up each.
        self._inputs_by_name: dict[str, _InputRule] = {
            name: _InputRule(spec) for name, spec in self.spec.input_by_name.items()
        }
        self._input_count = len(self.spec.inputs)
        self._max_batch_size = self.spec.max_batch_size
        self._open_tensors = self.spec.open_tensors
        self._reshaped = self.spec.reshaped
        self.all_output_names = [t.name for t in self.spec.outputs]
        #: The instances as the backend kind built them (ONNX sessions, Python model lanes).
        self.backends = list(backends)
        self.stats = VersionCounters(name, self.version_str, metrics_config)
        for backend in backends:  # a backend that finishes its jobs after execute returned records there
            record_to = getattr(backend, "record_executions_to", None)
            if record_to is not None:
                record_to(self.stats.record_execution)
        tensor_models = [b for b in backends if isinstance(b, TensorModel)]
        # On the CUDA EP batches are gathered in pinned host memory: ORT's upload is then a DMA.
        self.on_gpu = any(b.on_gpu for b in tensor_models)
        self.buffers = BufferPool(pinned_allocator if self.on_gpu and wants_pinned_inputs(config) else None)
        # A plain lock-guarded count: correct on every Python build (free-threaded too), ~0.1 µs a side.
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        #: Set when the version is retired (reload or unload): new requests must not start on it
        #: (``runner.RequestRunner.enter`` hands them its successor).
        self.retiring = False
        #: Triton's ragged batching (ragged inputs, batch inputs and outputs), or None: the model has none.
        self.ragged = RaggedPlan.of(config)
        #: The one batch signature of every request ``prepare`` accepts, when that is one (every input required,
        #: its non-batch dims fixed, none ragged): then no signature is built a request.
        skip = 1 if self.spec.batching else 0
        self._one_signature: Hashable | None = None
        if (not self.spec.open_tensors and (self.ragged is None or not self.ragged.ragged)
                and all(not t.optional and -1 not in t.shape[skip:] for t in self.spec.inputs)):
            self._one_signature = tuple((t.name, t.shape[skip:]) for t in self.spec.inputs)
        #: What the scheduler may know of this model (it never sees the LoadedModel itself).
        self.context = ExecutionContext(
            name=name,
            version_str=self.version_str,
            config=config,
            batching=self.spec.batching,
            output_datatypes={t.name: t.datatype for t in self.spec.outputs},
            stats=self.stats,
            buffers=self.buffers,
            signature=self.signature,
            ragged=self.ragged,
        )
        #: What the scheduler runs: tensor models get the merge/split adapter, the others are Backends already.
        self.instances: list[Backend] = [
            TensorBackend(b, self.context) if isinstance(b, TensorModel) else b for b in backends
        ]
        #: Requests wait for their turn (dynamic or sequence batching, an ensemble's steps: the config's
        #: ``scheduling_choice``); without one a request runs at once, on a caller's lent thread where it can.
        self.queued = config.WhichOneof("scheduling_choice") is not None
        #: Decoupled (``model_transaction_policy { decoupled }``): any number of responses per request.
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        #: Triton's response cache applies (never to sequence or decoupled models: their answers depend on more).
        self.uses_response_cache = (
            config.response_cache.enable
            and not config.HasField("sequence_batching")
            and not config.model_transaction_policy.decoupled
        )
        #: The GPU whose device memory every instance reads inputs from in place (a CUDA shared-memory input stays
        #: there), or -1: inputs come to the host (see :func:`device_input_gpu`).
        self.device_inputs = device_input_gpu(config, backends, self._reshaped, self.uses_response_cache)
        self.scheduler = scheduler_factory(self.context, self.instances, executor)

    # -- the infer path -------------------------------------------------
    def prepare(self, request: InferRequest) -> Job:
        """Validate ``request`` against the config and make a Job of it."""
        spec = self.spec
        by_name = self._inputs_by_name
        max_batch_size = self._max_batch_size
        batching = max_batch_size > 0  # (spec.batching without a property call on the hot path)
        open_tensors = self._open_tensors
        feeds: dict = {}
        batch_size = 1
        for tensor in request.inputs:
            # The common case passes these checks in a few operations; _reject explains a failure.
            name = tensor.name
            shape = tensor.shape
            expected = by_name.get(name)
            if (
                expected is None
                or name in feeds
                or tensor.datatype != expected.datatype
                # (TensorSpec.accepts' remembered shapes read here: one interpreted call less per input)
                or not (type(shape) is tuple and shape in expected.accepted or expected.spec.accepts(shape))
                or tensor.data is None
            ) and not (open_tensors and tensor.data is not None and name not in feeds):
                self._reject_input(tensor, expected.spec if expected is not None else None, feeds)
            if batching and shape:  # (checked above to have a batch dim, unless open_tensors)
                if not feeds:
                    batch_size = shape[0]
                elif shape[0] != batch_size:
                    raise InvalidArgument(
                        f"input '{name}' batch size does not match other inputs for '{self.name}': "
                        f"{shape[0]}, others {batch_size}"
                    )
            feeds[name] = tensor.data
        if len(feeds) != self._input_count and not open_tensors:
            missing = [t.name for t in spec.inputs if t.name not in feeds and not t.optional]
            if missing:
                required = sum(1 for t in spec.inputs if not t.optional)
                expected_count = (
                    f"{len(spec.inputs)} inputs"
                    if required == len(spec.inputs)
                    else f"number of inputs between {required} and {len(spec.inputs)}"
                )
                raise InvalidArgument(  # Triton's words
                    f"expected {expected_count} but got {len(feeds)} inputs for model '{self.name}'. "
                    f"Got input(s) {_names(feeds)}, but missing required input(s) {_names(missing)}. "
                    "Please provide all required input(s)."
                )
        if batching and not 1 <= batch_size <= max_batch_size:
            raise InvalidArgument(
                f"inference request batch-size must be <= {max_batch_size} and >= 1 for "
                f"'{self.name}', got {batch_size}"
            )
        if request.outputs:
            output_names = []
            for wanted in request.outputs:
                if wanted.name not in spec.output_by_name and not spec.open_tensors:
                    raise InvalidArgument(
                        f"unexpected inference output '{wanted.name}' for model '{self.name}'; "
                        f"outputs: {', '.join(t.name for t in spec.outputs)}"
                    )
                if wanted.name in output_names:
                    raise InvalidArgument(f"output '{wanted.name}' already exists in request")
                if wanted.name in spec.output_by_name:
                    class_count(wanted, spec.output_by_name[wanted.name].datatype)
                output_names.append(wanted.name)
        else:
            output_names = self.all_output_names
        if self._reshaped:  # Triton's reshape: the config's dims -> the model's shape
            feeds = spec.model_feeds(feeds)
        return Job(request, feeds, batch_size, output_names)

    def signature(self, job: Job) -> Hashable:
        """Jobs merge into one batch only when these agree (see :func:`~fastoip.scheduling.job.input_signature`)."""
        if self._one_signature is not None:
            return self._one_signature
        if self.ragged is not None and self.ragged.ragged:
            return ragged_signature(job, self._max_batch_size > 0, self.ragged.ragged)
        return input_signature(job, self._max_batch_size > 0)

    def _reject_input(self, tensor: InferInput, expected: TensorSpec | None, feeds: dict) -> None:
        """Raise the precise error for an input that failed prepare's quick checks."""
        spec = self.spec
        if expected is None:
            raise InvalidArgument(
                f"unexpected inference input '{tensor.name}' for model '{self.name}'; "
                f"expected inputs: {', '.join(t.name for t in spec.inputs)}"
            )
        if tensor.name in feeds:
            raise InvalidArgument(f"input '{tensor.name}' already exists in request (model '{self.name}')")
        if tensor.datatype != expected.datatype:
            raise InvalidArgument(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{self.name}' expects '{expected.datatype}'"
            )
        shape = tuple(tensor.shape)
        if not expected.accepts(shape):
            raise InvalidArgument(
                f"unexpected shape for input '{tensor.name}' for model '{self.name}'. "
                f"Expected {list(expected.shape)}, got {list(shape)}"
                + (
                    " (the model batches: the first dimension is the batch size)"
                    if spec.batching and len(shape) == len(expected.shape) - 1
                    else ""
                )
            )
        raise InvalidArgument(f"input '{tensor.name}' has no data")

    def run_blocking(self, request: InferRequest) -> InferResponse:
        """Run one request through this model's own scheduler and wait (warm-up, before the model serves)."""
        job = self.prepare(request)
        job.arm()
        job.caller_runs = True
        self.scheduler.enqueue(job)
        return job.wait()

    # -- metadata -----------------------------------------------------------
    def tensor_metadata(self) -> tuple[list[dict], list[dict]]:
        def entries(specs: Iterable[TensorSpec]) -> list[dict]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

        return entries(self.spec.inputs), entries(self.spec.outputs)

    # -- health: every instance answers --------------------------------------------------
    def is_ready(self) -> bool:
        return all(b.is_ready() for b in self.instances)

    def readiness_waits(self) -> bool:
        """Whether :meth:`is_ready` may wait on model code (an instance's ``readiness_waits()``; an instance
        without one answers at once): the frontends then ask it off their event loops."""
        for instance in self.instances:
            waits = getattr(instance, "readiness_waits", None)
            if waits is not None and waits():
                return True
        return False

    def is_alive(self) -> bool:
        return all(b.is_alive() for b in self.instances)

    def down_reason(self) -> str:
        """Why an instance stopped serving for good ("" when none did): a Python worker that crashed too often."""
        for instance in self.instances:
            reason = getattr(instance, "down_reason", None)
            if isinstance(reason, str) and reason:
                return reason
        return ""

    # -- in-flight accounting: unload waits for requests that already started ----------
    # (acquire/release, not `with`: mypyc compiles `with` to two attribute lookups and two calls, twice a request)
    def enter(self) -> None:
        lock = self._in_flight_lock
        lock.acquire()
        self._in_flight += 1
        lock.release()

    def leave(self) -> None:
        lock = self._in_flight_lock
        lock.acquire()
        self._in_flight -= 1
        lock.release()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wait_idle(self, timeout: float) -> bool:
        """Block until no request is using this model (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while self.in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is in flight (up to ``timeout``), then release the instances."""
        self.retiring = True  # requests that find this version from now on go to its successor (RequestRunner.enter)
        if not self.wait_idle(timeout):
            log.warning("model '%s' v%s: %d requests still running at unload", self.name, self.version, self.in_flight)
        self.scheduler.stop()
        for instance in self.instances:
            instance.close()
        self.buffers.close()  # now, not when the garbage collector finds this model's reference cycle


def _names(names: Iterable[str]) -> str:
    """``['a','b']`` as Triton lists tensor names in its messages."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def device_input_gpu(
    config: mc.ModelConfig, backends: Sequence[object], reshaped: bool, cached: bool
) -> int:
    """The GPU every instance binds device inputs on, or -1 where a consumer needs the inputs in host memory.

    Host memory is needed by: a reshape outside the graph (``reshape`` in the config), the response cache (it
    hashes the bytes), sequence batching (its states and controls join the inputs on the host), Triton's ragged
    batching, Python models and ensembles (not tensor models that bind inputs), and instances on different GPUs.
    """
    if reshaped or cached or config.HasField("sequence_batching") or config.HasField("ensemble_scheduling"):
        return -1
    if config.batch_input or config.batch_output or any(t.allow_ragged_batch for t in config.input):
        return -1
    devices = {getattr(backend, "device_inputs", -1) for backend in backends}
    if len(devices) != 1:
        return -1
    device = next(iter(devices))
    return device if isinstance(device, int) else -1


def wants_pinned_inputs(config: mc.ModelConfig) -> bool:
    """Triton's ``optimization { input_pinned_memory { enable } }``: on unless the config turns it off."""
    optimization = config.optimization
    return not optimization.HasField("input_pinned_memory") or optimization.input_pinned_memory.enable

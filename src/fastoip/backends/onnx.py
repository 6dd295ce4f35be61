"""ONNX Runtime backend: one ``InferenceSession`` per model instance.

Rules:
- ``run`` is called from executor threads; ORT releases the GIL while it
  computes, so instances on different threads really run in parallel.
- Inputs arrive as numpy arrays that may be read-only views on wire bytes; ORT
  reads them in place (no copy on CPU).
- Outputs headed for shared memory are written there by ORT itself (IOBinding)
  when their shapes are known in advance; see ``_run_into``.
- The CUDA execution provider is used first when onnxruntime-gpu finds a GPU
  and the config's instance_group does not ask for KIND_CPU; otherwise CPU.
  The config's execution accelerators (TensorRT ahead of CUDA, OpenVINO) and
  CUDA EP options are read as Triton reads them (``ort_providers.py``); an
  accelerator this onnxruntime cannot start is left out and logged once.
- BYTES tensors: ORT's Python API only takes ``str`` elements and encodes them
  as UTF-8.  Elements that are valid UTF-8 are decoded (so string models see
  the text the client meant); when a tensor holds bytes that are not UTF-8 the
  whole request travels as latin-1, which maps every byte to one code point
  and back, so arbitrary bytes survive an identity bit-exact.  String outputs
  are encoded back with the same codec.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._proto import model_config_pb2 as mc
from ..cuda import (
    DeviceArray,
    DeviceBatch,
    DeviceBlock,
    DeviceBytes,
    DevicePool,
    gather_to_device,
    pinned_allocator,
    runtime,
)
from ..datatypes import ITEM_SIZES, ORT_TYPE_TO_V2, numpy_dtype
from ..errors import InternalError, InvalidArgument, ResourceExhausted
from ..model_config import ONNX_PLATFORM, DiscoveredTensor, complete_config
from ..scheduling.buffers import BufferPool, Lease
from .batch_buckets import PARAMETER, bucket_sizes, cut_rows, padded_feeds, smallest_fit
from .onnx_cost import check_graph
from .ort_graphs import DeviceCopier, GraphRunner, HostCopier, check_fixed_shapes, wants_cuda_graph
from .ort_options import apply_session_options, thread_counts
from .ort_providers import CUDA, OPENVINO, TENSORRT, Provider, plan_providers, provider_names, read_accelerators

if TYPE_CHECKING:
    from ..options import RepositoryOptions

log = logging.getLogger("fastoip.onnx")

BF16_ONNX_ELEMENT_TYPE = 16
#: Distinct input-shape sets remembered per session for in-place outputs (a bound, not a cache policy).
MAX_LEARNED_SHAPES = 256
#: Sessions with the OpenVINO EP are made one at a time: its session creation is not thread-safe (as in Triton).
_OPENVINO_LOCK = threading.Lock()


_preloaded = False


def _ort() -> Any:  # imported lazily: onnxruntime is heavy and not needed by the CLI's other commands
    import onnxruntime

    global _preloaded
    if not _preloaded:
        _preloaded = True
        # onnxruntime-gpu with NVIDIA's pip wheels (the [gpu] extra) finds their CUDA and
        # cuDNN only once they are preloaded; a CPU build returns at once.
        if hasattr(onnxruntime, "preload_dlls") and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            try:
                onnxruntime.preload_dlls()
            except Exception as exc:  # the CUDA EP then fails to load and ORT says why
                log.warning("onnxruntime.preload_dlls() failed: %s", exc)
    return onnxruntime


def available_providers() -> list[str]:
    """ORT's providers on this machine (CUDA only with onnxruntime-gpu and a driver)."""
    return list(_ort().get_available_providers())


def cuda_available() -> bool:
    return CUDA in available_providers()


class OnnxBackend:
    """One ORT session: the unit that ``instance_group { count }`` multiplies."""

    def __init__(
        self,
        model_path: Path,
        *,
        use_gpu: bool,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        device_id: int = 0,
        config: mc.ModelConfig | None = None,
        model_dir: Path | None = None,
        available: Sequence[str] | None = None,
        max_output_bytes: int = 0,
        constant_folding: bool = True,
    ) -> None:
        """``model_dir``: where the config's paths lie (default: the model file's folder); ``available``: the
        execution providers to choose from (default: ORT's); ``max_output_bytes``: the most one output of one
        request may take (0: no bound; ``onnx_cost``); ``constant_folding``: False where ORT's folding could build
        a tensor of unknown size at load (``onnx_cost.check_graph``)."""
        ort = _ort()
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads  # 0: ORT's default, one per physical core
        options.inter_op_num_threads = inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning worker threads burn the CPU the frontend needs between requests.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if config is not None:  # the config's optimisation settings, as Triton's onnxruntime backend reads them
            apply_session_options(config, options, ort)
        if max_output_bytes:
            # a bounded graph's tensors go back to the system once freed: ORT's CPU arena would keep the largest
            # one a request made it build (a refused 256 MB output stayed for the session's life)
            options.enable_cpu_mem_arena = False
        plan = plan_providers(
            config if config is not None else mc.ModelConfig(), gpu=use_gpu,
            available=available_providers() if available is None else available,
            model_dir=model_dir or model_path.parent, device_id=device_id,
        )
        #: What the config asked for that this session goes without (the loader logs the first instance's).
        self.notes = plan.notes
        disabled = () if constant_folding else ("ConstantFolding",)
        self.session = _open_session(ort, model_path, options, plan.providers, self.notes, disabled)
        #: The most bytes one output of one request may take (issue 37; 0: no bound), checked after each run.
        self.max_output_bytes = max_output_bytes
        #: The model batches (max_batch_size > 0): a run's first dim counts its requests (set at load).
        self.batches = False
        self.providers = self.session.get_providers()
        self.on_gpu = self.providers[0] in (TENSORRT, CUDA)
        self.on_tensorrt = self.providers[0] == TENSORRT
        self.device_id = device_id
        self.input_types = {i.name: ORT_TYPE_TO_V2.get(i.type, i.type) for i in self.session.get_inputs()}
        self.output_types = {o.name: ORT_TYPE_TO_V2.get(o.type, o.type) for o in self.session.get_outputs()}
        self._has_bf16 = "BF16" in self.input_types.values() or "BF16" in self.output_types.values()
        self._has_strings = "BYTES" in self.input_types.values() or "BYTES" in self.output_types.values()
        self._output_dtypes = {
            name: numpy_dtype(datatype) for name, datatype in self.output_types.items() if ITEM_SIZES.get(datatype)
        }
        #: (output names, input names and shapes) -> output shapes, or None where they follow the data.
        self._learned_shapes: dict[tuple, tuple | None] = {}
        # A bound run whose output shapes changed fails by design; ORT need not log it as an error.
        self._quiet_run = ort.RunOptions()
        self._quiet_run.log_severity_level = 4
        # The public ``run`` re-validates names the LoadedModel already checked (several µs a call);
        # on CPU call the binding directly.  CUDA keeps the public path for its EP-failure fallback.
        self._inner = self.session._sess
        self._run = self._inner.run if not self.on_gpu else self.session.run
        self._new_binding = ort.capi._pybind_state.SessionIOBinding
        self._host_device = ort.OrtDevice.make("cpu", 0)._get_c_device()
        #: Batch sizes with a session of their own (``batch_buckets``), ascending; empty: batches run as they come.
        self._buckets: tuple[int, ...] = ()
        self._bucket_backends: dict[int, OnnxBackend] = {}
        self._pad_pool: BufferPool | None = None
        #: The GPU this session reads inputs in device memory on (IO binding), or -1: inputs are host arrays.
        #: Not for strings or BF16 (ORT's Python API takes those only from the host).
        self.device_inputs = device_id if self.on_gpu and not self._has_strings and not self._has_bf16 else -1
        #: Where device inputs are bound (the session's GPU); batches of them are gathered in ``_device_pool``.
        self._input_device = self._gpu_device() if self.on_gpu else self._host_device
        self._device_pool = DevicePool()
        #: The CUDA EP was started with ``enable_cuda_graph``: every run goes through ``_graph`` (``ort_graphs.py``).
        self.cuda_graph = self.providers[0] == CUDA and wants_cuda_graph(self.session.get_provider_options()[CUDA])
        self._graph: GraphRunner | None = None

    def use_batch_buckets(self, sizes: tuple[int, ...], make_sibling: Callable[[], OnnxBackend]) -> None:
        """Run each batch on a session kept for one size in ``sizes``, padded up to it (``batch_buckets``).

        This session serves the largest size; ``make_sibling`` builds one more for every other.  Each is run
        once at its size now, so no request pays for planning it.
        """
        if not sizes:
            return
        self._bucket_backends = {size: make_sibling() for size in sizes[:-1]}
        self._bucket_backends[sizes[-1]] = self
        self._pad_pool = BufferPool(pinned_allocator if self.on_gpu else None)
        self._buckets = sizes
        for size, backend in self._bucket_backends.items():
            backend.warm_up(size)

    def warm_up(self, batch_size: int) -> None:
        """One run on zeros with dim 0 ``batch_size``, where every other input dim is fixed (else the first
        real batch plans the shape)."""
        if self.cuda_graph:
            return  # a plain run would capture the graph on ORT's own buffers: ``use_graphs`` warms it up instead
        feeds = {}
        for item in self.session.get_inputs():
            dims = list(item.shape or ())[1:]
            datatype = ORT_TYPE_TO_V2.get(item.type)
            if datatype in (None, "BYTES", "BF16") or not all(type(d) is int and d > 0 for d in dims):
                return
            feeds[item.name] = np.zeros((batch_size, *dims), numpy_dtype(datatype))
        try:
            self.session.run(None, feeds)
        except Exception as exc:  # a model may refuse zeros; real batches then plan the shape
            log.warning("warming the batch-%d session up failed: %s", batch_size, exc)

    def discover(self) -> tuple[list[DiscoveredTensor], list[DiscoveredTensor]]:
        """The model's inputs and outputs, for config auto-complete."""

        def tensors(items: Any) -> list[DiscoveredTensor]:
            found = []
            for item in items:
                datatype = ORT_TYPE_TO_V2.get(item.type)
                if datatype is None:
                    raise InvalidArgument(f"tensor '{item.name}' has type {item.type}, which V2 cannot carry")
                shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (item.shape or ()))
                found.append(DiscoveredTensor(item.name, datatype, shape))
            return found

        return tensors(self.session.get_inputs()), tensors(self.session.get_outputs())

    def run(
        self,
        feeds: dict[str, np.ndarray],
        output_names: Sequence[str],
        destinations: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Execute once; outputs in ``output_names`` order.

        ``destinations`` (output name -> writable bytes, e.g. a shared-memory
        region) lets ORT write those outputs there directly; see ``_run_into``.
        """
        if self._graph is not None:
            outputs = self._run_graph(feeds, output_names)
        elif self.device_inputs >= 0 and _in_device_memory(feeds):
            outputs = self._run_device(feeds, output_names, destinations)
        elif self._buckets and feeds:
            outputs = self._run_bucketed(feeds, output_names, destinations)
        else:
            outputs = self._run_as_given(feeds, output_names, destinations)
        if self.max_output_bytes:
            refusal = self._output_refusal(feeds, output_names, outputs)
            if refusal is not None:
                # the arrays go now: the refusal's traceback keeps this frame, so nothing here may hold them
                outputs.clear()
                raise refusal
        return outputs

    def _output_refusal(self, feeds: dict, output_names: Sequence[str], outputs: list) -> ResourceExhausted | None:
        """The error for a run whose output passes ``max_output_bytes`` per request of the batch (its rows)."""
        rows = 1
        if self.batches and feeds:
            first = next(iter(feeds.values()))
            rows = max(int(first.shape[0]), 1) if len(first.shape) else 1
        limit = self.max_output_bytes * rows
        sizes = [_output_bytes(output) for output in outputs]
        for name, size in zip(output_names, sizes, strict=False):
            if size > limit:
                each = "" if rows == 1 else f"{rows} requests of {self.max_output_bytes} bytes each, "
                return ResourceExhausted(
                    f"output '{name}' is {size} bytes, more than the {limit} bytes this model may answer with "
                    f"({each}--onnx-max-tensor-bytes)", http_status=500,
                )
        return None

    def use_graphs(self, batch: int | None) -> None:
        """Run every batch on buffers bound once, as a captured CUDA graph needs (``ort_graphs.py``): this session's
        and each bucket's, each warmed up (and so captured) now.  ``batch``: this session's batch size (None: the
        model does not batch)."""
        sessions: list[tuple[int | None, OnnxBackend]] = list(self._bucket_backends.items()) or [(batch, self)]
        for size, backend in sessions:  # (self is among the buckets' sessions: the largest)
            cuda = runtime() if backend.on_gpu else None
            copier = DeviceCopier(cuda) if cuda is not None else HostCopier()
            device = ("cuda", backend.device_id) if backend.on_gpu else ("cpu", 0)
            graph = GraphRunner(_ort(), backend.session, size, device, copier)
            graph.warm_up()
            backend._graph = graph

    def _run_graph(self, feeds: dict, output_names: Sequence[str]) -> list[np.ndarray]:
        """``run`` on the bound buffers of the session whose batch size holds the batch (``use_graphs``)."""
        graph = self._graph
        assert graph is not None
        if graph.batch is None or not feeds:
            return graph.run(feeds, 0, output_names)
        first = next(iter(feeds.values()))
        rows = int(first.shape[0])
        backend = self._bucket_backends.get(smallest_fit(self._buckets, rows), self) if self._buckets else self
        runner = backend._graph
        if runner is None or runner.batch is None or runner.batch < rows:
            raise InternalError(f"no CUDA graph session holds a batch of {rows}")
        return runner.run(feeds, rows, output_names)

    def _run_device(
        self, feeds: dict, output_names: Sequence[str], destinations: dict[str, np.ndarray] | None
    ) -> list[np.ndarray]:
        """``run`` where some inputs are in device memory (CUDA regions): bound there, never copied to the host.

        One request's device input is bound where it lies; a batch's parts (a ``DeviceBatch``), and any input of a
        batch padded up to a bucket, are gathered into one device buffer of the batch's size first (device to
        device; host parts are copied up).
        """
        first = next(iter(feeds.values()))
        rows = int(first.shape[0]) if len(first.shape) else 0
        size = smallest_fit(self._buckets, rows) if self._buckets else rows
        backend = self._bucket_backends.get(size, self)
        taken: list[tuple[str, DeviceBlock]] = []
        try:
            bound: dict = {}
            for name, value in feeds.items():
                if type(value) is DeviceBatch:
                    bound[name] = gather_to_device(name, value.parts, size, self.device_id, self._device_pool, taken)
                elif size != rows:
                    bound[name] = gather_to_device(name, [value], size, self.device_id, self._device_pool, taken)
                else:
                    bound[name] = value
            outputs = backend._run_bound(bound, output_names, destinations if size == rows else None)
        finally:
            # ORT's outputs are its own memory (or the client's regions), never the gathered inputs.
            for name, block in taken:
                self._device_pool.give_back(name, block)
        return cut_rows(outputs, rows, size) if size != rows else outputs

    def _run_bound(
        self, feeds: dict, output_names: Sequence[str], destinations: dict[str, np.ndarray] | None
    ) -> list[np.ndarray]:
        """One run through IO binding: device inputs bound where they lie, host ones as arrays; outputs into their
        shared-memory destinations where the shapes are known (as ``_run_into``), else to host memory."""
        key = (tuple(output_names), tuple((name, tuple(value.shape)) for name, value in feeds.items()))
        shapes = self._learned_shapes.get(key) if destinations is not None else None
        views = self._bind_views(output_names, shapes, destinations) if shapes is not None and destinations else None
        for attempt in (views, None) if views is not None else (None,):
            binding = self._new_binding(self._inner)
            for name, value in feeds.items():
                if type(value) is DeviceArray:
                    binding.bind_input(name, self._input_device, value.dtype, list(value.shape), value.where.pointer)
                else:
                    binding.bind_input(name, value)
            for index, name in enumerate(output_names):
                view = attempt[index] if attempt is not None else None
                if view is None:
                    binding.bind_output(name, self._host_device)
                elif type(view) is DeviceArray:
                    binding.bind_output(name, self._gpu_device(), view.dtype, view.shape, view.where.pointer)
                else:
                    binding.bind_output(name, self._host_device, view.dtype, view.shape, view.ctypes.data)
            try:
                self._inner.run_with_iobinding(binding, self._quiet_run if attempt is not None else None)
            except Exception as exc:
                if attempt is not None:  # the shapes follow the data: stop binding them, run the ordinary way
                    self._learned_shapes[key] = None
                    continue
                raise InternalError(f"onnxruntime failed: {exc}") from None
            if attempt is not None:
                if self.on_gpu:
                    binding.synchronize_outputs()
                return attempt
            outputs: list[np.ndarray] = binding.copy_outputs_to_cpu()
            if destinations is not None and key not in self._learned_shapes:
                if len(self._learned_shapes) >= MAX_LEARNED_SHAPES:
                    self._learned_shapes.clear()
                self._learned_shapes[key] = tuple(out.shape for out in outputs)
            return outputs
        raise InternalError("onnxruntime: no run was made")  # pragma: no cover - the loop always returns

    def _run_bucketed(
        self, feeds: dict[str, np.ndarray], output_names: Sequence[str], destinations: dict[str, np.ndarray] | None
    ) -> list[np.ndarray]:
        """``run`` on the session kept for the smallest bucket that holds the batch, padded up to it."""
        first = next(iter(feeds.values()))
        rows = first.shape[0] if first.ndim else 0
        size = smallest_fit(self._buckets, rows)
        backend = self._bucket_backends.get(size)
        if backend is None or size == rows:  # no padding: shared-memory outputs can still be written in place
            return (backend or self)._run_as_given(feeds, output_names, destinations)
        pool = self._pad_pool
        assert pool is not None  # set with the buckets
        leases: list[Lease] = []
        try:
            outputs = backend._run_as_given(padded_feeds(feeds, rows, size, pool, leases), output_names, None)
        finally:
            # ORT's outputs are new arrays, never views on the padded inputs: the buffers can go back now.
            for lease in leases:
                pool.give_back(lease)
        return cut_rows(outputs, rows, size)

    def _run_as_given(
        self, feeds: dict[str, np.ndarray], output_names: Sequence[str], destinations: dict[str, np.ndarray] | None
    ) -> list[np.ndarray]:
        if destinations is not None and not self._has_strings and not self._has_bf16:
            return self._run_into(feeds, output_names, destinations)
        if not self._has_strings and not self._has_bf16:
            try:
                return self._run(output_names, feeds, None)
            except Exception as exc:
                raise InternalError(f"onnxruntime failed: {exc}") from None
        text_codec: str | None = None
        ort_feeds: dict = {}
        for name, array in feeds.items():
            if array.dtype == object:
                array, text_codec = _strings_for_ort(array, text_codec)
            ort_feeds[name] = array
        try:
            if self._has_bf16:
                outputs = self._run_with_ort_values(ort_feeds, output_names)
            else:
                outputs = self._run(output_names, ort_feeds, None)
        except Exception as exc:
            raise InternalError(f"onnxruntime failed: {exc}") from None
        for index, out in enumerate(outputs):
            if out.dtype == object:
                outputs[index] = _bytes_from_ort(out, text_codec or "utf-8")
        return outputs

    def _run_into(
        self, feeds: dict[str, np.ndarray], output_names: Sequence[str], destinations: dict[str, np.ndarray]
    ) -> list[np.ndarray]:
        """Run with ORT writing outputs straight into ``destinations`` (no output copy).

        ORT needs each bound output's exact shape before it runs, and V2 models
        may have dynamic output shapes.  So the shapes one run produced for a
        given set of input shapes are remembered, and the next run with the same
        input shapes binds its outputs to the destinations.  A run whose outputs
        turn out differently (data-dependent shapes) fails in ORT and is simply
        run again the ordinary way, after which the caller copies; those input
        shapes are then never bound again (the model's shapes follow its data).
        """
        key = (tuple(output_names), tuple((name, array.shape) for name, array in feeds.items()))
        shapes = self._learned_shapes.get(key)
        views = self._bind_views(output_names, shapes, destinations) if shapes is not None else None
        if views is not None:
            # ORT's binding object itself: the public wrapper adds several µs of checks per call.
            binding = self._new_binding(self._inner)
            for name, array in feeds.items():
                binding.bind_input(name, array)
            for name, view in zip(output_names, views, strict=False):
                if type(view) is DeviceArray:  # a CUDA shared-memory region on this session's GPU
                    binding.bind_output(name, self._gpu_device(), view.dtype, view.shape, view.where.pointer)
                else:
                    binding.bind_output(name, self._host_device, view.dtype, view.shape, view.ctypes.data)
            try:
                self._inner.run_with_iobinding(binding, self._quiet_run)
                if self.on_gpu:
                    binding.synchronize_outputs()
                return views
            except Exception:  # the shapes follow the data: stop binding them, run the ordinary way
                self._learned_shapes[key] = None
        try:
            outputs = self._run(output_names, feeds, None)
        except Exception as exc:
            raise InternalError(f"onnxruntime failed: {exc}") from None
        if key not in self._learned_shapes:
            if len(self._learned_shapes) >= MAX_LEARNED_SHAPES:
                self._learned_shapes.clear()
            self._learned_shapes[key] = tuple(out.shape for out in outputs)
        return outputs

    def _bind_views(self, output_names: Sequence[str], shapes: tuple, destinations: dict) -> list | None:
        """Typed views on each output's destination, or None when one does not fit or has none.

        Host destinations get numpy views; device memory (a CUDA region) is bound
        only on the CUDA EP of the same GPU, otherwise the caller copies it there.
        """
        views: list = []
        for name, shape in zip(output_names, shapes, strict=False):
            destination = destinations.get(name)
            dtype = self._output_dtypes.get(name)
            if destination is None or dtype is None:
                return None
            nbytes = dtype.itemsize * math.prod(shape)
            if nbytes > destination.nbytes:
                return None
            if type(destination) is DeviceBytes:
                if not self.on_gpu or destination.device_id != self.device_id or destination.pointer % dtype.alignment:
                    return None
                views.append(DeviceArray(destination, dtype, tuple(shape)))
            elif destination.ctypes.data % dtype.alignment:
                return None
            else:
                views.append(np.ndarray(shape, dtype, destination))
        return views

    def _gpu_device(self) -> Any:
        return _ort().OrtDevice.make("cuda", self.device_id)._get_c_device()

    def _run_with_ort_values(self, feeds: dict, output_names: Sequence[str]) -> list[np.ndarray]:
        ort = _ort()
        values = {}
        for name, array in feeds.items():
            if self.input_types.get(name) == "BF16":
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array), BF16_ONNX_ELEMENT_TYPE
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
        results = self.session.run_with_ort_values(list(output_names), values)
        outputs = []
        for name, value in zip(output_names, results, strict=False):
            if self.output_types.get(name) == "BF16":
                outputs.append(_bf16_bits(value))
            else:
                outputs.append(value.numpy())
        return outputs

    def is_ready(self) -> bool:
        return self.session is not None

    def is_alive(self) -> bool:
        return self.session is not None

    def close(self) -> None:
        # Every reference to the native session goes, or a reload keeps the old one (its weights, arena).
        siblings = [backend for backend in self._bucket_backends.values() if backend is not self]
        self._bucket_backends = {}
        self._buckets = ()
        if self._pad_pool is not None:
            self._pad_pool.close()
        self._device_pool.close()
        for backend in siblings:
            backend.close()
        self.session = None
        self._inner = self._run = None


def _open_session(
    ort: Any, model_path: Path, options: Any, providers: list[Provider], notes: list[str], disabled: Sequence[str] = ()
) -> Any:
    """An ORT session on ``providers``; without TensorRT (noted) when ORT cannot start it.

    ORT's Python API retries a session whose providers fail to start on its own fallback list, without their
    options (and prints about it).  Where the config set options, that retry is off while the session is made
    and on again after, for the run-time fallback every session has.  Then a failed TensorRT is retried here with
    the CUDA options kept; a CUDA EP that fails with the config's options but starts without them fails the load
    (the options are bad, as Triton refuses them); one that does not start at all (no usable GPU) leaves the
    model on the CPU, as for a config without options.
    """
    names = provider_names(providers)
    configured = any(not isinstance(provider, str) and set(provider[1]) - {"device_id"} for provider in providers)
    one_at_a_time: AbstractContextManager = _OPENVINO_LOCK if OPENVINO in names else nullcontext()
    try:
        with one_at_a_time:
            session = ort.InferenceSession(
                str(model_path), options, providers=providers, enable_fallback=0 if configured else 1,
                disabled_optimizers=list(disabled) or None,
            )
    except Exception as exc:  # ORT raises several unrelated exception types
        if TENSORRT in names:
            notes.append(f"the tensorrt execution accelerator is not used: onnxruntime could not start {TENSORRT} "
                         f"({exc})")
        elif CUDA in names and not _cuda_starts(ort, model_path, options, providers[names.index(CUDA)]):
            # the GPU is at fault, not the options: the CPU, as ORT's own fallback does for a plain config
            notes.append(f"the CUDA EP could not start ({exc}); the model runs on the CPU")
        else:
            raise InvalidArgument(f"onnxruntime could not load {model_path}: {exc}") from None
        gone = TENSORRT if TENSORRT in names else CUDA
        others = [provider for provider, name in zip(providers, names, strict=True) if name != gone]
        return _open_session(ort, model_path, options, others, notes, disabled)
    if configured:
        session.enable_fallback()
    started = session.get_providers()
    if TENSORRT in names and TENSORRT not in started:
        notes.append(
            f"the tensorrt execution accelerator is not used: onnxruntime did not start {TENSORRT} (are TensorRT's "
            f"libraries installed? onnxruntime's log says why); the model runs on {', '.join(started)}"
        )
    return session


def _cuda_starts(ort: Any, model_path: Path, options: Any, cuda: Provider) -> bool:
    """Whether the CUDA EP starts at all with nothing but ``cuda``'s device_id (False: the GPU is at fault)."""
    device = {"device_id": cuda[1]["device_id"]} if not isinstance(cuda, str) else {}
    try:
        session = ort.InferenceSession(str(model_path), options, providers=[(CUDA, device)], enable_fallback=0)
    except Exception:  # ORT raises several unrelated exception types
        return False
    return CUDA in session.get_providers()


def _output_bytes(output: Any) -> int:
    """An output's bytes; a string tensor's elements counted as their lengths plus an object's cost."""
    if type(output) is np.ndarray and output.dtype == object:
        return int(sum(len(element) for element in output.reshape(-1))) + output.size * 8
    return int(getattr(output, "nbytes", 0))


def _in_device_memory(feeds: dict) -> bool:
    """Whether any input is in device memory (a CUDA-region input, or a batch holding one)."""
    for value in feeds.values():
        if type(value) is DeviceArray or type(value) is DeviceBatch:
            return True
    return False


def _bf16_bits(value: Any) -> np.ndarray:
    """The raw bits of a bfloat16 OrtValue as uint16 (copy through the OrtValue's buffer)."""
    shape = tuple(value.shape())
    count = int(np.prod(shape)) if shape else 1
    raw = np.ctypeslib.as_array(
        (ctypes.c_uint16 * count).from_address(value.data_ptr())
    )
    return raw.copy().reshape(shape)  # copy: the OrtValue owns the memory and goes away


def _strings_for_ort(array: np.ndarray, codec: str | None) -> tuple[np.ndarray, str]:
    """Object array of bytes -> object array of str that ORT accepts (see module rules)."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    if codec is None or codec == "utf-8":
        try:
            for i, element in enumerate(flat):
                out[i] = element.decode("utf-8") if isinstance(element, bytes) else str(element)
            return out.reshape(array.shape), "utf-8"
        except UnicodeDecodeError:
            pass
    for i, element in enumerate(flat):
        out[i] = element.decode("latin-1") if isinstance(element, bytes) else str(element)
    return out.reshape(array.shape), "latin-1"


def _bytes_from_ort(array: np.ndarray, codec: str) -> np.ndarray:
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, element in enumerate(flat):
        out[i] = element.encode(codec) if isinstance(element, str) else bytes(element)
    return out.reshape(array.shape)


class OnnxKind:
    """The ``onnxruntime`` backend kind (platform ``onnxruntime_onnx``)."""

    name = "onnxruntime"
    platforms = (ONNX_PLATFORM,)
    default_filename = "model.onnx"

    def load(
        self, model_name: str, version: int, path: Path, base: mc.ModelConfig, options: RepositoryOptions
    ) -> tuple[mc.ModelConfig, list[OnnxBackend]]:
        intra, inter = thread_counts(base, options.intra_op_threads, options.inter_op_threads)
        bound = options.onnx_max_tensor_bytes if options.bound_onnx_graph else 0
        folding = True
        if bound:  # issue 37: a bounded graph is sized before ORT sees it (ORT's constant folding builds at load)
            folding = not check_graph(model_name, path, bound).no_constant_folding
        wants_cpu = any(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in base.instance_group)
        use_gpu = options.use_gpu and not wants_cpu
        available = available_providers()

        def make_backend(device_id: int = 0) -> OnnxBackend:
            return OnnxBackend(
                path, use_gpu=use_gpu, intra_op_threads=intra, inter_op_threads=inter, device_id=device_id,
                config=base, model_dir=path.parent.parent, available=available, max_output_bytes=bound,
                constant_folding=folding,
            )

        first = make_backend(instance_devices(base)[0])
        for note in first.notes:
            log.warning("model '%s': %s", model_name, note)
        if base.optimization.HasField("execution_accelerators"):
            log.info("model '%s': execution providers %s", model_name, first.providers)
        if not first.on_tensorrt:  # TensorRT was not asked for, or did not start: the other sessions go without
            available = [name for name in available if name != TENSORRT]
        inputs, outputs = first.discover()
        config = complete_config(
            base, model_name, inputs, outputs, options.default_max_batch_size, on_gpu=first.on_gpu,
            auto_complete=options.auto_complete,
        )
        # CUDA graphs need every shape fixed: refused here on every machine, as a GPU server would refuse it
        graphs_wanted = wants_cuda_graph(read_accelerators(config, path.parent.parent).cuda)
        if graphs_wanted:
            check_fixed_shapes(config, inputs, outputs)
        devices = instance_devices(config)
        backends = [first]
        try:
            for device in devices[1:]:
                if options.check_stop is not None:  # issue 37: the server stops, or the load's client left
                    options.check_stop()
                backends.append(make_backend(device))
        except BaseException:
            for backend in backends:
                backend.close()
            raise
        sizes = bucket_sizes(config, path, first.on_gpu, tensorrt=first.on_tensorrt, cuda_graph=first.cuda_graph)
        if sizes:
            log.info("model '%s': a session for each batch size of %s (%s)", model_name, list(sizes), PARAMETER)
        for backend, device in zip(backends, devices, strict=False):
            backend.batches = config.max_batch_size > 0
            backend.use_batch_buckets(sizes, functools.partial(make_backend, device))
            if backend.cuda_graph:
                backend.use_graphs(sizes[-1] if sizes else (config.max_batch_size or None))
        if graphs_wanted and not first.cuda_graph:
            log.warning("model '%s': CUDA graphs are asked for, but the model runs on %s", model_name,
                        first.providers[0])
        return config, backends


def instance_devices(config: mc.ModelConfig) -> list[int]:
    """The GPU of each instance, as Triton places them: ``count`` instances on each GPU of a group.

    CPU groups (and a session that ends up on the CPU) ignore the number.
    """
    devices: list[int] = []
    for group in config.instance_group:
        gpus = list(group.gpus) if group.kind != mc.ModelInstanceGroup.KIND_CPU and group.gpus else [0]
        for gpu in gpus:
            devices += [gpu] * max(group.count, 1)
    return devices or [0]

KIND = OnnxKind()

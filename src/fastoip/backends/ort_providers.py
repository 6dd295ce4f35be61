"""The execution providers of an ONNX model's sessions, chosen from its config as Triton's onnxruntime backend
chooses them (``ModelState::LoadModel`` in triton-inference-server/onnxruntime_backend, ``src/onnxruntime.cc``).

Rules:
- Order: on the GPU, TensorRT (``optimization { execution_accelerators { gpu_execution_accelerator
  { name: "tensorrt" } } }``), then CUDA, then the CPU accelerators (``cpu_execution_accelerator { name:
  "openvino" }``), then the CPU EP.  A session on the CPU (a KIND_CPU group, ``--cpu-only``, or an onnxruntime
  without the CUDA EP) leaves the GPU accelerators out, as Triton does for CPU instances, and a note says so.
- ``tensorrt`` takes Triton's parameters (:data:`TENSORRT_PARAMETERS`): ``precision_mode`` FP32 / FP16 / BF16 /
  INT8 turns on ORT's ``trt_fp16_enable`` / ``trt_bf16_enable`` / ``trt_int8_enable`` (FP32: none);
  ``max_workspace_size_bytes`` is ORT's ``trt_max_workspace_size``, ``int8_*`` are ORT's ``trt_int8_*``, the
  others keep their names.  Any other parameter is refused, as Triton refuses it.
- ``cuda`` takes CUDA EP options by ORT's names.  The values of the options listed here (:data:`CUDA_ENUMS`,
  :data:`CUDA_OPTION_KINDS`) are checked; other names go to ORT as given, and ORT refuses those it does not know
  when the session starts on a GPU (the model then fails to load, as in Triton).  ``device_id`` and
  ``has_user_compute_stream`` are fastoip's to set (Triton overrides them too): ignored with a note.  Options that
  are memory addresses (``user_compute_stream``, ``gpu_external_*``) are refused: a config cannot give them.
- The model's ``parameters`` ``cudnn_conv_algo_search`` (0 EXHAUSTIVE, 1 HEURISTIC, 2 DEFAULT), ``gpu_mem_limit``
  (bytes), ``arena_extend_strategy`` (0 kNextPowerOfTwo, 1 kSameAsRequested) and ``do_copy_in_default_stream``
  are Triton's older spelling of CUDA EP options; they win over the ``cuda`` accelerator's.  Options left unset
  keep ORT's defaults (which are Triton's).
- ``openvino``: the OpenVINO EP with ``device_type`` CPU, as Triton (which reads no parameters for it; given
  ones are noted as ignored).
- Any other accelerator name is refused ("unknown execution accelerator ... is requested", Triton's words).
- Every value is checked on every machine, GPU or not: a config a GPU server would refuse is refused everywhere.
- An accelerator whose execution provider this onnxruntime lacks is left out with a note; the model still loads.
- Paths the TensorRT EP writes or loads (``trt_engine_cache_path``, ``trt_timing_cache_path``,
  ``trt_ep_context_file_path``, each of ``trt_extra_plugin_lib_paths``) come from the config, so they are not
  trusted: each must lie inside the model's directory (a relative one is taken from there; neither ``..`` nor a
  symbolic link may lead out of it) and reaches ORT resolved.  File-name parameters (``int8_calibration_table_name``,
  ``trt_engine_cache_prefix``) may not hold a path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument
from .ort_options import model_parameter, parse_flag

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"

#: One entry of ORT's ``providers`` argument: a name, or a name and its options.
Provider = str | tuple[str, dict[str, str]]

# The kinds of value a parameter takes.
INT, SIZE, FLAG, TEXT, PATH, PATHS, NAME = "integer", "size", "flag", "text", "path", "paths", "file name"

#: Triton's ``tensorrt`` accelerator parameters (``precision_mode`` apart) and the kind of value each takes.
TENSORRT_PARAMETERS: dict[str, str] = {
    "max_workspace_size_bytes": SIZE,
    "trt_max_partition_iterations": INT,
    "trt_min_subgraph_size": INT,
    "int8_calibration_table_name": NAME,
    "int8_use_native_calibration_table": FLAG,
    "trt_dla_enable": FLAG,
    "trt_dla_core": INT,
    "trt_engine_cache_enable": FLAG,
    "trt_engine_cache_path": PATH,
    "trt_engine_cache_prefix": NAME,
    "trt_dump_subgraphs": FLAG,
    "trt_force_sequential_engine_build": FLAG,
    "trt_context_memory_sharing_enable": FLAG,
    "trt_layer_norm_fp32_fallback": FLAG,
    "trt_timing_cache_enable": FLAG,
    "trt_timing_cache_path": PATH,
    "trt_force_timing_cache": FLAG,
    "trt_detailed_build_log": FLAG,
    "trt_build_heuristics_enable": FLAG,
    "trt_sparsity_enable": FLAG,
    "trt_builder_optimization_level": INT,
    "trt_auxiliary_streams": INT,
    "trt_tactic_sources": TEXT,
    "trt_extra_plugin_lib_paths": PATHS,
    "trt_profile_min_shapes": TEXT,
    "trt_profile_max_shapes": TEXT,
    "trt_profile_opt_shapes": TEXT,
    "trt_cuda_graph_enable": FLAG,
    "trt_dump_ep_context_model": FLAG,
    "trt_ep_context_file_path": PATH,
    "trt_ep_context_embed_mode": INT,
}
#: Triton's names that ORT's TensorRT EP spells differently.
TENSORRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
#: ``precision_mode`` -> the ORT option it turns on.
PRECISIONS: dict[str, str | None] = {
    "FP32": None, "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable",
}
#: ORT's Python API reads TensorRT flags as True/False; the CUDA EP's as 0/1.
TENSORRT_FLAGS = ("False", "True")
CUDA_FLAGS = ("0", "1")

#: CUDA EP options whose value is one of ORT's names; Triton's numbers (the position here) are taken too.
CUDA_ENUMS: dict[str, tuple[str, ...]] = {
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
}
#: CUDA EP options whose values are checked here (any other goes to ORT as given).
CUDA_OPTION_KINDS: dict[str, str] = {
    "gpu_mem_limit": SIZE,
    "do_copy_in_default_stream": FLAG,
    "use_ep_level_unified_stream": FLAG,
    "cudnn_conv_use_max_workspace": FLAG,
    "cudnn_conv1d_pad_to_nc1d": FLAG,
    "enable_cuda_graph": FLAG,
    "enable_skip_layer_norm_strict_mode": FLAG,
    "prefer_nhwc": FLAG,
    "use_tf32": FLAG,
    "tunable_op_enable": FLAG,
    "tunable_op_tuning_enable": FLAG,
    "tunable_op_max_tuning_duration_ms": INT,
    # listed by onnxruntime-gpu 1.31 (seen on an H200, 2026-11-27)
    "sdpa_kernel": INT,
    "fuse_conv_bias": FLAG,
    "enable_cudnn": FLAG,
    "external_data_loader_reading_threads": INT,
}
#: CUDA EP options fastoip sets itself (the instance's GPU; no stream of its own).
CUDA_SET_BY_FASTOIP = ("device_id", "has_user_compute_stream")
#: CUDA EP options that are memory addresses in the server process.
CUDA_ADDRESSES = ("user_compute_stream", "gpu_external_alloc", "gpu_external_free", "gpu_external_empty_cache")
#: Triton's model parameters for the CUDA EP (its older spelling of the ``cuda`` accelerator's options).
LEGACY_CUDA_PARAMETERS = (
    "cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream",
)

GPU_ACCELERATORS = ("tensorrt", "cuda")
CPU_ACCELERATORS = ("openvino",)
INT_RANGE = (-(2**31), 2**31 - 1)
SIZE_RANGE = (0, 2**64 - 1)


class ProviderPlan(NamedTuple):
    """ORT's ``providers`` for one session, and what the config asked for that it leaves out (for the log)."""

    providers: list[Provider]
    notes: list[str]


@dataclass
class Accelerators:
    """What a config's execution accelerators and CUDA parameters ask of a session, checked."""

    #: ORT TensorRT EP options (no device_id); None when the config does not ask for TensorRT.
    tensorrt: dict[str, str] | None = None
    #: ORT CUDA EP options (no device_id).
    cuda: dict[str, str] = field(default_factory=dict)
    openvino: bool = False
    #: The GPU accelerators named, in order.
    gpu_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_providers(
    config: mc.ModelConfig, *, gpu: bool, available: Sequence[str], model_dir: Path, device_id: int = 0
) -> ProviderPlan:
    """ORT's ``providers`` for a session of ``config`` (see the module rules).

    ``gpu``: the instance may use the GPU (its group is not KIND_CPU and the server may use GPUs); the session is
    on the GPU when ``available`` (ORT's available providers) also has the CUDA EP.  ``device_id``: the instance's
    GPU.  ``model_dir``: the model's directory, which holds every path the config gives.  Raises InvalidArgument
    for a config Triton would refuse.
    """
    wanted = read_accelerators(config, model_dir)
    notes = list(wanted.notes)
    providers: list[Provider] = []
    device = str(device_id)
    if gpu and CUDA in available:
        if wanted.tensorrt is not None:
            if TENSORRT in available:
                providers.append((TENSORRT, {**wanted.tensorrt, "device_id": device}))
            else:
                notes.append(
                    f"the tensorrt execution accelerator is not used: this onnxruntime has no {TENSORRT} "
                    f"(available: {', '.join(available)}); the model runs on the CUDA EP"
                )
        providers.append((CUDA, {**wanted.cuda, "device_id": device}))
    elif wanted.gpu_names:
        notes.append(
            f"gpu_execution_accelerator {', '.join(wanted.gpu_names)} not used: the model runs on the CPU "
            "(Triton ignores GPU accelerators for CPU instances too)"
        )
    if wanted.openvino:
        if OPENVINO in available:
            providers.append((OPENVINO, {"device_type": "CPU"}))
        else:
            notes.append(
                f"the openvino execution accelerator is not used: this onnxruntime has no {OPENVINO} "
                f"(available: {', '.join(available)}); the model runs on the {'CUDA' if providers else 'CPU'} EP"
            )
    providers.append(CPU)
    return ProviderPlan(providers, notes)


def provider_names(providers: Sequence[Provider]) -> list[str]:
    return [provider if isinstance(provider, str) else provider[0] for provider in providers]


def read_accelerators(config: mc.ModelConfig, model_dir: Path) -> Accelerators:
    """The config's execution accelerators and CUDA parameters, checked (InvalidArgument for a bad one)."""
    check = _Checker(config.name, model_dir)
    found = Accelerators()
    accelerators = config.optimization.execution_accelerators
    for accelerator in accelerators.gpu_execution_accelerator:
        if accelerator.name == "tensorrt":
            if found.tensorrt is not None:
                raise check.refuse("optimization.execution_accelerators", "lists the tensorrt accelerator twice")
            found.tensorrt = _tensorrt_options(check, accelerator.parameters)
        elif accelerator.name == "cuda":
            found.cuda.update(_cuda_options(check, accelerator.parameters, found.notes))
        else:
            raise check.unknown(accelerator.name)
        found.gpu_names.append(accelerator.name)
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name not in CPU_ACCELERATORS:
            raise check.unknown(accelerator.name)
        found.openvino = True
        if accelerator.parameters:
            found.notes.append(
                f"the openvino execution accelerator's parameters {sorted(accelerator.parameters)} are ignored "
                "(Triton reads none: OpenVINO runs with device_type CPU)"
            )
    for key in LEGACY_CUDA_PARAMETERS:
        text = model_parameter(config, key)
        if text is not None:
            found.cuda[key] = check.cuda_value(f"parameter '{key}'", key, text)
    return found


def _tensorrt_options(check: _Checker, parameters: Mapping[str, str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key in sorted(parameters):
        text = parameters[key]
        what = f"parameter '{key}' of the tensorrt execution accelerator"
        if key == "precision_mode":
            if text not in PRECISIONS:
                raise check.refuse(what, f"must be FP32, FP16, BF16 or INT8: unsupported precision mode '{text}'")
            enabled = PRECISIONS[text]
            if enabled is not None:
                options[enabled] = TENSORRT_FLAGS[True]
            continue
        kind = TENSORRT_PARAMETERS.get(key)
        if kind is None:
            raise InvalidArgument(
                f"model '{check.model}': unknown parameter '{key}' is provided for the tensorrt execution "
                f"accelerator (it takes precision_mode, {', '.join(TENSORRT_PARAMETERS)})"
            )
        if text or kind in (INT, SIZE, FLAG):  # as Triton: an empty text or path is no setting, an empty number is
            options[TENSORRT_RENAMED.get(key, key)] = check.value(what, kind, text, TENSORRT_FLAGS)
    return options


def _cuda_options(check: _Checker, parameters: Mapping[str, str], notes: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key in sorted(parameters):
        what = f"parameter '{key}' of the cuda execution accelerator"
        if key in CUDA_ADDRESSES:
            raise check.refuse(what, "is a memory address in the server, which a model config cannot give")
        if key in CUDA_SET_BY_FASTOIP:
            notes.append(f"{what} is ignored: fastoip sets it from the instance group")
        elif parameters[key]:  # as Triton: an empty value is no setting
            options[key] = check.cuda_value(what, key, parameters[key])
    return options


@dataclass
class _Checker:
    """Reads one model's parameter values, refusing a bad one with a message that names it."""

    model: str
    model_dir: Path

    def refuse(self, what: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"model '{self.model}': {what} {why}")

    def unknown(self, name: str) -> InvalidArgument:
        return InvalidArgument(
            f"model '{self.model}': unknown execution accelerator '{name}' is requested (gpu_execution_accelerator "
            f"takes {' or '.join(GPU_ACCELERATORS)}, cpu_execution_accelerator {' or '.join(CPU_ACCELERATORS)})"
        )

    def cuda_value(self, what: str, key: str, text: str) -> str:
        names = CUDA_ENUMS.get(key)
        if names is None:
            return self.value(what, CUDA_OPTION_KINDS.get(key, TEXT), text, CUDA_FLAGS)
        stripped = text.strip()
        if stripped in names:
            return stripped
        numbers = [str(index) for index in range(len(names))]
        if stripped in numbers:
            return names[numbers.index(stripped)]
        choices = ", ".join(f"{index} ({name})" for index, name in enumerate(names))
        raise self.refuse(what, f"must be one of {choices}: unsupported {key} value '{text}'")

    def value(self, what: str, kind: str, text: str, flags: tuple[str, str]) -> str:
        """``text`` as ORT takes a value of ``kind`` (``flags``: ORT's false and true)."""
        if kind == FLAG:
            flag = parse_flag(text)
            if flag is None:
                raise self.refuse(what, f"must be true or false, got '{text}'")
            return flags[flag]
        if kind in (INT, SIZE):
            low, high = INT_RANGE if kind == INT else SIZE_RANGE
            try:
                number = int(text.strip())
            except ValueError:
                number = low - 1
            if not low <= number <= high:
                wanted = "an integer" if kind == INT else "a number of bytes"
                raise self.refuse(what, f"must be {wanted} from {low} to {high}, got '{text}'")
            return str(number)
        if kind == NAME:
            if "/" in text or "\\" in text or text in (".", ".."):
                raise self.refuse(what, f"must be a file name, not a path, got '{text}'")
            return text
        if kind == PATH:
            return str(self.inside(what, text))
        if kind == PATHS:  # ORT's list separator
            return ";".join(str(self.inside(what, part.strip())) for part in text.split(";") if part.strip())
        return text

    def inside(self, what: str, text: str) -> Path:
        """``text`` resolved from the model's directory; refused when it leads out of it."""
        base = self.model_dir.resolve()
        try:
            path = (base / text).resolve()  # an absolute text replaces the base
        except (OSError, ValueError):
            path = None
        if path is None or not path.is_relative_to(base):
            raise self.refuse(
                what, f"must be a path inside the model's directory {base} (a relative path is taken from "
                f"there), got '{text}'"
            )
        return path

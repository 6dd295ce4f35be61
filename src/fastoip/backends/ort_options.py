"""ONNX Runtime session options a model's config asks for, read as Triton's onnxruntime backend reads them.

Rules:
- ``optimization { graph { level } }``: -1 basic, 1 extended, 2 disabled, anything else all
  optimisations (ORT's and Triton's default).
- ``parameters`` (string values): ``execution_mode`` 0 sequential / 1 parallel;
  ``enable_mem_arena`` and ``enable_mem_pattern`` booleans;
  ``session.use_device_allocator_for_initializers`` passed through as a session config
  entry.
- ``intra_op_thread_count`` / ``inter_op_thread_count`` (integers): a value > 0 sets ORT's thread
  count, 0 or less leaves ORT's default (one intra-op thread per physical core), as Triton; a config
  without them takes the server's ``--ort-threads`` (default 0, ORT's default).  A value above the
  machine's cores is capped to them, with a warning (issue 37: Triton takes any).  See
  :func:`thread_counts`.
- A value Triton would refuse is refused at load, naming the parameter.
- The execution providers (CUDA EP options, TensorRT, OpenVINO) are chosen in ``ort_providers.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument

log = logging.getLogger("fastoip.onnx")

#: Triton's graph levels -> ORT's GraphOptimizationLevel member names.
GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
#: Session config entries passed to ORT unchanged.
PASSED_THROUGH = ("session.use_device_allocator_for_initializers",)


def model_parameter(config: mc.ModelConfig, key: str) -> str | None:
    return config.parameters[key].string_value if key in config.parameters else None


def parse_flag(value: str) -> bool | None:
    """A config's boolean text (Triton's true/on/1 and false/off/0, any case, and yes/no); None for anything else."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "on", "yes"):
        return True
    if lowered in ("false", "0", "off", "no"):
        return False
    return None


def _bool(config: mc.ModelConfig, key: str) -> bool | None:
    value = model_parameter(config, key)
    if value is None:
        return None
    flag = parse_flag(value)
    if flag is None:
        raise InvalidArgument(f"model '{config.name}': parameter '{key}' must be true or false, got '{value}'")
    return flag


def _thread_count(config: mc.ModelConfig, key: str, server_default: int) -> int:
    value = model_parameter(config, key)
    if value is None:
        return max(server_default, 0)
    try:
        count = int(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{value}'"
        ) from None
    cores = os.cpu_count() or 1
    if count > cores:  # issue 37: each is a thread of each instance; more than the cores only costs (300 took +299)
        log.warning("model '%s': parameter '%s' %d capped to the machine's %d cores", config.name, key, count, cores)
        return cores
    return max(count, 0)


def thread_counts(config: mc.ModelConfig, intra_default: int, inter_default: int) -> tuple[int, int]:
    """(intra-op, inter-op) thread counts for ORT's ``SessionOptions``; 0 means ORT's default."""
    return (_thread_count(config, "intra_op_thread_count", intra_default),
            _thread_count(config, "inter_op_thread_count", inter_default))


def apply_session_options(config: mc.ModelConfig, options: Any, ort: Any) -> None:
    """Set on ORT ``SessionOptions`` what ``config`` asks for (after the backend's own defaults)."""
    if config.optimization.HasField("graph"):
        level = GRAPH_LEVELS.get(config.optimization.graph.level, "ORT_ENABLE_ALL")
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    mode = model_parameter(config, "execution_mode")
    if mode is not None:
        if mode.strip() not in ("0", "1"):
            raise InvalidArgument(
                f"model '{config.name}': the valid values of execution_mode are 0 or 1 but got {mode}"
            )
        parallel = mode.strip() == "1"
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    arena = _bool(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = _bool(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern
    for key in PASSED_THROUGH:
        value = model_parameter(config, key)
        if value is not None:
            options.add_session_config_entry(key, value)

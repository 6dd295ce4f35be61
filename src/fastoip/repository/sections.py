"""Config sections fastoip does not build: refused when they change results, logged when they are only hints.

Rules:
- A config must mean what it says.  Sections that change a model's results or
  its protocol and are not built yet (batch_input / batch_output for any
  backend but ONNX Runtime; decoupled transactions for any backend but Python models) are refused at load with
  the reason, which the repository index shows; the model is UNAVAILABLE
  instead of READY-and-failing.
- Hints that only tune speed and that fastoip cannot honour (rate
  limiter, execution accelerators outside ONNX models, optimisation settings
  ONNX Runtime has no knob for, such as ``optimization.cuda``, which Triton's
  onnxruntime backend does not read either) are logged as ignored once, at
  load.  An ONNX model's execution accelerators are honoured
  (``backends/ort_providers.py``); one this machine cannot run is logged there.
- MLServer ``model-settings.json`` fields fastoip ignores are logged the same way.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .._proto import model_config_pb2 as mc
from ..errors import Unsupported

log = logging.getLogger("fastoip.repository")

#: model-settings.json fields that describe MLServer's process model, not the model (``parallel_workers`` is
#: the instance count; ``parameters.uri`` is read by the runtime), and why they have no effect here.
IGNORED_MODEL_SETTINGS = {
    "warm_workers": "deprecated in MLServer 1.7, where inference workers are always warmed up at start; "
    "fastoip loads every instance before the model is ready",
}


#: Backend kinds whose models may be decoupled (answer a request with any number of responses).
DECOUPLED_BACKENDS = ("python",)

#: Backend kinds whose models may have batch inputs and batch outputs (Triton's ragged batching).
RAGGED_BACKENDS = ("onnxruntime",)


def refuse_unbuilt_sections(config: mc.ModelConfig, model_name: str, backend: str) -> None:
    """Unsupported naming the first section that would change results or the protocol (``backend``: the
    kind that serves the model, ``"ensemble"`` for an ensemble)."""
    reason = ""
    # an ensemble's own flag is set from its steps at load (as Triton's ensemble does), whatever it says
    if config.model_transaction_policy.decoupled and backend not in (*DECOUPLED_BACKENDS, "ensemble"):
        reason = (
            f"model_transaction_policy {{ decoupled: true }} (decoupled responses) is not implemented for {backend} "
            "models (Python models may be decoupled)"
        )
    elif (config.batch_input or config.batch_output) and backend not in RAGGED_BACKENDS:
        reason = f"batch_input / batch_output are not implemented for {backend} models (ONNX models may have them)"
    if reason:
        raise Unsupported(f"failed to load '{model_name}': {reason}; remove it from the config to serve the model")


def log_ignored_hints(config: mc.ModelConfig, model_name: str, onnx: bool) -> None:
    """Log each tuning hint of ``config`` that fastoip will not act on."""
    ignored = []
    if any(group.HasField("rate_limiter") for group in config.instance_group):
        ignored.append("instance_group.rate_limiter")
    optimization = config.optimization
    accelerators = optimization.execution_accelerators
    if (accelerators.gpu_execution_accelerator or accelerators.cpu_execution_accelerator) and not onnx:
        ignored.append("optimization.execution_accelerators")
    if optimization.HasField("graph") and not onnx:
        ignored.append("optimization.graph")
    for name in ("cuda", "output_pinned_memory"):
        if optimization.HasField(name):
            ignored.append(f"optimization.{name}")
    for name in ("eager_batching", "gather_kernel_buffer_threshold"):
        if getattr(optimization, name):
            ignored.append(f"optimization.{name}")
    if optimization.priority:
        ignored.append("optimization.priority")
    for name in ignored:
        log.warning("model '%s': config %s is not supported by fastoip and is ignored", model_name, name)


def log_ignored_model_settings(path: Path, model_name: str) -> None:
    """Log MLServer model-settings.json fields fastoip does not use (the file itself is read elsewhere)."""
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the settings reader reports the error
    if not isinstance(settings, dict):
        return
    for key, why in IGNORED_MODEL_SETTINGS.items():
        if key in settings:
            log.info("model '%s': %s field '%s' is accepted and has no effect (%s)", model_name, path.name, key, why)

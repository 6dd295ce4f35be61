"""The defaults Triton's core fills into every loaded model's config (its ``NormalizeModelConfig``), so the
config API answers what Triton's does.

Rules:
- Only fields a config left unset are filled; what a config says is kept.
- ``version_policy``: ``latest { num_versions: 1 }``.
- ``default_model_filename``: the backend's file name (``model.onnx``, ``model.py``); not for ensembles.
- ``optimization { input_pinned_memory, output_pinned_memory }``: enabled; not for ensembles.
- Instance groups without a name are named ``<model>_<index>`` (a group auto-complete added keeps the
  model's name, as Triton's does).
- ``dynamic_batching { preferred_batch_size: [max_batch_size] }`` when a batching model's dynamic batcher names
  no preferred size (:func:`fill_batching_defaults`, once the batcher is decided; the batcher reads it so anyway).
- Not filled, on purpose (COMPATIBILITY.md): Triton's default of two CPU instances for onnxruntime models and
  ``max_sequence_idle_microseconds``.
"""

from __future__ import annotations

from .._proto import model_config_pb2 as mc


def fill_defaults(config: mc.ModelConfig, default_filename: str = "") -> None:
    """Fill Triton's defaults into ``config`` in place (``default_filename``: the backend's model file name)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
        return
    if not config.default_model_filename and default_filename:
        config.default_model_filename = default_filename
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"


def fill_batching_defaults(config: mc.ModelConfig) -> None:
    """Triton's ``preferred_batch_size: [max_batch_size]`` for a dynamic batcher that names none."""
    batching = config.dynamic_batching
    if config.HasField("dynamic_batching") and not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)

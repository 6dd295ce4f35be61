"""Model configuration: Triton's ``config.pbtxt`` as data.

Rules:
- The configuration of a model is a ``ModelConfig`` protobuf message
  (``proto/model_config.proto``, Triton's field names and numbers), read from
  ``config.pbtxt`` in protobuf text format when present.
- Whatever the file leaves out is completed from the model itself (inputs,
  outputs, datatypes, dims, max_batch_size), as Triton's auto-complete does:
  when every input and output has a dynamic first dimension the model can
  batch, and ``max_batch_size`` gets the server default.
- With ``max_batch_size > 0`` the config's ``dims`` exclude the batch
  dimension; metadata shapes add a leading ``-1``.
- :class:`TensorSpec` / :class:`ModelSpec` are the precomputed views the infer
  path validates against (no protobuf access per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from google.protobuf import json_format, text_format

from .._proto import model_config_pb2 as mc
from ..datatypes import CONFIG_TO_V2, V2_TO_CONFIG
from ..errors import InvalidArgument

ONNX_PLATFORM = "onnxruntime_onnx"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the infer path checks it."""

    name: str
    datatype: str
    #: Full shape including the batch dim (-1) when the model batches; -1 = any size.
    shape: tuple[int, ...]
    optional: bool = False

    def accepts(self, shape: tuple) -> bool:
        """True when ``shape`` fits this spec (-1 matches any size)."""
        expected = self.shape
        if len(shape) != len(expected):
            return False
        for got, want in zip(shape, expected):
            if want != -1 and got != want:
                return False
        return True


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a config the infer path needs, precomputed."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_by_name: dict[str, TensorSpec] = field(default_factory=dict)
    output_by_name: dict[str, TensorSpec] = field(default_factory=dict)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0


@dataclass(frozen=True)
class DiscoveredTensor:
    """A tensor as the backend reports it from the model file."""

    name: str
    datatype: str
    #: None for a dimension without a fixed size.
    shape: tuple[Optional[int], ...]


def read_config_file(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt; InvalidArgument with the parser's message on error."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{path}: {exc}") from None
    return config


def complete_config(
    config: mc.ModelConfig,
    model_name: str,
    inputs: Sequence[DiscoveredTensor],
    outputs: Sequence[DiscoveredTensor],
    default_max_batch_size: int,
    platform: str = ONNX_PLATFORM,
    on_gpu: bool = False,
) -> mc.ModelConfig:
    """Fill what ``config`` leaves out from the model's own tensors, and check what it says.

    ``on_gpu``: the instances run on GPU 0, so the instance groups say KIND_GPU as Triton's do.
    Returns a new message; ``config`` is not modified.
    """
    done = mc.ModelConfig()
    done.CopyFrom(config)
    if done.name and done.name != model_name:
        raise InvalidArgument(
            f"model '{model_name}': config.pbtxt name '{done.name}' does not match the directory name"
        )
    done.name = model_name
    if not done.platform and not done.backend:
        done.platform = platform
    if done.platform == ONNX_PLATFORM and not done.backend:
        done.backend = "onnxruntime"

    all_tensors = list(inputs) + list(outputs)
    can_batch = bool(all_tensors) and all(t.shape and t.shape[0] is None for t in all_tensors)
    if config.max_batch_size == 0 and not config.input and not config.output and can_batch:
        # Nothing said about batching and the model can batch: Triton's auto-complete.
        done.max_batch_size = default_max_batch_size
    if done.max_batch_size < 0:
        raise InvalidArgument(f"model '{model_name}': max_batch_size must be >= 0, got {done.max_batch_size}")
    batch_dims = 1 if done.max_batch_size > 0 else 0

    _complete_tensors(done.input, inputs, batch_dims, model_name, "input")
    _complete_tensors(done.output, outputs, batch_dims, model_name, "output")

    if not done.instance_group:
        group = done.instance_group.add()
        group.count = 1
        group.kind = mc.ModelInstanceGroup.KIND_AUTO
    for group in done.instance_group:
        if group.count <= 0:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.append(0)
        if not group.name:
            group.name = model_name
    if done.HasField("dynamic_batching") and done.max_batch_size == 0:
        raise InvalidArgument(
            f"model '{model_name}': dynamic_batching needs max_batch_size > 0"
        )
    return done


def _complete_tensors(
    configured: "mc.RepeatedCompositeFieldContainer",  # type: ignore[name-defined]
    discovered: Sequence[DiscoveredTensor],
    batch_dims: int,
    model_name: str,
    kind: str,
) -> None:
    found = {t.name: t for t in discovered}
    if not configured:
        for tensor in discovered:
            entry = configured.add()
            entry.name = tensor.name
            entry.data_type = mc.DataType.Value(V2_TO_CONFIG[tensor.datatype])
            entry.dims.extend(-1 if d is None else int(d) for d in tensor.shape[batch_dims:])
        return
    for entry in configured:
        model_tensor = found.get(entry.name)
        if model_tensor is None:
            raise InvalidArgument(
                f"model '{model_name}': config {kind} '{entry.name}' is not in the model "
                f"(model {kind}s: {', '.join(sorted(found)) or 'none'})"
            )
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = mc.DataType.Value(V2_TO_CONFIG[model_tensor.datatype])
        configured_type = CONFIG_TO_V2.get(mc.DataType.Name(entry.data_type))
        if configured_type != model_tensor.datatype:
            raise InvalidArgument(
                f"model '{model_name}': {kind} '{entry.name}' is {model_tensor.datatype} in the model "
                f"but {mc.DataType.Name(entry.data_type)} in config.pbtxt"
            )
        if not entry.dims and not entry.HasField("reshape"):
            entry.dims.extend(-1 if d is None else int(d) for d in model_tensor.shape[batch_dims:])


def model_spec(config: mc.ModelConfig) -> ModelSpec:
    """The infer path's view of a completed config."""
    batch = (-1,) if config.max_batch_size > 0 else ()

    def specs(entries) -> tuple[TensorSpec, ...]:  # type: ignore[no-untyped-def]
        return tuple(
            TensorSpec(
                name=e.name,
                datatype=CONFIG_TO_V2[mc.DataType.Name(e.data_type)],
                shape=batch + tuple(int(d) for d in e.dims),
                optional=bool(getattr(e, "optional", False)),
            )
            for e in entries
        )

    inputs, outputs = specs(config.input), specs(config.output)
    return ModelSpec(
        name=config.name,
        max_batch_size=config.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        input_by_name={t.name: t for t in inputs},
        output_by_name={t.name: t for t in outputs},
    )


def parameter(config: mc.ModelConfig, key: str, default: str = "") -> str:
    """A ``parameters { key: ... value { string_value: ... } }`` entry of the config."""
    if key in config.parameters:
        return config.parameters[key].string_value
    return default


def config_from_json(model: str, text: object) -> mc.ModelConfig:
    """A ModelConfig from the JSON of a load request's ``config`` parameter (Triton's override)."""
    if type(text) is not str:
        raise InvalidArgument(f"load '{model}': the 'config' parameter must be a string holding JSON")
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"load '{model}': failed to parse the 'config' parameter: {exc}") from None
    return config

"""Triton's checks of an ensemble's own config, run before its steps or version folders are looked at.

Rules:
- ``platform: "ensemble"`` and ``ensemble_scheduling`` go together; an ensemble
  has no backend, no instance groups, no optimization and no warmup.
- Every step names a model, maps at least one input and one output; an
  ensemble tensor is written by one step at most; a step's input is mapped once.
- The data flow is checked on the config alone: every ensemble input feeds a
  step, every ensemble output is written from the inputs, and every other
  tensor is both reachable and read.
- The words are Triton's (its core's ``ValidateEnsembleSchedulingConfig``), as
  Triton's ``qa/L0_model_config`` reads them in the log.  Checks that need the
  steps' configs (shapes, types, batch sizes) stay in :mod:`.ensemble`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument

ENSEMBLE_PLATFORM = "ensemble"


@dataclass
class _Tensor:
    name: str
    written: bool = False
    ready: bool = False
    sources: list[_Tensor] = field(default_factory=list)
    readers: list[_Tensor] = field(default_factory=list)


def validate_ensemble_config(config: mc.ModelConfig, name: str) -> None:
    """Refuse an ensemble config (or an ensemble section on another platform) as Triton does.

    The messages name the model as its config does, as Triton's do (the folder's name when the config has none).
    """
    name = config.name or name
    if config.platform == ENSEMBLE_PLATFORM and config.backend:
        raise InvalidArgument(
            f"Ensemble model '{name}' must have platform type '{ENSEMBLE_PLATFORM}' and empty backend type"
        )
    if not config.HasField("ensemble_scheduling"):
        if config.platform == ENSEMBLE_PLATFORM:
            raise InvalidArgument(
                f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}"
            )
        return
    if config.platform != ENSEMBLE_PLATFORM:
        raise InvalidArgument(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}"
        )
    if len(config.instance_group):
        raise InvalidArgument(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise InvalidArgument(f"optimization should not be specified for ensemble '{name}'")
    if len(config.model_warmup):
        raise InvalidArgument(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise InvalidArgument(f"must specify 'step' for ensemble '{name}'")
    tensors = _graph(config.ensemble_scheduling, name)
    _check_flow(config, name, tensors)


def _graph(scheduling: mc.ModelEnsembling, name: str) -> dict[str, _Tensor]:
    """The ensemble tensors, each linked to the tensors its step reads (sources) and feeds (readers)."""
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(scheduling.step):
        for what, entries in (("model_name", step.model_name), ("input_map", step.input_map),
                              ("output_map", step.output_map)):
            if not entries:
                raise InvalidArgument(f"must specify '{what}' in step {index} of ensemble '{name}'")
        outputs: list[_Tensor] = []
        for tensor_name in step.output_map.values():
            tensor = tensors.setdefault(tensor_name, _Tensor(tensor_name))
            if tensor.written:
                raise InvalidArgument(
                    f"ensemble tensor '{tensor_name}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            tensor.written = True
            outputs.append(tensor)
        # a protobuf map has each key once: a model input mapped twice is already refused by the parser
        for tensor_name in step.input_map.values():
            source = tensors.setdefault(tensor_name, _Tensor(tensor_name))
            for output in outputs:
                output.sources.append(source)
                source.readers.append(output)
    return tensors


def _check_flow(config: mc.ModelConfig, name: str, tensors: dict[str, _Tensor]) -> None:
    queue: list[_Tensor] = []
    for model_input in config.input:
        tensor = tensors.get(model_input.name)
        if tensor is None:
            raise InvalidArgument(f"ensemble input '{model_input.name}' for ensemble {name}' is not used")
        tensor.ready = True
        queue.append(tensor)
    while queue:
        tensor = queue.pop(0)
        for reader in tensor.readers:
            if not reader.ready and all(source.ready for source in reader.sources):
                reader.ready = True
                queue.append(reader)
    outputs: set[str] = set()
    for model_output in config.output:
        tensor = tensors.get(model_output.name)
        if tensor is None:
            raise InvalidArgument(f"ensemble output '{model_output.name}' for ensemble {name}' is not used")
        if not tensor.ready:
            raise InvalidArgument(_not_written(tensor, model_output.name, name))
        outputs.add(model_output.name)
    for tensor in tensors.values():
        if tensor.name not in outputs and (not tensor.ready or not tensor.readers):
            raise InvalidArgument(f"ensemble tensor '{tensor.name}' is unused in ensemble '{name}'")


def _not_written(tensor: _Tensor, output: str, name: str) -> str:
    """Triton's message for an output no path from the inputs writes, naming the first tensor that breaks it."""
    message = f"output '{output}' for ensemble '{name}' is not written"
    seen: set[str] = set()
    last = tensor
    sources = tensor.sources
    while sources:
        following: list[_Tensor] = []
        for source in sources:
            if not source.ready and source.name not in seen:
                seen.add(source.name)
                last = source
                following = source.sources
                break
        sources = following
    if last is not tensor:
        message += f": at least one of its depending tensors, '{last.name}', is not connected"
    return message

"""Ensembles (``platform: "ensemble"``): the step graph, checked at load.

Rules (Triton's ``architecture.md`` "Ensemble Models" and the core's ensemble
scheduler, in fastoip's words):
- ``input_map`` maps a step's model input to an ensemble tensor, ``output_map``
  a step's model output to an ensemble tensor.  Ensemble tensors are the
  ensemble's inputs, its outputs and the intermediates between steps.
- Every tensor a step reads is an ensemble input or is produced by exactly one
  step; every ensemble output is produced by some step; the graph has no cycle;
  every step input of the composing model is mapped; datatypes agree wherever
  a tensor meets a model, and shapes agree where both are fixed.
- A failure names the ensemble, the step and the tensor: it is the load's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from .._proto import model_config_pb2 as mc
from ..datatypes import CONFIG_TO_V2
from ..errors import InferenceError, InvalidArgument
from ..metrics import MetricsConfig
from ..scheduling.ensemble import EnsembleScheduler
from .loaded import LoadedModel
from .runner import RequestRunner


@dataclass(frozen=True)
class TensorShape:
    """What a model declares for one tensor: V2 datatype and dims (batch dim excluded)."""

    datatype: str
    dims: tuple[int, ...]
    #: Whether the declaring model batches (its full shape has a leading variable batch dimension).
    batching: bool = False
    #: The model that declares it (named in errors).
    model: str = ""

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims


@dataclass(frozen=True)
class ComposingModel:
    """What the plan needs to know of a composing model to check the wiring."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorShape]
    outputs: dict[str, TensorShape]
    #: Decoupled models answer with any number of responses: each runs the steps after it once.
    decoupled: bool = False


@dataclass(frozen=True)
class EnsembleStep:
    """One step: which model runs, which ensemble tensors feed it, which it produces."""

    index: int
    model_name: str
    model_version: str  # "" = the latest ready version
    inputs: dict[str, str]  # model input -> ensemble tensor
    outputs: dict[str, str]  # model output -> ensemble tensor
    needs: frozenset[str]  # ensemble tensors this step waits for
    #: The composing model is decoupled: each of its responses runs the steps after it once.
    decoupled: bool = False
    #: The composing model batches (its inputs' first dimension is the batch).
    batching: bool = False
    #: Model input -> its config dims (batch dimension excluded).
    input_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class EnsemblePlan:
    """The checked graph: steps in an order where every step comes after what it needs."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]

    #: A step is decoupled, so the ensemble is (Triton's ensemble writes it into its config).
    decoupled: bool = False
    #: The ensemble batches (``max_batch_size`` > 0).
    batching: bool = False
    #: Ensemble output -> its config dims (batch dimension excluded).
    output_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def composing_models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.model_name for step in self.steps))


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == "ensemble" or config.HasField("ensemble_scheduling")


def _shape(tensor: mc.ModelInput | mc.ModelOutput, batching: bool = False, model: str = "") -> TensorShape:
    # the client-facing dims: a composing model's reshape is its own business
    return TensorShape(
        CONFIG_TO_V2.get(mc.DataType.Name(tensor.data_type), ""), tuple(tensor.dims), batching, model
    )


def composing_model_of(config: mc.ModelConfig) -> ComposingModel:
    """The wiring-relevant part of a loaded model's (completed) config."""
    batching = config.max_batch_size > 0
    return ComposingModel(
        config.name,
        config.max_batch_size,
        {t.name: _shape(t, batching, config.name) for t in config.input},
        {t.name: _shape(t, batching, config.name) for t in config.output},
        bool(config.model_transaction_policy.decoupled),
    )


def plan_ensemble(config: mc.ModelConfig, lookup: Callable[[str], ComposingModel | None]) -> EnsemblePlan:
    """Check ``config``'s ``ensemble_scheduling`` against the composing models and order its steps.

    ``lookup(name)`` gives a composing model's wiring, or None when it is not loaded.
    """
    name = config.name
    if config.platform != "ensemble":
        raise InvalidArgument(f"ensemble '{name}': ensemble_scheduling needs platform \"ensemble\"")
    steps_config = list(config.ensemble_scheduling.step)
    if not steps_config:
        raise InvalidArgument(f"ensemble '{name}' must have at least one step")
    batching = config.max_batch_size > 0
    declared_inputs = {t.name: _shape(t, batching, name) for t in config.input}
    declared_outputs = {t.name: _shape(t, batching, name) for t in config.output}
    producer: dict[str, int] = {}
    known: dict[str, TensorShape] = dict(declared_inputs)
    steps: list[EnsembleStep] = []
    for index, configured in enumerate(steps_config):
        where = f"ensemble '{name}' step {index} ('{configured.model_name}')"
        model = lookup(configured.model_name)
        if model is None:
            raise InvalidArgument(f"{where}: model '{configured.model_name}' is not available")
        # Triton: a batching ensemble may hold a non-batching model (its full shapes must then agree),
        # but not one that batches less than the ensemble does.
        if 0 < model.max_batch_size < config.max_batch_size:
            raise InvalidArgument(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                f"{configured.model_name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        # Triton's words (its core's ensemble checks), fastoip's place after them
        for model_input, tensor in configured.input_map.items():
            if model_input not in model.inputs:
                raise InvalidArgument(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} in "
                    f"model {configured.model_name} ({where})"
                )
        missing = sorted(set(model.inputs) - set(configured.input_map))
        if missing:
            raise InvalidArgument(
                f"in ensemble {name}, input {missing[0]} in model {configured.model_name} is not mapped to any "
                f"ensemble tensors ({where}: model input(s) {missing} are not mapped in input_map)"
            )
        for model_output, tensor in configured.output_map.items():
            if model_output not in model.outputs:
                raise InvalidArgument(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output {model_output} "
                    f"in model {configured.model_name} ({where})"
                )
            if tensor in producer:
                raise InvalidArgument(
                    f"{where}: ensemble tensor '{tensor}' is already produced by step {producer[tensor]}"
                )
            if tensor in declared_inputs:
                raise InvalidArgument(
                    f"{where}: ensemble tensor '{tensor}' is an ensemble input; a step cannot write it"
                )
            producer[tensor] = index
            _agree(name, where, tensor, known, model.outputs[model_output])
        version = "" if configured.model_version < 0 else str(configured.model_version)
        steps.append(
            EnsembleStep(index, configured.model_name, version, dict(configured.input_map),
                         dict(configured.output_map), frozenset(configured.input_map.values()), model.decoupled,
                         model.max_batch_size > 0, {key: shape.dims for key, shape in model.inputs.items()})
        )
    for step in steps:
        where = f"ensemble '{name}' step {step.index} ('{step.model_name}')"
        model = lookup(step.model_name)
        assert model is not None
        for model_input, tensor in step.inputs.items():
            if tensor not in declared_inputs and tensor not in producer:
                raise InvalidArgument(f"{where}: ensemble tensor '{tensor}' is never produced")
            _agree(name, where, tensor, known, model.inputs[model_input])
    for output in declared_outputs:
        if output not in producer:
            raise InvalidArgument(f"ensemble '{name}': output '{output}' is not produced by any step")
        _agree(name, f"ensemble '{name}'", output, known, declared_outputs[output])
    ordered = _ordered(name, steps, producer)
    decoupled = _check_decoupled_flow(name, ordered, declared_inputs)
    return EnsemblePlan(name, tuple(declared_inputs), tuple(declared_outputs), ordered, decoupled, batching,
                        {key: shape.dims for key, shape in declared_outputs.items()})


def _check_decoupled_flow(name: str, ordered: tuple[EnsembleStep, ...], inputs: dict[str, TensorShape]) -> bool:
    """Triton's decoupled data flow: every tensor carries the label of the decoupled step it descends from (0:
    none); a step's inputs must share one label (a decoupled step's responses cannot meet another lineage's
    tensors); a decoupled step's outputs start a new label.  True when a step is decoupled."""
    label: dict[str, int] = dict.fromkeys(inputs, 0)
    labels = 0
    for step in ordered:  # every step after the steps whose tensors it reads
        seen = {label[tensor] for tensor in step.needs if tensor in label}
        if len(seen) > 1:
            raise InvalidArgument(  # Triton's words
                f"in ensemble {name}, step of model '{step.model_name}' receives inputs originated from different "
                "decoupled models"
            )
        mine = seen.pop() if seen else 0
        if step.decoupled:
            labels += 1
            mine = labels
        for tensor in step.outputs.values():
            label[tensor] = mine
    return labels > 0


def _agree(name: str, where: str, tensor: str, known: dict[str, TensorShape], seen: TensorShape) -> None:
    """Triton's tensor consistency: datatypes match; dims match (a -1 matches anything), or, where a batching
    and a non-batching model meet, their full shapes (batch dimension included) do."""
    previous = known.get(tensor)
    if previous is None:
        known[tensor] = seen
        return
    if previous.datatype != seen.datatype:
        raise InvalidArgument(  # Triton's words, then fastoip's
            f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type: TYPE_{previous.datatype} is "
            f"inferred from model {previous.model} while TYPE_{seen.datatype} is inferred from model {seen.model} "
            f"({where}: ensemble tensor '{tensor}' is {previous.datatype} in one place and {seen.datatype} in another)"
        )
    if not _dims_match(previous.dims, seen.dims) and not _dims_match(previous.full_dims, seen.full_dims):
        raise InvalidArgument(  # Triton's words, then fastoip's place
            f"in ensemble {name}, ensemble tensor {tensor}: inconsistent shape: {_dims_text(previous.full_dims)} is "
            f"inferred from model {previous.model} while {_dims_text(seen.full_dims)} is inferred from model "
            f"{seen.model} ({where})"
        )


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(dim) for dim in dims) + "]"


def _ordered(name: str, steps: list[EnsembleStep], producer: dict[str, int]) -> tuple[EnsembleStep, ...]:
    """Steps in dependency order; a cycle is a load error."""
    order: list[EnsembleStep] = []
    state: dict[int, int] = {}  # 1 = visiting, 2 = done

    def visit(step: EnsembleStep) -> None:
        mark = state.get(step.index)
        if mark == 2:
            return
        if mark == 1:
            raise InvalidArgument(f"ensemble '{name}': the steps form a cycle through step {step.index}")
        state[step.index] = 1
        for tensor in step.needs:
            if tensor in producer:
                visit(steps[producer[tensor]])
        state[step.index] = 2
        order.append(step)

    for step in steps:
        visit(step)
    return tuple(order)


class _EnsembleKind:
    """The backend kind of ``platform: "ensemble"``: nothing to load but the plan (see the repository)."""

    name = "ensemble"
    platforms = ("ensemble",)
    default_filename = ""

    def load(self, model_name: str, version: int, path: Path, base: mc.ModelConfig, options: object) -> tuple:
        raise InvalidArgument(f"ensemble '{model_name}' is loaded by the repository, not by a backend")


ENSEMBLE_KIND = _EnsembleKind()


class EnsembleModel(LoadedModel):
    """An ensemble version: no instances of its own; its scheduler runs the steps in their models."""

    def __init__(
        self,
        name: str,
        version: int,
        path: Path,
        config: mc.ModelConfig,
        executor: Executor,
        plan: EnsemblePlan,
        runner: RequestRunner,
        metrics_config: MetricsConfig | None = None,
    ) -> None:
        self.plan = plan
        self._resolve = runner.look_up
        super().__init__(
            name, version, path, config, [], executor,
            lambda context, instances, executor: EnsembleScheduler(
                plan, runner, config.ensemble_scheduling.max_inflight_requests, decoupled=plan.decoupled
            ),
            model_dir=path.parent,  # ``path`` is the version directory: an ensemble has no model file
            metrics_config=metrics_config,
        )

    def is_ready(self) -> bool:
        """Ready while every composing model is (Triton: an ensemble follows its models)."""
        for name in self.plan.composing_models:
            try:
                if not self._resolve(name, "").is_ready():
                    return False
            except InferenceError:
                return False
        return True

    def readiness_waits(self) -> bool:
        for name in self.plan.composing_models:
            try:
                if self._resolve(name, "").readiness_waits():
                    return True
            except InferenceError:
                pass
        return False

"""Triton's config validation, run on a config as written, before any model file is looked for.

Rules:
- The checks and their words are Triton's (``ValidateModelConfig``,
  ``ValidateModelIOConfig``, ``ValidateBatchIO`` and the sequence-control
  checks of its core): a model whose config Triton refuses fails here with the
  message Triton logs, whether or not its model file exists.
- Only what a config states is checked: tensors that auto-complete will add
  later are checked when the completed config is (``check_reshape`` and the
  backend's own checks).
- Where fastoip deliberately accepts more (scalar tensors with empty ``dims``,
  GPU instance groups on a host without a GPU), the check is left out and
  COMPATIBILITY.md says so.
- Errors are :class:`InvalidArgument`; the model's load reports them.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._proto import model_config_pb2 as mc
from ..errors import InvalidArgument
from .ensemble_config import validate_ensemble_config

WILDCARD = -1
_SEQUENCE = mc.ModelSequenceBatching
_CONTROL = mc.ModelSequenceBatching.Control
_BOOLEAN_CONTROLS = (_CONTROL.CONTROL_SEQUENCE_START, _CONTROL.CONTROL_SEQUENCE_END, _CONTROL.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
_SOURCE_ONE_KINDS = (
    mc.BatchInput.BATCH_ELEMENT_COUNT,
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT,
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO,
    mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE,
    mc.BatchInput.BATCH_ITEM_SHAPE,
    mc.BatchInput.BATCH_ITEM_SHAPE_FLATTEN,
)


def validate_config(config: mc.ModelConfig, name: str, auto_complete: bool = True) -> None:
    """Refuse ``config`` as Triton refuses it at load (InvalidArgument with Triton's words).

    With ``auto_complete`` a tensor may leave out its ``data_type`` (the model fills it in).
    """
    if config.max_batch_size < 0:
        raise InvalidArgument(f"'max_batch_size' must be non-negative value for {name}")
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config.dynamic_batching, config.max_batch_size, name)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(config, name)
    validate_ensemble_config(config, name)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise InvalidArgument(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )
    if config.HasField("model_metrics"):
        _check_model_metrics(config.model_metrics)
    for group_index, group in enumerate(config.instance_group):
        _check_instance_group(group, group_index, name)
    for model_input in config.input:
        _check_io(model_input, config.max_batch_size, "model input", name, auto_complete)
    for model_output in config.output:
        _check_io(model_output, config.max_batch_size, "model output", name, auto_complete)
    _check_batch_io(config, name)


def _check_dynamic_batching(batching: mc.ModelDynamicBatching, max_batch_size: int, name: str) -> None:
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise InvalidArgument(f"dynamic batching preferred size must be positive for {name}")
        if size > max_batch_size:
            raise InvalidArgument(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise InvalidArgument(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise InvalidArgument(
                    f"priority queue policy must have priority level in range [1, {levels}] for {name}"
                )
    if batching.preserve_ordering:
        if levels > 1:
            raise InvalidArgument(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == mc.ModelQueuePolicy.DELAY for p in policies):
            raise InvalidArgument(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )


def _check_sequence_batching(config: mc.ModelConfig, name: str) -> None:
    batcher = config.sequence_batching
    if config.response_cache.enable:
        raise InvalidArgument(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    for kind in _BOOLEAN_CONTROLS:
        _check_boolean_control(batcher, kind, name)
    corrid = _controls_of(batcher, _CONTROL.CONTROL_SEQUENCE_CORRID, name)
    if corrid and corrid[0].data_type not in _CORRID_TYPES:
        raise InvalidArgument(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if batcher.HasField("oldest"):
        for size in batcher.oldest.preferred_batch_size:
            if size <= 0:
                raise InvalidArgument(f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise InvalidArgument(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if batcher.HasField("direct") and not 0.0 <= batcher.direct.minimum_slot_utilization <= 1.0:
        raise InvalidArgument(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")


def _controls_of(batcher: mc.ModelSequenceBatching, kind: int, name: str) -> list[_CONTROL]:
    """The controls of ``kind`` (at most one), after Triton's checks on the control tensors' names."""
    seen_tensors: set[str] = set()
    found: list[_CONTROL] = []
    kind_name = _CONTROL.Kind.Name(kind)
    for control_input in batcher.control_input:
        if not control_input.name:
            raise InvalidArgument(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise InvalidArgument(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple control kinds "
                f"for {name}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind == kind:
                if found:
                    raise InvalidArgument(f"sequence batching specifies multiple {kind_name} tensors for {name}")
                found.append(control)
    return found


def _check_boolean_control(batcher: mc.ModelSequenceBatching, kind: int, name: str) -> None:
    kind_name = _CONTROL.Kind.Name(kind)
    for control in _controls_of(batcher, kind, name):
        given = [field for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
                 if len(getattr(control, field))]
        if not given:
            raise InvalidArgument(
                "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
                f"for {kind_name} for {name}"
            )
        if len(given) > 1:
            raise InvalidArgument(
                "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                f"'bool_false_true' for {kind_name} for {name}"
            )
        if len(getattr(control, given[0])) != 2:
            raise InvalidArgument(
                f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind_name} for {name}"
            )


def _check_model_metrics(metrics: mc.ModelMetrics) -> None:
    for control in metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise InvalidArgument("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise InvalidArgument("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise InvalidArgument("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise InvalidArgument("histogram options must specify non-empty 'buckets'")


def _check_instance_group(group: mc.ModelInstanceGroup, index: int, name: str) -> None:
    group_name = group.name or f"{name}_{index}"
    if group.kind == mc.ModelInstanceGroup.KIND_CPU and len(group.gpus):
        raise InvalidArgument(
            f"instance group {group_name} of model {name} has kind KIND_CPU but specifies one or more GPUs"
        )
    if group.kind == mc.ModelInstanceGroup.KIND_MODEL and len(group.gpus):
        raise InvalidArgument(
            f"instance group {group_name} of model {name} has kind KIND_MODEL but specifies one or more GPUs"
        )
    for gpu in group.gpus:
        if gpu < 0:
            raise InvalidArgument(
                f"instance group {group_name} of model {name} specifies invalid or unsupported gpu id {gpu}. "
                "GPUs with at least the minimum required CUDA compute compatibility are: (none below 0)"
            )


def _check_io(
    entry: mc.ModelInput | mc.ModelOutput, max_batch_size: int, what: str, name: str, auto_complete: bool
) -> None:
    if not entry.name:
        raise InvalidArgument(f"{what} must specify 'name' for {name}")
    where = f"{what} '{entry.name}' "
    if entry.data_type == mc.TYPE_INVALID and not auto_complete:
        raise InvalidArgument(f"{where}must specify 'data_type' for {name}")
    if entry.HasField("reshape") and not entry.reshape.shape and max_batch_size == 0:
        raise InvalidArgument(
            f"{where}cannot have empty reshape for non-batching model as scalar tensors are not supported for {name}"
        )
    if any(dim < 1 and dim != WILDCARD for dim in entry.dims):
        raise InvalidArgument(
            f"{where}dimension must be integer >= 1, or -1 to indicate a variable-size dimension for {name}"
        )
    if not entry.HasField("reshape"):
        return
    reshape = list(entry.reshape.shape)
    if any(dim < 1 and dim != WILDCARD for dim in reshape):
        raise InvalidArgument(
            f"{where}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for {name}"
        )
    dims_count, reshape_count = _element_count(entry.dims), _element_count(reshape)
    if dims_count != reshape_count and (reshape_count != 0 or dims_count != 1):
        raise InvalidArgument(f"{where}has different size for dims and reshape for {name}")
    if dims_count == WILDCARD:
        dims_trunks, reshape_trunks = _trunks(entry.dims), _trunks(reshape)
        if len(dims_trunks) != len(reshape_trunks):
            raise InvalidArgument(
                f"{where}has different number of variable-size dimensions for dims and reshape for {name}"
            )
        if dims_trunks != reshape_trunks:
            raise InvalidArgument(f"{where}has different size for dims and reshape for {name}")


def _element_count(dims: Iterable[int]) -> int:
    """Triton's GetElementCount: -1 when a dimension is variable, 0 for no dimensions."""
    dims = list(dims)
    if not dims:
        return 0
    count = 1
    for dim in dims:
        if dim == WILDCARD:
            return WILDCARD
        count *= dim
    return count


def _trunks(dims: Iterable[int]) -> list[int]:
    """Element counts of the runs between variable-size dimensions."""
    trunks, current = [], 1
    for dim in dims:
        if dim == WILDCARD:
            trunks.append(current)
            current = 1
        else:
            current *= dim
    trunks.append(current)
    return trunks


def _check_batch_io(config: mc.ModelConfig, name: str) -> None:
    inputs = {entry.name for entry in config.input}
    outputs = {entry.name for entry in config.output}
    for batch_input in config.batch_input:
        kind = mc.BatchInput.Kind.Name(batch_input.kind)
        if batch_input.kind not in _SOURCE_ONE_KINDS:
            raise InvalidArgument(f"unknown batch input kind '{kind}' for {name}")
        if len(batch_input.source_input) != 1:
            raise InvalidArgument(
                f"batch input kind '{kind}' expects 1 source input, got {len(batch_input.source_input)} for {name}"
            )
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise InvalidArgument(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {name}")
        for source in batch_input.source_input:
            if source not in inputs:
                raise InvalidArgument(f"unknown source input name '{source}' for {name}")
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise InvalidArgument(
                f"batch output kind '{kind}' expects 1 source input, got {len(batch_output.source_input)} for {name}"
            )
        for source in batch_output.source_input:
            if source not in inputs:
                raise InvalidArgument(f"unknown source input name '{source}' for {name}")
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise InvalidArgument(f"unknown target output name '{target}' for {name}")
            if target in targets:
                raise InvalidArgument(f"target output name '{target}' can only be specified once for {name}")
            targets.add(target)

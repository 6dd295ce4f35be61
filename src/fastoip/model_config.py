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
- This is the one home of every form a config takes: ``config.pbtxt``
  (:func:`read_config_file`), JSON both ways (:func:`config_from_json` for a
  load request's override, :func:`config_to_json` for Triton's HTTP answer),
  and MLServer's ``model-settings.json`` (:func:`read_model_settings`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from google.protobuf import descriptor as pb_descriptor
from google.protobuf import json_format, text_format

from ._proto import model_config_pb2 as mc
from .classification import read_labels
from .content_types import input_key, output_key
from .datatypes import CONFIG_TO_V2, V2_TO_CONFIG
from .errors import InvalidArgument
from .model_settings import MODEL_SETTINGS, parse_model_settings

log = logging.getLogger("fastoip.repository")

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

ONNX_PLATFORM = "onnxruntime_onnx"
#: The config parameter holding a model-settings.json document (JSON) for the model built from it.
MODEL_SETTINGS_PARAMETER = "model_settings"
#: How many fitting shapes each TensorSpec remembers (see TensorSpec.accepted).
ACCEPTED_SHAPES_KEPT = 64


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the infer path checks it."""

    name: str
    datatype: str
    #: Full shape including the batch dim (-1) when the model batches; -1 = any size.
    shape: tuple[int, ...]
    optional: bool = False
    #: The model's own shape (without the batch dim) when the config has ``reshape``, else None.
    reshape: tuple[int, ...] | None = None

    #: Shapes (tuples) already found to fit, so a repeated shape costs one dict lookup on the infer path;
    #: bounded (ACCEPTED_SHAPES_KEPT): arbitrary variable dims must not grow it without end.
    accepted: dict[tuple, bool] = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    def accepts(self, shape: tuple) -> bool:
        """True when ``shape`` fits this spec (-1 matches any size)."""
        accepted = self.accepted
        if type(shape) is tuple and shape in accepted:
            return True
        expected = self.shape
        if len(shape) != len(expected):
            return False
        for got, want in zip(shape, expected, strict=False):
            if want != -1 and got != want:
                return False
        if type(shape) is tuple and len(accepted) < ACCEPTED_SHAPES_KEPT:
            accepted[shape] = True
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
    #: Output name -> the lines of its ``label_filename`` (the classification extension).
    labels: dict[str, list[str]] = field(default_factory=dict)
    #: True when some input or output has a ``reshape`` (the infer path skips reshaping otherwise).
    reshaped: bool = False
    #: Requests are checked as MLServer checks them (a model from model-settings.json): any input name,
    #: datatype and shape, no required inputs, any requested output name.
    open_tensors: bool = False

    @property
    def batching(self) -> bool:
        # (inlined twin: LoadedModel.prepare reads max_batch_size > 0 itself on the hot path)
        return self.max_batch_size > 0

    def model_feeds(self, feeds: dict) -> dict:
        """Inputs (in the config's dims) reshaped to the shapes the model takes (Triton's ``reshape``)."""
        skip = 1 if self.batching else 0
        shaped = {}
        for name, array in feeds.items():
            spec = self.input_by_name[name]
            if spec.reshape is None:
                shaped[name] = array
            else:
                target = _moved_variable_dims(array.shape[skip:], spec.shape[skip:], spec.reshape)
                shaped[name] = array.reshape(array.shape[:skip] + target)
        return shaped

    def client_output(self, name: str, array: Any) -> Any:
        """An output as the model made it, reshaped back to the config's dims."""
        spec = self.output_by_name.get(name)
        if spec is None or spec.reshape is None:
            return array
        skip = 1 if self.batching else 0
        target = _moved_variable_dims(array.shape[skip:], spec.reshape, spec.shape[skip:])
        return array.reshape(array.shape[:skip] + target)


@dataclass(frozen=True)
class DiscoveredTensor:
    """A tensor as the backend reports it from the model file."""

    name: str
    datatype: str
    #: None for a dimension without a fixed size.
    shape: tuple[int | None, ...]


def _moved_variable_dims(shape: tuple, source: tuple, target: tuple) -> tuple[int, ...]:
    """``target`` with its variable (-1) dims taken, in order, from ``shape``'s sizes at ``source``'s -1 dims.

    Triton's reshape rule: load-time checks guarantee that the fixed dims between
    variable ones hold the same element counts on both sides.
    """
    variable = iter([size for size, dim in zip(shape, source, strict=True) if dim == -1])
    return tuple(next(variable) if dim == -1 else int(dim) for dim in target)


def read_config_file(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt; InvalidArgument with the parser's message on error."""
    config = mc.ModelConfig()
    try:
        text = path.read_text()
        text_format.Parse(text, config)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{path}: not UTF-8 text: {exc}") from None
    except text_format.ParseError as exc:
        raise InvalidArgument(_parse_error_message(path, text, exc)) from None
    return config


def _parse_error_message(path: Path, text: str, exc: text_format.ParseError) -> str:
    """``<path>, line L, column C: <what protobuf expected>`` and the offending line, as compilers say it."""
    line, column = exc.GetLine(), exc.GetColumn()
    message = str(exc)
    if line is None:
        return f"{path}: {message}"
    prefix = f"{line}:{column} : "
    if message.startswith(prefix):
        message = message[len(prefix):]
    message = _integer_error_in_tritons_words(message)
    lines = text.splitlines()
    source = lines[line - 1].strip()[:120] if 0 < line <= len(lines) else ""
    shown = f" (line {line} reads: {source!r})" if source and source not in message else ""
    return f"{path}, line {line}, column {column}: {message}{shown}"



#: Python's text-format integer errors: ``'<the line>': <what>: <value>``.
_INTEGER_ERROR = re.compile(r"^'(?P<line>.*)': (?P<what>Couldn't parse integer|Value out of range): (?P<value>.*)$")
_FIELD_NAME = re.compile(r"(\w+)\s*:")


def _integer_field_names() -> tuple[frozenset[str], frozenset[str]]:
    """Names of the unsigned and of the signed integer fields anywhere in ModelConfig (a few, such as
    ``count``, are in both: unsigned in one message, signed in another)."""
    kind = pb_descriptor.FieldDescriptor
    unsigned_types = (kind.TYPE_UINT32, kind.TYPE_UINT64, kind.TYPE_FIXED32, kind.TYPE_FIXED64)
    signed_types = (kind.TYPE_INT32, kind.TYPE_INT64, kind.TYPE_SINT32, kind.TYPE_SINT64, kind.TYPE_SFIXED32,
                    kind.TYPE_SFIXED64)
    unsigned: set[str] = set()
    signed: set[str] = set()
    pending = [mc.ModelConfig.DESCRIPTOR]
    seen: set[str] = set()
    while pending:
        message = pending.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        pending.extend(message.nested_types)
        for entry in message.fields:
            if entry.type in unsigned_types:
                unsigned.add(entry.name)
            elif entry.type in signed_types:
                signed.add(entry.name)
            if entry.message_type is not None:
                pending.append(entry.message_type)
    return frozenset(unsigned), frozenset(signed)


UNSIGNED_FIELDS, SIGNED_FIELDS = _integer_field_names()


def _integer_error_in_tritons_words(message: str) -> str:
    """Python's text-format integer errors as C++ protobuf (Triton's parser) words them: a value that is not an
    integer (a string, or a sign an unsigned field cannot take) "Expected integer, got: <token>", one too large
    "Integer out of range (<digits>)"; other messages unchanged."""
    found = _INTEGER_ERROR.match(message)
    if found is None:
        return message
    value = found["value"]
    if found["what"] == "Couldn't parse integer":
        return f"Expected integer, got: {value}"
    names = _FIELD_NAME.findall(found["line"])
    field = names[-1] if names else ""  # the last "name:" on the line is the field the value is for
    if value.startswith("-") and field in UNSIGNED_FIELDS:
        if field in SIGNED_FIELDS:
            return message  # which message the field is in is not said: keep Python's words
        return "Expected integer, got: -"
    return f"Integer out of range ({value.lstrip('-')})"


def named_copy(config: mc.ModelConfig, model_name: str) -> mc.ModelConfig:
    """A copy of ``config`` named after its directory; a config.pbtxt that names another model is refused."""
    done = mc.ModelConfig()
    done.CopyFrom(config)
    if done.name and done.name != model_name:
        raise InvalidArgument(
            f"model '{model_name}': config.pbtxt name '{done.name}' does not match the directory name"
        )
    done.name = model_name
    return done


def complete_config(
    config: mc.ModelConfig,
    model_name: str,
    inputs: Sequence[DiscoveredTensor],
    outputs: Sequence[DiscoveredTensor],
    default_max_batch_size: int,
    platform: str = ONNX_PLATFORM,
    on_gpu: bool = False,
    auto_complete: bool = True,
) -> mc.ModelConfig:
    """Fill what ``config`` leaves out from the model's own tensors, and check what it says.

    ``on_gpu``: the instances run on GPU 0, so the instance groups say KIND_GPU as Triton's do.
    ``auto_complete``: Triton's auto-complete runs (its words for a batch size the model cannot take).
    Returns a new message; ``config`` is not modified.
    """
    done = named_copy(config, model_name)
    if not done.platform and not done.backend:
        done.platform = platform
    if done.platform == ONNX_PLATFORM and not done.backend:
        done.backend = "onnxruntime"

    # the sequence batcher feeds control and state inputs and keeps state outputs: not the client's tensors
    # (a state output the config also lists as an ordinary output is returned to clients who ask, as in Triton)
    listed_outputs = {entry.name for entry in config.output}
    injected = {c.name for c in config.sequence_batching.control_input} | {
        name for state in config.sequence_batching.state for name in (state.input_name, state.output_name)
        if name not in listed_outputs
    }
    # batch inputs (Triton's ragged batching) are computed by the server, not sent by clients
    batch_targets = {target for entry in config.batch_input for target in entry.target_name}
    if platform == ONNX_PLATFORM:
        _check_batch_targets(model_name, batch_targets, inputs)
    inputs = [t for t in inputs if t.name not in injected and t.name not in batch_targets]
    outputs = [t for t in outputs if t.name not in injected]
    all_tensors = list(inputs) + list(outputs)
    can_batch = bool(all_tensors) and all(t.shape and t.shape[0] is None for t in all_tensors)
    if config.max_batch_size == 0 and not config.input and not config.output and can_batch:
        # Nothing said about batching and the model can batch: Triton's auto-complete.
        done.max_batch_size = default_max_batch_size
    if done.max_batch_size < 0:
        raise InvalidArgument(f"model '{model_name}': max_batch_size must be >= 0, got {done.max_batch_size}")
    batch_dims = 1 if done.max_batch_size > 0 else 0

    # A model file's own shapes are checked against the config (a Python model's come from the config).
    check_shapes = platform == ONNX_PLATFORM
    # Triton's onnxruntime backend auto-completes unless the config lists both inputs and outputs
    backend_completes = auto_complete and not ((config.input or config.batch_input) and config.output)
    if check_shapes and backend_completes and done.max_batch_size > 0 and all_tensors and not can_batch:
        # Triton's onnxruntime backend, auto-completing max_batch_size
        raise InvalidArgument(
            f"autofill failed for model '{model_name}': model does not support batching while non-zero "
            "max_batch_size is specified"
        )
    if check_shapes and done.input and len(done.input) != len(inputs):
        # Triton's onnxruntime backend counts the inputs before it looks at their names
        _refuse_input_count(model_name, done.input, inputs)
    # a ragged input reaches the model flat and a batch output leaves it flat: their shapes are checked apart
    ragged = {entry.name for entry in config.input if entry.allow_ragged_batch}
    scattered = {target for entry in config.batch_output for target in entry.target_name}
    _complete_tensors(done.input, inputs, batch_dims, model_name, "input", check_shapes, ragged)
    _complete_tensors(done.output, outputs, batch_dims, model_name, "output", check_shapes, scattered)
    if check_shapes and len(done.input) != len(inputs):
        # Triton's onnxruntime backend: every model input must be in the config (else every request fails).
        _refuse_input_count(model_name, done.input, inputs)

    if not done.instance_group:
        group = done.instance_group.add()
        group.count = 1
        group.kind = mc.ModelInstanceGroup.KIND_AUTO
        group.name = model_name  # Triton names the group it adds after the model, the others <model>_<index>
    for index, group in enumerate(done.instance_group):
        if group.count <= 0:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.append(0)
        if not group.name:
            group.name = f"{model_name}_{index}"
    if done.HasField("dynamic_batching") and done.max_batch_size == 0:
        raise InvalidArgument(
            f"model '{model_name}': dynamic_batching needs max_batch_size > 0"
        )
    return done


def _refuse_input_count(
    model_name: str, configured: RepeatedCompositeFieldContainer[mc.ModelInput], inputs: Sequence[DiscoveredTensor]
) -> None:
    names = {entry.name for entry in configured}
    missing = sorted({t.name for t in inputs} - names)
    extra = sorted(names - {t.name for t in inputs})
    detail = "; ".join(part for part in (
        f"not in the config: {', '.join(missing)}" if missing else "",
        f"not in the model: {', '.join(extra)}" if extra else "",
    ) if part)
    raise InvalidArgument(
        f"unable to load model '{model_name}', configuration expects {len(configured)} inputs, model provides "
        f"{len(inputs)}" + (f" ({detail})" if detail else "")
    )


def shape_text(shape: Sequence[int]) -> str:
    """A shape as Triton's backends write it in messages: ``[-1,16]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def _check_batch_targets(model_name: str, targets: set[str], inputs: Sequence[DiscoveredTensor]) -> None:
    """Every batch input's target must be an input of the model file (ONNX Runtime feeds it by name)."""
    model_inputs = {t.name for t in inputs}
    for target in sorted(targets - model_inputs):
        raise InvalidArgument(
            f"model '{model_name}': batch input target '{target}' is not an input of the model "
            f"(model inputs: {', '.join(sorted(model_inputs)) or 'none'})"
        )


def config_data_type(datatype: str) -> mc.DataType:
    """The config.pbtxt ``TYPE_*`` value of a V2 datatype name ("FP32" -> TYPE_FP32)."""
    # protoc's stubs give the field the enum's type and Value() a plain int: the same value at run time.
    return cast("mc.DataType", mc.DataType.Value(V2_TO_CONFIG[datatype]))


def _complete_tensors(
    configured: RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput],
    discovered: Sequence[DiscoveredTensor],
    batch_dims: int,
    model_name: str,
    kind: str,
    check_shapes: bool = False,
    flat: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Fill ``configured`` from the model's tensors (all of them when it lists none) and check what it lists.

    ``flat``: tensors the model takes or gives flat (ragged inputs, batch outputs), whose dims are not
    compared with the model's; a ragged input must be ``[-1]`` in the model, as Triton's onnxruntime backend says.
    """
    found = {t.name: t for t in discovered}
    if not configured:
        for tensor in discovered:
            entry = configured.add()
            entry.name = tensor.name
            entry.data_type = config_data_type(tensor.datatype)
            entry.dims.extend(-1 if d is None else int(d) for d in tensor.shape[batch_dims:])
        return
    for entry in configured:
        model_tensor = found.get(entry.name)
        if model_tensor is None:
            # Triton's backends' words (CheckAllowedModelInput / CheckAllowedModelOutput)
            raise InvalidArgument(
                f"unexpected inference {kind} '{entry.name}', allowed {kind}s are: {', '.join(sorted(found))} "
                f"(model '{model_name}')"
            )
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = config_data_type(model_tensor.datatype)
        configured_type = CONFIG_TO_V2.get(mc.DataType.Name(entry.data_type))
        if configured_type != model_tensor.datatype:
            # Triton's onnxruntime backend's words
            raise InvalidArgument(
                f"unable to load model '{model_name}', configuration expects datatype "
                f"{mc.DataType.Name(entry.data_type)} for {kind} '{entry.name}', model provides "
                f"{V2_TO_CONFIG.get(model_tensor.datatype, model_tensor.datatype)}"
            )
        if not entry.dims and not entry.HasField("reshape"):
            entry.dims.extend(-1 if d is None else int(d) for d in model_tensor.shape[batch_dims:])
        check_reshape(entry, batch_dims > 0, model_name, kind)
        if check_shapes and entry.name in flat:
            if kind == "input" and model_tensor.shape != (None,):
                model_shape = [-1 if d is None else int(d) for d in model_tensor.shape]
                raise InvalidArgument(  # Triton's words
                    f"unable to load model '{model_name}', configuration expects model provides input with shape "
                    f"[-1] for ragged input '{entry.name}', model provides {model_shape}"
                )
        elif check_shapes:
            check_model_shape(entry, model_tensor, batch_dims > 0, model_name)


def check_reshape(entry: Any, batching: bool, model_name: str, kind: str) -> None:
    """Triton's rules for ``dims`` and ``reshape``: InvalidArgument saying which one is broken."""
    where = f"model '{model_name}': {kind} '{entry.name}' "
    if not entry.dims:
        if entry.HasField("reshape"):
            raise InvalidArgument(where + "must specify 'dims'")
        return  # a scalar tensor (fastoip serves them; Triton needs dims [1] with an empty reshape)
    if any(dim < 1 and dim != -1 for dim in entry.dims):
        raise InvalidArgument(where + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension")
    if not entry.HasField("reshape"):
        return
    reshape = list(entry.reshape.shape)
    if not reshape and not batching:
        raise InvalidArgument(
            where + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
        )
    if any(dim < 1 and dim != -1 for dim in reshape):
        raise InvalidArgument(
            where + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        )
    dims_trunks, reshape_trunks = _trunks(list(entry.dims)), _trunks(reshape)
    if len(dims_trunks) != len(reshape_trunks):
        raise InvalidArgument(where + "has different number of variable-size dimensions for dims and reshape")
    if dims_trunks != reshape_trunks and not (not reshape and dims_trunks == [1]):
        raise InvalidArgument(
            where + f"has different size for dims and reshape (dims {list(entry.dims)}, reshape {reshape})"
        )


def _trunks(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dims between variable (-1) ones."""
    counts, current = [], 1
    for dim in dims:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def check_model_shape(entry: Any, model_tensor: DiscoveredTensor, batching: bool, model_name: str) -> None:
    """The config's shape (its reshape, else its dims) must fit the model file's, as Triton's ONNX backend checks."""
    dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    model_shape = [-1 if d is None else int(d) for d in model_tensor.shape]
    full = [-1, *dims] if batching else dims
    fits = len(model_shape) == len(full) and all(m == -1 or m == c for m, c in zip(model_shape, full, strict=True))
    if batching and (not model_shape or model_shape[0] != -1):
        raise InvalidArgument(
            f"model '{model_name}', tensor '{entry.name}': for the model to support batching the shape should have "
            f"at least 1 dimension and the first dimension must be -1; but shape expected by the model is "
            f"{model_shape}"
        )
    if not fits:
        batch_note = (
            " (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
            f"making complete shape {shape_text(full)})"
            if batching
            else ""
        )
        raise InvalidArgument(
            f"model '{model_name}', tensor '{entry.name}': the model expects {len(model_shape)} dimensions "
            f"(shape {shape_text(model_shape)}) but the model configuration specifies {len(full)} "
            f"dimensions{batch_note}"
            + ("" if entry.HasField("reshape") else "; a 'reshape' in the config maps between the two")
        )


def model_spec(config: mc.ModelConfig, model_dir: Path | None = None) -> ModelSpec:
    """The infer path's view of a completed config; ``model_dir`` holds the outputs' label files."""
    batch = (-1,) if config.max_batch_size > 0 else ()

    def specs(entries: Iterable[mc.ModelInput | mc.ModelOutput]) -> tuple[TensorSpec, ...]:
        return tuple(
            TensorSpec(
                name=e.name,
                datatype=CONFIG_TO_V2[mc.DataType.Name(e.data_type)],
                shape=batch + tuple(int(d) for d in e.dims),
                optional=bool(getattr(e, "optional", False)),
                reshape=tuple(int(d) for d in e.reshape.shape) if e.HasField("reshape") else None,
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
        labels={
            e.name: read_labels(model_dir, e.label_filename, e.name)
            for e in config.output
            if e.label_filename and model_dir is not None
        },
        reshaped=any(t.reshape is not None for t in inputs + outputs),
        open_tensors=MODEL_SETTINGS_PARAMETER in config.parameters,
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
        raise InvalidArgument(f"failed to load '{model}': failed to parse the 'config' parameter: {exc}") from None
    return config


# -- model-settings.json -----------------------------------------------------------------------
def read_model_settings(path: Path, model_name: str, by_name: bool = False) -> mc.ModelConfig:
    """MLServer's ``model-settings.json`` (validated: :mod:`.model_settings`) as a ModelConfig for the Python backend.

    ``implementation`` -> parameter ``implementation``; ``parameters``
    (``content_type``, ``version``, ``extra`` as JSON, anything else) ->
    config parameters; ``inputs``/``outputs`` (name, datatype, shape,
    ``parameters.content_type``) -> config tensors, their content types ->
    parameters ``input.<name>.content_type`` / ``output.<name>.content_type``;
    ``max_batch_size`` > 1 with ``max_batch_time`` > 0 (MLServer's adaptive batching) ->
    ``max_batch_size`` with a dynamic batcher whose delay is ``max_batch_time`` seconds,
    and shapes lose their batch dimension;
    ``parallel_workers`` -> the instance count.  The whole document travels as
    parameter ``model_settings`` (JSON): its presence marks a model whose requests
    are checked as MLServer checks them (names, datatypes and shapes are not held to
    the declared ones).  ``by_name``: the model is named by the file (MLServer's
    layouts), so its ``name`` is the model's; otherwise the folder's name must match.
    """
    settings = parse_model_settings(path, model_name)
    config = mc.ModelConfig(name=model_name, backend="python")
    if settings.name and settings.name != model_name and not by_name:
        raise InvalidArgument(
            f"model '{model_name}': {MODEL_SETTINGS} name '{settings.name}' does not match the directory name"
        )

    def put(key: str, value: Any) -> None:
        config.parameters[key].string_value = value if isinstance(value, str) else json.dumps(value)

    put(MODEL_SETTINGS_PARAMETER, settings.model_dump(mode="json", exclude_none=True))
    if settings.implementation:
        put("implementation", settings.implementation)
    batching = settings.max_batch_size > 1 and settings.max_batch_time > 0  # MLServer's adaptive batching
    if settings.max_batch_size > 1 and not batching:
        log.warning("model '%s': max_batch_size %d with max_batch_time 0 does not batch (as in MLServer)",
                    model_name, settings.max_batch_size)
    if batching:
        config.max_batch_size = settings.max_batch_size
        config.dynamic_batching.max_queue_delay_microseconds = int(settings.max_batch_time * 1e6)
    if settings.parallel_workers:
        config.instance_group.add(count=settings.parallel_workers, kind=mc.ModelInstanceGroup.KIND_CPU)
    parameters = settings.parameters.model_dump(exclude_none=True) if settings.parameters else {}
    for key, value in parameters.items():
        if key == "autogenerate_inference_pool_gid" and not value:
            continue
        if key == "extra" and not value:
            continue
        put(key, value)
    for kind, entries, add in (("input", settings.inputs, config.input.add),
                               ("output", settings.outputs, config.output.add)):
        for entry in entries:
            shape = list(entry.shape) or [-1]
            if batching:
                shape = shape[1:]
            tensor = add()
            tensor.name = entry.name
            tensor.data_type = config_data_type(entry.datatype)
            tensor.dims.extend(shape)
            content_type = entry.parameters.content_type if entry.parameters else None
            if content_type:
                put(input_key(entry.name) if kind == "input" else output_key(entry.name), content_type)
    return config


def is_model_settings_config(config: mc.ModelConfig) -> bool:
    """Whether ``config`` came from a ``model-settings.json`` (requests are then checked as MLServer does)."""
    return MODEL_SETTINGS_PARAMETER in config.parameters


def version_name(config: mc.ModelConfig, version: int) -> str:
    """How version ``version`` of a model is named to clients: MLServer's label (``parameters.version`` of a
    model-settings.json, e.g. "v0.1.0") for a model from one that has it, else the number (Triton's)."""
    if MODEL_SETTINGS_PARAMETER in config.parameters and "version" in config.parameters:
        label = config.parameters["version"].string_value.strip()
        if label:
            return label
    return str(version)


_INT64_TYPES = frozenset(
    (
        pb_descriptor.FieldDescriptor.TYPE_INT64,
        pb_descriptor.FieldDescriptor.TYPE_UINT64,
        pb_descriptor.FieldDescriptor.TYPE_SINT64,
        pb_descriptor.FieldDescriptor.TYPE_FIXED64,
        pb_descriptor.FieldDescriptor.TYPE_SFIXED64,
    )
)


def config_to_json(config: mc.ModelConfig) -> dict[str, Any]:
    """Triton's JSON form of a ModelConfig: proto field names, defaults printed, 64-bit ints as numbers."""
    doc = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(config.DESCRIPTOR, doc)  # type: ignore[arg-type]  # the upb Descriptor is the same API
    return doc


def _int64_as_numbers(descriptor: pb_descriptor.Descriptor, doc: dict[str, Any]) -> None:
    # Proto3 JSON writes 64-bit integers as strings; Triton (and perf_analyzer) expect numbers.
    for entry in descriptor.fields:
        value = doc.get(entry.name)
        if value is None:
            continue
        message = entry.message_type
        if message is not None and message.GetOptions().map_entry:
            value_field = message.fields_by_name["value"]
            if value_field.message_type is not None:
                for item in value.values():
                    _int64_as_numbers(value_field.message_type, item)
            elif value_field.type in _INT64_TYPES:
                doc[entry.name] = {key: int(item) for key, item in value.items()}
        elif message is not None:
            for item in value if entry.is_repeated else (value,):
                _int64_as_numbers(message, item)
        elif entry.type in _INT64_TYPES:
            doc[entry.name] = [int(item) for item in value] if entry.is_repeated else int(value)

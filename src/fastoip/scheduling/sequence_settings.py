"""What a ``sequence_batching`` config asks for, checked and precomputed at load.

Rules (Triton's ``model_configuration.md`` "Sequence Batcher" and the core's
``model_config_utils.cc`` / ``sequence_batch_scheduler.cc``, in fastoip's words):
- Control inputs: each ``control_input`` names one model input and holds exactly
  one control; START, END and READY carry exactly one of ``int32_false_true``,
  ``fp32_false_true`` or ``bool_false_true`` (two values: false, true); CORRID
  carries a ``data_type`` (an integer type or TYPE_STRING) and no values.
- A control tensor is one element per request: shape ``[1]``, plus the batch
  dimension when the model batches.
- Implicit state: each ``state`` pairs a model input with a model output of one
  datatype and fixed dims; it starts from ``initial_state`` (zeros, or a file in
  the model's ``initial_state/`` folder holding the raw bytes) or zeros.
- ``max_sequence_idle_microseconds`` defaults to Triton's 1,000,000.
- ``iterative_sequence: true`` turns on Triton's generative sequencer (the batcher's rules say what it does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._proto import model_config_pb2 as mc
from ..datatypes import CONFIG_TO_V2, NUMPY_DTYPES
from ..errors import InvalidArgument

DEFAULT_IDLE_US = 1_000_000
INITIAL_STATE_FOLDER = "initial_state"

_KINDS = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_CORRID_TYPES = {"UINT64", "INT64", "UINT32", "INT32", "BYTES"}


@dataclass(frozen=True)
class ControlSpec:
    """One control input: which signal, as which tensor, with which false/true values."""

    name: str
    kind: str  # START | END | READY | CORRID
    datatype: str
    false_value: object = 0
    true_value: object = 1


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: the output fed back as the input of the next request of the sequence."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: np.ndarray


@dataclass(frozen=True)
class SequenceSettings:
    """The parsed ``sequence_batching`` block."""

    strategy: str  # direct | oldest
    idle_ns: int
    controls: tuple[ControlSpec, ...]
    states: tuple[StateSpec, ...]
    max_candidates: int
    preferred_batch_sizes: tuple[int, ...]
    queue_delay_ns: int
    corrid_datatype: str | None
    #: ``direct``'s ``minimum_slot_utilization``: the queue delay holds a batch back only while fewer than this
    #: share of ``max_batch_size`` sequences have a request ready; 0 (the default) never holds it back.
    minimum_slot_utilization: float = 0.0
    #: ``iterative_sequence``: a request without a correlation id is a sequence of its own (the batcher names it),
    #: and a model may send a request back to run again (request rescheduling), as Triton's generative sequencer.
    iterative: bool = False


def sequence_settings(config: mc.ModelConfig, model_dir: Path | None = None) -> SequenceSettings:
    """Check ``config.sequence_batching`` and precompute what the batcher needs."""
    block = config.sequence_batching
    name = config.name
    controls = tuple(_control(name, entry) for entry in block.control_input)
    seen: set[str] = set()
    for control in controls:
        if control.kind in seen:
            raise InvalidArgument(
                f"sequence batching specifies multiple {control.kind} control tensors for model '{name}'"
            )
        seen.add(control.kind)
    states = tuple(_state(name, entry, model_dir) for entry in block.state)
    corrid = next((c.datatype for c in controls if c.kind == "CORRID"), None)
    if block.WhichOneof("strategy_choice") == "oldest":
        oldest = block.oldest
        strategy = "oldest"
        max_candidates = oldest.max_candidate_sequences
        preferred = tuple(sorted(oldest.preferred_batch_size))
        delay_us = oldest.max_queue_delay_microseconds
    else:
        strategy = "direct"
        max_candidates = 0
        preferred = ()
        delay_us = block.direct.max_queue_delay_microseconds
    idle_us = block.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    return SequenceSettings(strategy, idle_us * 1000, controls, states, max_candidates, preferred,
                            delay_us * 1000, corrid, float(block.direct.minimum_slot_utilization),
                            bool(block.iterative_sequence))


def _control(model: str, entry: mc.ModelSequenceBatching.ControlInput) -> ControlSpec:
    if not entry.name:
        raise InvalidArgument(f"sequence batching control tensor must have a name for model '{model}'")
    if len(entry.control) != 1:
        raise InvalidArgument(
            f"sequence batching control tensor '{entry.name}' must have exactly one control for model '{model}'"
        )
    control = entry.control[0]
    kind = _KINDS[control.kind]
    if kind == "CORRID":
        datatype = CONFIG_TO_V2.get(mc.DataType.Name(control.data_type), "")
        if datatype not in _CORRID_TYPES:
            raise InvalidArgument(
                f"sequence batching control tensor '{entry.name}' for model '{model}': the CORRID control "
                "must specify a data_type of TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
            )
        return ControlSpec(entry.name, kind, datatype)
    given: list[tuple[int, str, list[Any]]] = [(len(control.int32_false_true), "INT32", list(control.int32_false_true)),
             (len(control.fp32_false_true), "FP32", list(control.fp32_false_true)),
             (len(control.bool_false_true), "BOOL", list(control.bool_false_true))]
    present = [g for g in given if g[0]]
    if len(present) != 1:
        raise InvalidArgument(
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
            f"for {kind} control tensor '{entry.name}' of model '{model}'"
        )
    count, datatype, values = present[0]
    if count != 2:
        raise InvalidArgument(
            f"sequence batching control tensor '{entry.name}' of model '{model}' must have exactly 2 "
            f"false/true values, got {count}"
        )
    return ControlSpec(entry.name, kind, datatype, values[0], values[1])


def _state(model: str, entry: mc.ModelSequenceBatching.State, model_dir: Path | None) -> StateSpec:
    datatype = CONFIG_TO_V2.get(mc.DataType.Name(entry.data_type), "")
    where = f"state '{entry.input_name}' of model '{model}'"
    if not entry.input_name or not entry.output_name:
        raise InvalidArgument(f"sequence batching state of model '{model}' must name its input and output")
    if not datatype:
        raise InvalidArgument(f"{where}: implicit state needs a data_type")
    dims = tuple(entry.dims)
    if not dims or any(d < 1 and d != -1 for d in dims):
        raise InvalidArgument(f"{where}: implicit state dims must be >= 1 or -1, got {list(dims)}")
    if len(entry.initial_state) > 1:
        raise InvalidArgument(
            f"initial_state field for state input '{entry.input_name}' must contain exactly one or zero element, "
            f"found '{len(entry.initial_state)}' elements"
        )
    # Triton: a variable dimension starts at 1; an initial_state with dims gives the starting shape.
    start = tuple(1 if d == -1 else d for d in dims)
    if entry.initial_state and entry.initial_state[0].dims:
        start = tuple(1 if d == -1 else d for d in entry.initial_state[0].dims)
    dtype = NUMPY_DTYPES[datatype]
    # zeros; a string state starts as empty strings (Triton's SetStringDataToZero)
    initial = np.full(start, b"", dtype=object) if datatype == "BYTES" else np.zeros(start, dtype=dtype)
    if entry.initial_state and entry.initial_state[0].WhichOneof("state_data") == "data_file":
        initial = _initial_from_file(where, entry.initial_state[0].data_file, datatype, start, model_dir)
    initial.flags.writeable = False
    return StateSpec(entry.input_name, entry.output_name, datatype, dims, initial)


def _initial_from_file(where: str, filename: str, datatype: str, dims: tuple[int, ...],
                       model_dir: Path | None) -> np.ndarray:
    if model_dir is None:
        raise InvalidArgument(f"{where}: initial_state data_file needs the model's directory")
    folder = (model_dir / INITIAL_STATE_FOLDER).resolve()
    path = (folder / filename).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise InvalidArgument(
            f"{where}: initial_state data_file '{filename}' is not a file in '{INITIAL_STATE_FOLDER}/'"
        )
    raw = path.read_bytes()
    count = int(np.prod(dims))
    if datatype == "BYTES":  # the length-prefixed BYTES framing, as Triton reads it
        from .._codec import deserialize_bytes_tensor

        try:
            return np.asarray(deserialize_bytes_tensor(raw, count)).reshape(dims)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: initial_state data_file '{filename}': {exc.message}") from None
    dtype = NUMPY_DTYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidArgument(
            f"{where}: initial_state data_file '{filename}' has {len(raw)} bytes, expected {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def control_tensor(control: ControlSpec, value: object, batched: bool) -> np.ndarray:
    """The one-element tensor of ``control`` for one request (``value``: bool, or the correlation id)."""
    shape = (1, 1) if batched else (1,)
    if control.kind == "CORRID":
        if control.datatype == "BYTES":
            return np.array([str(value).encode()], dtype=object).reshape(shape)
        assert isinstance(value, int)
        return np.full(shape, value, dtype=NUMPY_DTYPES[control.datatype])
    chosen = control.true_value if value else control.false_value
    return np.full(shape, chosen, dtype=NUMPY_DTYPES[control.datatype])

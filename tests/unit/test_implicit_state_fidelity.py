"""Implicit state as Triton keeps it: a string state (TYPE_STRING) that grows (variable dims, starting at 1
element as Triton starts them, empty strings as Triton zeroes them), with the state output also listed as an
ordinary output the client may ask for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from fastoip.core import Core
from fastoip.repository import RepositoryOptions
from fastoip.types import InferInput, InferRequest, RequestedOutput

CONFIG = """
max_batch_size: 0
instance_group [ { kind: KIND_CPU count: 2 } ]  # a slot per sequence: two run side by side
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "STATE_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
}
"""


def _history_model() -> bytes:
    """STATE_OUT = STATE_IN ++ INPUT; OUT = STATE_OUT (strings, no batch dimension)."""
    s = TensorProto.STRING
    graph = helper.make_graph(
        [helper.make_node("Concat", ["STATE_IN", "INPUT"], ["STATE_OUT"], axis=0),
         helper.make_node("Identity", ["STATE_OUT"], ["OUT"])],
        "history",
        [helper.make_tensor_value_info("INPUT", s, [1]), helper.make_tensor_value_info("STATE_IN", s, ["n"])],
        [helper.make_tensor_value_info("OUT", s, ["m"]), helper.make_tensor_value_info("STATE_OUT", s, ["m"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def _step(core: Core, sequence: int, word: bytes, start: bool = False, end: bool = False,
          outputs: tuple[str, ...] = ("OUT",)) -> dict[str, list]:
    data = np.array([word], dtype=object)
    request = InferRequest(
        "history", inputs=[InferInput("INPUT", "BYTES", data.shape, data)],
        parameters={"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        outputs=[RequestedOutput(name) for name in outputs],
    )
    return {o.name: o.data.tolist() for o in core.infer(request).outputs}


def test_a_string_state_of_variable_size_carries_the_sequence(tmp_path: Path) -> None:
    (tmp_path / "history" / "1").mkdir(parents=True)
    (tmp_path / "history" / "1" / "model.onnx").write_bytes(_history_model())
    (tmp_path / "history" / "config.pbtxt").write_text(CONFIG)
    core = Core(tmp_path, RepositoryOptions(use_gpu=False), worker_threads=2)
    core.load_models()
    try:
        entry = {e.name: e for e in core.repository_index()}["history"]
        assert entry.state == "READY", entry.reason
        assert _step(core, 7, b"a", start=True) == {"OUT": [b"", b"a"]}
        assert _step(core, 8, b"x", start=True) == {"OUT": [b"", b"x"]}  # sequences keep their own state
        assert _step(core, 7, b"b") == {"OUT": [b"", b"a", b"b"]}
        # the state output is an ordinary output too, for a client that asks for it
        assert _step(core, 7, b"c", end=True, outputs=("STATE_OUT",)) == {"STATE_OUT": [b"", b"a", b"b", b"c"]}
        assert _step(core, 7, b"z", start=True, end=True) == {"OUT": [b"", b"z"]}  # a new sequence starts over
    finally:
        core.close()

"""Small ONNX models for tests, built with the onnx helper API (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

#: V2 datatype -> ONNX element type, for the datatype round-trip models.
V2_TO_ONNX = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}


def identity_model_bytes(elem_type: int, dims: list, name: str = "identity", batch: bool = True) -> bytes:
    """INPUT0 -> Identity -> OUTPUT0 with the given element type and dims."""
    shape = (["batch"] if batch else []) + list(dims)
    inp = helper.make_tensor_value_info("INPUT0", elem_type, shape)
    out = helper.make_tensor_value_info("OUTPUT0", elem_type, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name, [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def write_model(root: Path, name: str, data: bytes, version: int = 1, config: str | None = None) -> Path:
    """Write ``<root>/<name>/<version>/model.onnx`` (+ config.pbtxt) and return the model dir."""
    version_dir = root / name / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.onnx").write_bytes(data)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return root / name


def write_datatype_repository(root: Path) -> dict[str, str]:
    """One identity model per V2 datatype, named ``identity_<datatype>``; returns datatype -> model name."""
    names = {}
    for datatype, elem_type in V2_TO_ONNX.items():
        name = f"identity_{datatype.lower()}"
        write_model(root, name, identity_model_bytes(elem_type, ["n"] if datatype == "BYTES" else [4], name))
        names[datatype] = name
    return names


def datatype_sample(datatype: str) -> np.ndarray:
    """A [2, 4] (BYTES: [2, 3]) array of ``datatype`` with its edge values (min/max, NaN, Inf, -0.0, empty bytes)."""
    rng = np.random.default_rng(4)
    if datatype == "BOOL":
        return rng.integers(0, 2, (2, 4)).astype(bool)
    if datatype == "BYTES":
        return np.array([[b"a", b"", b"\x00\xff"], [b"xyz", "é".encode(), b"\x80"]], dtype=object)
    if datatype == "FP16":
        return np.array([[np.nan, np.inf, -np.inf, -0.0], [1.5, -2.25, 65504, 6e-8]], dtype=np.float16)
    if datatype in ("FP32", "BF16"):
        return np.array([[1.0, -2.5, 0.0, 3.140625], [-0.0, 1e10, -7.0, 0.5]], dtype=np.float32)
    if datatype == "FP64":
        return rng.standard_normal((2, 4))
    dtype = np.dtype(datatype.lower())
    info = np.iinfo(dtype)
    return np.array([[info.min, info.max, 0, 1], [2, 3, info.max - 1, info.min + 1]], dtype=dtype)


#: Config for a ``slow_model_bytes`` model whose timing a test relies on: one item at a time through a batcher,
#: on one intra-op thread (ORT's default would use every core and make it faster on a bigger machine).
SLOW_CONFIG = (
    'max_batch_size: 1\ndynamic_batching { }\n'
    'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
)


def slow_model_bytes(rows: int = 256, layers: int = 4) -> bytes:
    """INPUT0 FP32 [batch, 1] -> OUTPUT0 FP32 [batch, 1]; each item costs ``layers`` 1024x1024 matmuls on ``rows`` rows.

    Used to keep an instance busy long enough to observe queueing (tens of ms an item).
    """
    import numpy as np
    from onnx import numpy_helper

    weight = numpy_helper.from_array(np.full((1024, 1024), 1e-3, dtype=np.float32), "W")
    shape = numpy_helper.from_array(np.array([1, rows, 1024], dtype=np.int64), "SHAPE")
    axes = numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "AXES")
    nodes = [
        helper.make_node("Unsqueeze", ["INPUT0", "ONE"], ["x3"]),
        helper.make_node("Expand", ["x3", "SHAPE"], ["h0"]),
    ]
    one = numpy_helper.from_array(np.array([2], dtype=np.int64), "ONE")
    for index in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{index}", "W"], [f"h{index + 1}"]))
    nodes.append(helper.make_node("ReduceSum", [f"h{layers}", "AXES"], ["s"], keepdims=0))
    nodes.append(helper.make_node("Unsqueeze", ["s", "ONE_B"], ["OUTPUT0"]))
    one_b = numpy_helper.from_array(np.array([1], dtype=np.int64), "ONE_B")
    inp = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 1])
    out = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "slow", [inp], [out], initializer=[weight, shape, axes, one, one_b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def nonzero_model_bytes() -> bytes:
    """INPUT0 INT32 [n] -> OUTPUT0 INT64 [1, count of non-zeros]: the output shape depends on the data."""
    inp = helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["n"])
    out = helper.make_tensor_value_info("OUTPUT0", TensorProto.INT64, [1, "count"])
    graph = helper.make_graph([helper.make_node("NonZero", ["INPUT0"], ["OUTPUT0"])], "nonzero", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def image_model_bytes(channels: int = 3, size: int = 8, classes: int = 10) -> bytes:
    """NCHW image -> per-channel mean -> linear layer -> class scores (FP32 [batch, classes])."""
    from onnx import numpy_helper

    weights = np.arange(channels * classes, dtype=np.float32).reshape(channels, classes) / 10.0
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["INPUT"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["pooled", "W"], ["OUTPUT"]),
        ],
        "image_classifier",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", channels, size, size])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def conv_model_bytes() -> bytes:
    """[batch, 2, 4, 4] -> 1x1 convolution to 3 channels (weights 1..6) -> [batch, 3, 4, 4]."""
    weights = np.arange(1, 7, dtype=np.float32).reshape(3, 2, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["INPUT0", "W"], ["OUTPUT0"])],
        "conv",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 2, 4, 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def expected_conv(x: np.ndarray) -> np.ndarray:
    weights = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    return np.einsum("oc,bchw->bohw", weights, x)


def ppm_decoder_model_bytes(size: int = 8) -> bytes:
    """Image pre-processing: an encoded plain-PPM file (BYTES [batch, 1]) -> FP32 NCHW [batch, 3, size, size] / 255.

    The file is ``P3 <w> <h> <maxval> r g b r g b ...`` with single spaces (a valid plain PPM; ONNX
    Runtime's StringSplit splits on one separator): split, drop the four header tokens, parse the
    numbers, reshape HWC and transpose to CHW.
    """
    ints = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    nodes = [
        helper.make_node("StringSplit", ["IMAGE"], ["tokens", "counts"], delimiter=" "),
        helper.make_node("Slice", ["tokens", "FIRST", "LAST", "AXIS"], ["pixels_text"]),
        helper.make_node("Cast", ["pixels_text"], ["pixels"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["pixels", "HWC"], ["hwc"]),
        helper.make_node("Transpose", ["hwc"], ["chw"], perm=[0, 3, 1, 2]),
        helper.make_node("Div", ["chw", "MAXVAL"], ["SCALED"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ppm_decoder",
        [helper.make_tensor_value_info("IMAGE", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("SCALED", TensorProto.FLOAT, ["batch", 3, size, size])],
        initializer=[
            ints("FIRST", [4]), ints("LAST", [4 + 3 * size * size]), ints("AXIS", [2]),
            ints("HWC", [-1, size, size, 3]), helper.make_tensor("MAXVAL", TensorProto.FLOAT, [1], [255.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model.SerializeToString()


def _sequence_graph(name: str, nodes: list, inputs: dict[str, int], outputs: dict[str, int],
                    initializers: list) -> bytes:
    """A batched sequence model: every tensor is ``[batch, 1]``."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in inputs.items()],
        [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in outputs.items()],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def sequence_controls(*kinds: str, corrid_type: str = "TYPE_UINT64") -> str:
    """``control_input [...]`` for the given kinds (START, END, READY, CORRID), named as the kinds,
    with the int32 false/true values of Triton's example sequence models."""
    entries = []
    for kind in kinds:
        if kind == "CORRID":
            control = f"kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type}"
        else:
            control = f"kind: CONTROL_SEQUENCE_{kind} int32_false_true: [ 0, 1 ]"
        entries.append(f'{{ name: "{kind}" control [ {{ {control} }} ] }}')
    return "control_input [ " + ", ".join(entries) + " ]"


def simple_sequence_model_bytes() -> bytes:
    """Triton's ``simple_sequence`` semantics: OUTPUT = (INPUT + START) * READY (stateless, INT32)."""
    i32 = TensorProto.INT32
    return _sequence_graph(
        "simple_sequence",
        [helper.make_node("Add", ["INPUT", "START"], ["started"]),
         helper.make_node("Mul", ["started", "READY"], ["OUTPUT"])],
        {"INPUT": i32, "START": i32, "READY": i32}, {"OUTPUT": i32}, [],
    )


def dyna_sequence_model_bytes() -> bytes:
    """Triton's ``simple_dyna_sequence`` semantics: OUTPUT = (INPUT + START + END * CORRID) * READY."""
    i32 = TensorProto.INT32
    return _sequence_graph(
        "simple_dyna_sequence",
        [helper.make_node("Cast", ["CORRID"], ["corrid"], to=i32),
         helper.make_node("Mul", ["END", "corrid"], ["ending"]),
         helper.make_node("Add", ["INPUT", "START"], ["started"]),
         helper.make_node("Add", ["started", "ending"], ["total"]),
         helper.make_node("Mul", ["total", "READY"], ["OUTPUT"])],
        {"INPUT": i32, "START": i32, "END": i32, "READY": i32, "CORRID": TensorProto.UINT64}, {"OUTPUT": i32}, [],
    )


def accumulator_sequence_model_bytes(corrid: int = TensorProto.STRING) -> bytes:
    """Triton's dyna_sequence backend as an ONNX model with implicit state (``simple_string_dyna_sequence``).

    Per sequence an INT32 accumulator: START sets it to INPUT, later steps add INPUT, END adds the
    correlation id (a string decoded as an integer, or an integer); READY=0 rows leave it unchanged
    and answer 0.  OUTPUT = accumulator * READY; the state ACC_OUT -> ACC_IN carries it.
    """
    i32 = TensorProto.INT32
    one = helper.make_tensor("ONE", i32, [1], [1])
    nodes = [
        helper.make_node("Cast", ["CORRID"], ["corrid64"], to=TensorProto.INT64),
        helper.make_node("Cast", ["corrid64"], ["corrid"], to=i32),
        helper.make_node("Sub", ["ONE", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["added"]),
        helper.make_node("Mul", ["END", "corrid"], ["ending"]),
        helper.make_node("Add", ["added", "ending"], ["updated"]),
        helper.make_node("Mul", ["updated", "READY"], ["OUTPUT"]),
        helper.make_node("Sub", ["ONE", "READY"], ["idle"]),
        helper.make_node("Mul", ["ACC_IN", "idle"], ["unchanged"]),
        helper.make_node("Add", ["OUTPUT", "unchanged"], ["ACC_OUT"]),
    ]
    return _sequence_graph(
        "accumulator_sequence", nodes,
        {"INPUT": i32, "START": i32, "END": i32, "READY": i32, "CORRID": corrid, "ACC_IN": i32},
        {"OUTPUT": i32, "ACC_OUT": i32}, [one],
    )


def reduce_max_model_bytes() -> bytes:
    """INPUT0 FP32 [batch, n] -> ReduceMax over n -> OUTPUT0 FP32 [batch, 1]: a large request, a tiny answer."""
    inp = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])
    out = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])
    node = helper.make_node("ReduceMax", ["INPUT0"], ["OUTPUT0"], axes=[1], keepdims=1)
    graph = helper.make_graph([node], "reduce_max", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


#: The sequence tests' accumulator: a Triton sequence model with implicit state and every control input.
IMPLICIT_STATE_SEQUENCE_CONFIG = """
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def implicit_state_sequence_model_bytes() -> bytes:
    def tensor(name: str, elem: int) -> ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["N", 1])

    one = helper.make_tensor("ONE", TensorProto.INT32, [1], [1])
    nodes = [
        helper.make_node("Sub", ["ONE", "START"], ["KEEP"]),
        helper.make_node("Mul", ["STATE_IN", "KEEP"], ["KEPT"]),
        helper.make_node("Mul", ["KEPT", "READY"], ["CARRIED"]),
        helper.make_node("Add", ["INPUT", "CARRIED"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    graph = helper.make_graph(
        nodes, "simple_sequence",
        [tensor("INPUT", TensorProto.INT32), tensor("START", TensorProto.INT32), tensor("READY", TensorProto.INT32),
         tensor("CORRID", TensorProto.UINT64), tensor("STATE_IN", TensorProto.INT32)],
        [tensor("OUTPUT", TensorProto.INT32), tensor("STATE_OUT", TensorProto.INT32),
         tensor("CORRID_OUT", TensorProto.UINT64)],
        initializer=[one],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


#: Triton's batch input kinds -> the name of the model input each feeds (see ``ragged_batch_model_bytes``).
BATCH_INPUT_TARGETS = {
    "BATCH_ELEMENT_COUNT": "COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT": "ACCUMULATED",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": "ACCUMULATED_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE": "MAX_AS_SHAPE",
    "BATCH_ITEM_SHAPE": "ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN": "ITEM_SHAPE_FLATTEN",
}


def ragged_batch_model_bytes() -> bytes:
    """A model that shows what Triton's ragged batching feeds it (FP32 throughout).

    Inputs: ``RAGGED_INPUT`` (flat, ``[-1]``) and one input per batch input kind
    (``BATCH_INPUT_TARGETS``).  Outputs, batch-first so that every request of an
    execution gets one row: ``<input>_OUT`` = that 1-D input repeated once per
    batch item (``[batch, len]``; the batch comes from ``ITEM_SHAPE``'s first dim),
    and ``ITEM_SHAPE_OUT`` = ``ITEM_SHAPE`` itself (each item its own row).
    """
    f32 = TensorProto.FLOAT
    flat = ["RAGGED_INPUT", "COUNT", "ACCUMULATED", "ACCUMULATED_WITH_ZERO", "MAX_AS_SHAPE", "ITEM_SHAPE_FLATTEN"]
    nodes = [
        helper.make_node("Shape", ["ITEM_SHAPE"], ["item_shape_dims"]),
        helper.make_node("Gather", ["item_shape_dims", "first"], ["batch"], axis=0),
        helper.make_node("Identity", ["ITEM_SHAPE"], ["ITEM_SHAPE_OUT"]),
    ]
    for name in flat:
        nodes += [
            helper.make_node("Shape", [name], [f"{name}_len"]),
            helper.make_node("Concat", ["batch", f"{name}_len"], [f"{name}_target"], axis=0),
            helper.make_node("Unsqueeze", [name, "first"], [f"{name}_row"]),
            helper.make_node("Expand", [f"{name}_row", f"{name}_target"], [f"{name}_OUT"]),
        ]
    inputs = [helper.make_tensor_value_info(name, f32, [f"{name}_n"]) for name in flat]
    inputs.append(helper.make_tensor_value_info("ITEM_SHAPE", f32, ["items", "rank"]))
    outputs = [helper.make_tensor_value_info(f"{name}_OUT", f32, ["batch", f"{name}_n"]) for name in flat]
    outputs.append(helper.make_tensor_value_info("ITEM_SHAPE_OUT", f32, ["items", "rank"]))
    first = helper.make_tensor("first", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(nodes, "ragged_batch", inputs, outputs, initializer=[first])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


def ragged_batch_config(max_batch_size: int = 8, preferred: int = 4) -> str:
    """config.pbtxt for ``ragged_batch_model_bytes``: every batch input kind from ``RAGGED_INPUT``
    (``[-1, -1]``, ragged), and a batcher that runs once ``preferred`` batch items wait."""
    batch_inputs = ", ".join(
        f'{{ kind: {kind} target_name: "{target}" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }}'
        for kind, target in BATCH_INPUT_TARGETS.items()
    )
    outputs = ", ".join(
        f'{{ name: "{name}_OUT" data_type: TYPE_FP32 dims: [ -1 ] }}'
        for name in ["RAGGED_INPUT", "COUNT", "ACCUMULATED", "ACCUMULATED_WITH_ZERO", "MAX_AS_SHAPE",
                     "ITEM_SHAPE_FLATTEN", "ITEM_SHAPE"]
    )
    return (
        f"max_batch_size: {max_batch_size}\n"
        'input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]\n'
        f"batch_input [ {batch_inputs} ]\n"
        f"output [ {outputs} ]\n"
        f"dynamic_batching {{ preferred_batch_size: [ {preferred} ] max_queue_delay_microseconds: 20000000 }}\n"
    )


def ragged_io_model_bytes() -> bytes:
    """Triton's QA ``ragged_io``: a flat identity, ``INPUT0`` (ragged) -> ``OUTPUT0`` (a batch output)."""
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "ragged_io",
        [helper.make_tensor_value_info("INPUT0", f32, ["n"])], [helper.make_tensor_value_info("OUTPUT0", f32, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


RAGGED_IO_CONFIG = (
    "max_batch_size: 8\n"
    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    "batch_output [ { target_name: \"OUTPUT0\" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: \"INPUT0\" } ]\n"
    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }\n"
)

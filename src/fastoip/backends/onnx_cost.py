"""What an ONNX graph may cost before it runs (issue 37: a 75-byte uploaded graph answered every 4-byte request
with 256 MB, and ONNX Runtime's constant folding built the tensor at load).

Rules:
- The bound is the most bytes one tensor the graph computes may take (``RepositoryOptions.onnx_max_tensor_bytes``);
  it applies to the models ``RepositoryOptions.onnx_max_tensor_bytes_for`` names: ``uploaded`` (the default:
  graphs whose files came with a load request), ``all``, or ``none``.
- At load, before ONNX Runtime sees the file, onnx's shape inference (with data propagation, so a shape held in an
  initializer or computed by Shape/Concat/Gather is known) sizes every value the main graph computes; one whose
  shape is fully known and takes more than the bound refuses the load, naming it.  Initializers and ``Constant``
  values are not counted: their bytes are the file's own (the upload's size bounds them).
- A value computed from constants alone whose size inference cannot tell (a shape made by an op it does not
  propagate through) could be built by ONNX Runtime's constant folding at load, outside any bound:
  :func:`check_graph` then asks for the session without constant folding, so the value is computed per request
  and bounded there.
- At run time the ONNX backend refuses a run whose output passes the bound (per request: times the batch's rows),
  RESOURCE_EXHAUSTED, the arrays released (``OnnxBackend.run``); a bounded session runs without ORT's CPU memory
  arena, which would keep the largest tensor a request made it build for the session's life.
- Subgraphs (``If``/``Loop``/``Scan`` bodies) and dims that follow the data (a batch, a shape the request
  carries) are not sized at load: the run-time bound covers what they produce as outputs, not their intermediates.
- A graph that onnx cannot read or infer is left to ONNX Runtime (which reports why it cannot load it), without
  constant folding, under the run-time bound.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument

log = logging.getLogger("fastoip.onnx")

#: Bytes an element of a STRING tensor is counted as (a Python object's pointer and a small payload).
STRING_ELEMENT_BYTES = 64
#: ``onnx_max_tensor_bytes_for`` values.
BOUND_FOR = ("uploaded", "all", "none")


@dataclass(frozen=True)
class GraphCheck:
    """What :func:`check_graph` found: the session must be made without ORT's constant folding."""

    no_constant_folding: bool


def check_graph(model_name: str, path: Path, limit: int) -> GraphCheck:
    """Refuse (InvalidArgument) a graph that computes a tensor of known size over ``limit`` bytes."""
    import onnx  # lazily: heavy, and only loads that are bounded need it

    try:
        # external data stays on disk: only the graph and its inline tensors are read
        model = onnx.load(str(path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises several unrelated types; ORT then says whether the file loads
        log.warning("model '%s': onnx could not size the graph's tensors (%s); it runs without constant folding, "
                    "its outputs bounded at %d bytes", model_name, exc, limit)
        return GraphCheck(no_constant_folding=True)
    graph = inferred.graph
    types: dict[str, Any] = {}
    for info in [*graph.value_info, *graph.output]:
        types[info.name] = info.type
    constants = {tensor.name for tensor in graph.initializer}
    unsized_constant = False
    for node in graph.node:
        inputs = [name for name in node.input if name]
        from_constants = node.op_type == "Constant" or (bool(inputs) and all(name in constants for name in inputs))
        for output in node.output:
            if not output:
                continue
            if node.op_type != "Constant":
                size = tensor_bytes(types.get(output))
                if size is not None and size > limit:
                    raise InvalidArgument(
                        f"model '{model_name}': the graph computes '{output}' ({node.op_type}) of {size} bytes, more "
                        f"than the {limit} bytes one tensor may take on this server (--onnx-max-tensor-bytes)"
                    )
                if size is None and from_constants:
                    unsized_constant = True
            if from_constants:
                constants.add(output)
    return GraphCheck(no_constant_folding=unsized_constant)


def tensor_bytes(value_type: Any) -> int | None:
    """The bytes of a tensor type whose shape is fully known, else None (a symbolic or missing dim)."""
    if value_type is None or value_type.WhichOneof("value") != "tensor_type":
        return None
    tensor = value_type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims = []
    for dim in tensor.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None
        dims.append(dim.dim_value)
    return math.prod(dims) * _element_bytes(tensor.elem_type)


def _element_bytes(elem_type: int) -> int:
    import onnx

    if elem_type == onnx.TensorProto.STRING:
        return STRING_ELEMENT_BYTES
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except Exception:  # an element type numpy has no dtype for (e.g. 4-bit): count a byte
        return 1

"""The built-in demo model repository, built with the onnx helper API.

``fastoip serve`` with no ``--model-repository`` writes this repository into a
cache folder once and serves it.  Models:

- ``simple``: Triton's classic. INPUT0, INPUT1 INT32 [-1,16] -> OUTPUT0 = sum,
  OUTPUT1 = difference.
- ``identity_fp32``: INPUT0 FP32 [-1,16] -> OUTPUT0.
- ``image_identity``: INPUT0 FP32 [-1,3,224,224] -> OUTPUT0 (602,112 bytes an item).
- ``string_identity``: INPUT0 BYTES [-1,-1] -> OUTPUT0 (an ONNX string identity).
- ``mlp``: INPUT0 FP32 [-1,256] -> Gemm 1024 -> Relu -> Gemm 1024 -> Relu ->
  Gemm 10 -> OUTPUT0, weights from numpy's default_rng(0); served with the
  dynamic batcher.

Model bytes are deterministic, so the same version of fastoip always serves
the same models; the graphs and weights are the same as those of the peers lab
that ``benchmarks/`` uses (only the producer name differs).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # onnx is imported where a model is built: `import fastoip.demo` stays cheap
    from onnx import GraphProto, ModelProto, ValueInfoProto

OPSET = 13
IR_VERSION = 8  # loadable by any onnxruntime >= 1.10

#: config.pbtxt written next to each model; models not listed are auto-completed.
CONFIGS: dict[str, str] = {
    "simple": 'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n',
    "mlp": (
        'name: "mlp"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
        "dynamic_batching {\n  max_queue_delay_microseconds: 0\n}\n"
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    ),
}


def _model(graph: GraphProto) -> ModelProto:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.producer_name = "fastoip-demo"
    model.producer_version = "1"
    return model


def build_simple() -> ModelProto:
    """INPUT0 + INPUT1 and INPUT0 - INPUT1 on INT32 [batch, 16]."""
    from onnx import TensorProto, helper

    def tensor(name: str) -> ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16])

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes, "simple", [tensor("INPUT0"), tensor("INPUT1")], [tensor("OUTPUT0"), tensor("OUTPUT1")]
    )
    return _model(graph)


def build_identity(name: str, elem_type: int, dims: list[int | str]) -> ModelProto:
    """An Identity model INPUT0 -> OUTPUT0 with a leading batch dim."""
    from onnx import helper

    inp = helper.make_tensor_value_info("INPUT0", elem_type, ["batch", *dims])
    out = helper.make_tensor_value_info("OUTPUT0", elem_type, ["batch", *dims])
    node = helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")
    return _model(helper.make_graph([node], name, [inp], [out]))


def build_mlp() -> ModelProto:
    """A 256 -> 1024 -> 1024 -> 10 ReLU MLP with fixed weights (seed 0)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    layers = [(256, 1024), (1024, 1024), (1024, 10)]
    initializers, nodes = [], []
    current = "INPUT0"
    for index, (fan_in, fan_out) in enumerate(layers):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (rng.standard_normal((fan_out,)) * 0.01).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"W{index}"),
            numpy_helper.from_array(bias, f"B{index}"),
        ]
        last = index == len(layers) - 1
        gemm_out = "OUTPUT0" if last else f"g{index}"
        nodes.append(helper.make_node("Gemm", [current, f"W{index}", f"B{index}"], [gemm_out], name=f"gemm{index}"))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"h{index}"], name=f"relu{index}"))
            current = f"h{index}"
    inp = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 256])
    out = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])
    return _model(helper.make_graph(nodes, "mlp", [inp], [out], initializer=initializers))


def build_all() -> dict[str, bytes]:
    """Every demo model as serialized ONNX bytes, by model name."""
    from onnx import TensorProto, checker

    models = {
        "simple": build_simple(),
        "identity_fp32": build_identity("identity_fp32", TensorProto.FLOAT, [16]),
        "image_identity": build_identity("image_identity", TensorProto.FLOAT, [3, 224, 224]),
        "string_identity": build_identity("string_identity", TensorProto.STRING, ["n"]),
        "mlp": build_mlp(),
    }
    for model in models.values():
        checker.check_model(model)
    return {name: model.SerializeToString() for name, model in models.items()}


def write_repository(root: Path, names: list[str] | None = None) -> Path:
    """Write the demo models (all, or ``names``) as a Triton-style repository under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, data in build_all().items():
        if names is not None and name not in names:
            continue
        version_dir = root / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        (version_dir / "model.onnx").write_bytes(data)
        if name in CONFIGS:
            (root / name / "config.pbtxt").write_text(CONFIGS[name])
    return root


def default_repository() -> Path:
    """The demo repository in a per-user cache folder, written on first use."""
    from . import __version__

    cache = Path(os.environ.get("FASTOIP_CACHE", Path(tempfile.gettempdir()) / f"fastoip-{os.getuid()}"))
    tag = hashlib.sha256(("".join(sorted(CONFIGS.values())) + __version__).encode()).hexdigest()[:12]
    root = cache / f"demo-repository-{tag}"
    marker = root / ".complete"
    if not marker.exists():
        staging = Path(tempfile.mkdtemp(prefix="demo-", dir=cache if cache.exists() else None))
        write_repository(staging)
        (staging / ".complete").write_text("ok\n")
        cache.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(root)
        except OSError:  # another process won the race: use its copy
            pass
    return root

"""Responses: decode them, check their shapes, compare demo-model outputs with references.

Under load a response is only checked by its length (see :class:`ResponseCheck`);
this module does the full check once per distinct request before the load
starts, and again for any response whose length was never seen.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..datatypes import NUMPY_DTYPES

#: Demo models whose outputs ``--verify`` can compute (fastoip's built-in repository).
KNOWN_MODELS = ("simple", "identity_fp32", "image_identity", "string_identity", "mlp")


@dataclass
class Output:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | None


# --------------------------------------------------------------------------- decoding
def decode_grpc(data: bytes, elsewhere: frozenset = frozenset()) -> list[Output]:
    """A ModelInferResponse's outputs (codec when built, protobuf otherwise).

    ``elsewhere`` (outputs written into shared memory): decoded with protobuf,
    which takes an empty raw entry as "no data here" (the codec rejects an
    empty entry unless the response tensor names its region).
    """
    if elsewhere:
        return _decode_grpc_protobuf(data)
    try:
        from .. import _codec
    except ImportError:
        return _decode_grpc_protobuf(data)
    response = _codec.decode_infer_response(data)
    return [Output(o.name, o.datatype, list(o.shape), o.data) for o in response.outputs]


def _array(datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    if datatype == "BYTES":
        from .inputs import _from_bytes_framing

        items = _from_bytes_framing(raw)
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array.reshape(shape)
    return np.frombuffer(raw, dtype=NUMPY_DTYPES[datatype]).reshape(shape)


def _decode_grpc_protobuf(data: bytes) -> list[Output]:
    from .._proto import grpc_service_pb2 as pb

    message = pb.ModelInferResponse.FromString(data)
    outputs = []
    for index, item in enumerate(message.outputs):
        shape = [int(d) for d in item.shape]
        raw = message.raw_output_contents[index] if index < len(message.raw_output_contents) else None
        if raw is not None and not raw and all(d != 0 for d in shape):
            raw = None  # an empty entry for a non-empty tensor: the data went to shared memory
        outputs.append(
            Output(item.name, item.datatype, shape, None if raw is None else _array(item.datatype, shape, raw))
        )
    return outputs


def decode_stream_frame(data: bytes) -> tuple[str, bytes | None]:
    """A ModelStreamInferResponse -> (error_message, ModelInferResponse bytes or None)."""
    from .._proto import grpc_service_pb2 as pb

    message = pb.ModelStreamInferResponse.FromString(data)
    inner = message.infer_response.SerializeToString() if message.HasField("infer_response") else None
    return message.error_message, inner


def decode_http(body: bytes, header_length: int | None) -> list[Output]:
    """A V2 infer response body: plain JSON, or JSON header + binary outputs."""
    head = body[:header_length] if header_length is not None else body
    document = json.loads(head)
    offset = header_length or 0
    outputs = []
    for item in document.get("outputs", []):
        shape = [int(d) for d in item.get("shape", [])]
        datatype = item.get("datatype", "")
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            data = _array(datatype, shape, body[offset : offset + int(size)])
            offset += int(size)
        elif "data" in item:
            values = item["data"]
            if datatype == "BYTES":
                flat = np.empty(len(values), dtype=object)
                flat[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
                data = flat.reshape(shape)
            elif datatype == "BF16":
                data = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").reshape(shape)
            else:
                data = np.asarray(values, dtype=NUMPY_DTYPES.get(datatype, np.float64)).reshape(shape)
        else:
            data = None
        outputs.append(Output(item.get("name", ""), datatype, shape, data))
    return outputs


# --------------------------------------------------------------------------- checks
def check_shapes(expected: list[Any], outputs: list[Output], elsewhere: frozenset = frozenset()) -> list[str]:
    """Problems with the outputs against the plan's outputs (TensorPlan-like: name, datatype, shape).

    ``elsewhere``: outputs written into shared memory, which carry no data in the response.
    """
    problems = []
    by_name = {o.name: o for o in outputs}
    for want in expected:
        got = by_name.get(want.name)
        if got is None:
            problems.append(f"output '{want.name}' missing")
            continue
        if want.datatype and got.datatype != want.datatype:
            problems.append(f"output '{want.name}' datatype {got.datatype}, expected {want.datatype}")
        same_rank = len(got.shape) == len(want.shape)
        if not same_rank or any(w >= 0 and w != g for w, g in zip(want.shape, got.shape, strict=True)):
            problems.append(f"output '{want.name}' shape {got.shape}, expected {want.shape}")
        if got.data is None and want.name not in elsewhere:
            problems.append(f"output '{want.name}' carries no data")
    return problems


def _mlp_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    from onnx import numpy_helper

    from ..demo import build_mlp

    model = build_mlp()
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [(init[f"W{i}"], init[f"B{i}"]) for i in range(3)]


def _mlp(x: np.ndarray) -> np.ndarray:
    layers = _mlp_weights()
    h = x.astype(np.float32)
    for index, (w, b) in enumerate(layers):
        h = h @ w + b
        if index < len(layers) - 1:
            h = np.maximum(h, 0)
    return h


REFERENCES: dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {
    "simple": lambda t: {"OUTPUT0": t["INPUT0"] + t["INPUT1"], "OUTPUT1": t["INPUT0"] - t["INPUT1"]},
    "identity_fp32": lambda t: {"OUTPUT0": t["INPUT0"]},
    "image_identity": lambda t: {"OUTPUT0": t["INPUT0"]},
    "string_identity": lambda t: {"OUTPUT0": t["INPUT0"]},
    "mlp": lambda t: {"OUTPUT0": _mlp(t["INPUT0"])},
}


def check_values(model: str, tensors: dict[str, np.ndarray], outputs: list[Output]) -> list[str] | None:
    """Compare with the demo model's reference; None when ``model`` has no reference."""
    reference = REFERENCES.get(model)
    if reference is None:
        return None
    try:
        expected = reference(tensors)
    except (KeyError, ValueError, TypeError) as exc:
        return [f"reference for '{model}' does not apply to these inputs: {exc!r}"]
    problems = []
    by_name = {o.name: o for o in outputs}
    for name, want in expected.items():
        got = by_name.get(name)
        if got is None or got.data is None:
            problems.append(f"output '{name}' missing")
            continue
        if got.data.shape != want.shape:
            problems.append(f"output '{name}' shape {list(got.data.shape)}, expected {list(want.shape)}")
        elif want.dtype == object:
            if list(got.data.ravel()) != list(want.ravel()):
                problems.append(f"output '{name}' differs from the reference")
        elif want.dtype.kind == "f":
            if not np.allclose(got.data, want, rtol=1e-3, atol=1e-4):
                problems.append(
                    f"output '{name}' differs from the reference (max abs diff {np.max(np.abs(got.data - want)):.3g})"
                )
        elif not np.array_equal(got.data, want):
            problems.append(f"output '{name}' differs from the reference")
    return problems


class ResponseCheck:
    """The cheap per-response check under load: the reply's length was seen and validated.

    A length never seen before gets the full decode + shape check once; a
    valid one joins the known set (at most ``limit`` lengths are kept).
    Picklable, so worker processes get their own copy.
    """

    def __init__(
        self, protocol: str, lengths: set[int], expected: list[Any], limit: int = 64, elsewhere: frozenset = frozenset()
    ) -> None:
        self.protocol = protocol
        self.lengths = set(lengths)
        self.expected = expected
        self.limit = limit
        #: Outputs that live in shared memory (no data in the response).
        self.elsewhere = frozenset(elsewhere)

    def slow_ok(self, data: bytes, header_length: int | None = None) -> bool:
        try:
            if self.protocol == "grpc":
                outputs = decode_grpc(data, self.elsewhere)
            elif self.protocol == "grpc-stream":
                message, inner = decode_stream_frame(data)
                if message or inner is None:
                    return False
                outputs = decode_grpc(inner, self.elsewhere)
            else:
                outputs = decode_http(data, header_length)
        except Exception:  # noqa: BLE001 - any decode failure is a bad response
            return False
        if check_shapes(self.expected, outputs, self.elsewhere):
            return False
        if len(self.lengths) < self.limit:
            self.lengths.add(len(data))
        return True

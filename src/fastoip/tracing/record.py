"""One traced request: its identity, Triton's timestamps, its tensors, and the caller's trace context.

Timestamps use Triton's names (REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END, and the
frontend's GRPC_* / HTTP_* ones) on the monotonic clock, in nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Bytes of tensor data one TENSORS trace records, all its tensors together (issue 37: a 602 KB request's trace
#: kept 0.36 MB of text, input and output each; Triton writes every element).  A tensor past it is cut at an
#: element (or left empty) and its entry says ``"truncated": true``.
TRACE_TENSOR_BYTES = 256 * 1024


@dataclass
class TraceRecord:
    """What a trace writer gets for one request."""

    trace_id: int
    model_name: str
    model_version: str
    request_id: str
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    #: (activity, name, datatype, shape, data) for TENSORS traces.
    tensors: list[tuple[str, str, str, tuple[int, ...], np.ndarray | None]] = field(default_factory=list)
    #: W3C trace context from the caller (``traceparent``, ``tracestate``), if it sent one.
    carrier: dict[str, str] = field(default_factory=dict)
    parent_id: int | None = None

    def stamp(self, name: str, ns: int) -> None:
        self.timestamps.append((name, ns))

    def triton_entries(self) -> list[dict[str, Any]]:
        """The entries of Triton's trace file format for this request (a TENSORS-only trace has no head entry:
        Triton writes it with the REQUEST_START timestamp)."""
        entries: list[dict[str, Any]] = []
        head: dict[str, Any] = {
            "id": self.trace_id,
            "model_name": self.model_name,
            "model_version": int(self.model_version) if self.model_version.isdigit() else self.model_version,
        }
        if self.request_id:  # Triton writes request_id and parent_id only when there is one
            head["request_id"] = self.request_id
        if self.parent_id is not None:
            head["parent_id"] = self.parent_id
        if self.timestamps:
            entries.append(head)
        entries += [{"id": self.trace_id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self.timestamps]
        left = TRACE_TENSOR_BYTES
        for activity, name, datatype, shape, data in self.tensors:
            text, used, truncated = _tensor_text(datatype, data, left)
            left -= used
            tensor: dict[str, Any] = {
                "name": name,
                "data": text,
                "shape": ",".join(str(d) for d in shape),
                "dtype": datatype,
            }
            if truncated:
                tensor["truncated"] = True
            entries.append({"id": self.trace_id, "activity": activity, "tensor": tensor})
        return entries


def _tensor_text(datatype: str, data: np.ndarray | None, budget: int) -> tuple[str, int, bool]:
    """(text, data bytes it took, whether elements were left out) for at most ``budget`` bytes of elements, as
    Triton's tracer prints them: C++ stream formatting (``%g`` for floats), BOOL as 0/1, BYTES quoted (an element
    costs its length), FP16/BF16 left empty (Triton writes no data for them)."""
    if data is None or datatype in ("FP16", "BF16"):
        return "", 0, False
    flat = data.reshape(-1)
    if datatype == "BYTES":
        items: list[str] = []
        used = 0
        for element in flat:
            raw = element if isinstance(element, bytes) else str(element).encode()
            if used + len(raw) > budget:
                break
            used += len(raw)
            items.append('"' + raw.decode("utf-8", "backslashreplace") + '"')
        return ",".join(items), used, len(items) < flat.size
    size = flat.dtype.itemsize or 1
    count = min(flat.size, max(budget, 0) // size)
    kept = flat[:count].tolist()
    if datatype in ("FP32", "FP64"):
        text = ",".join(map("%g".__mod__, kept))
    elif datatype == "BOOL":
        text = ",".join("1" if v else "0" for v in kept)
    else:
        text = ",".join(map(str, kept))
    return text, count * size, count < flat.size

"""The classification extension: an output returned as its top-N classes instead of its values.

Rules (Triton's ``extension_classification.md`` and its server's implementation):
- A requested output's ``classification`` parameter N (gRPC ``int64_param``,
  HTTP ``"parameters": {"classification": N}``) turns it into a BYTES tensor
  ``[batch, min(N, classes)]`` for a model that batches, else ``[min(N, classes)]``,
  where ``classes`` is the element count of one batch row.
- Each element is ``"<value>:<index>"``, or ``"<value>:<index>:<label>"`` when
  the output's ``label_filename`` has a non-empty line ``index``; highest value
  first, ties in index order.  Values print as C++ ``std::to_string`` does
  (``%f`` for floats, plain integers otherwise).
- Integer and FP32/FP64 outputs classify; FP16, BF16, BOOL and BYTES are refused
  with Triton's "class result not available" message, at request validation.
- An output cannot be both classified and written to shared memory.
- Labels are read once at load from ``label_filename`` inside the model directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .errors import InvalidArgument
from .types import InferOutput, InferRequest, InferResponse, RequestedOutput

PARAMETER = "classification"
#: Triton's bound on the elements one classification may sort.
MAX_CLASSIFICATION_ELEMENTS = 1_000_000
#: V2 datatypes Triton classifies (the ones its TopkClassifications has a case for).
CLASSIFIABLE = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
)
#: The shared-memory parameter an output with classification may not carry.
REGION = "shared_memory_region"


def class_count(wanted: RequestedOutput, datatype: str) -> int:
    """The number of classes ``wanted`` asks for (0: none); InvalidArgument for a value Triton refuses."""
    value = wanted.parameters.get(PARAMETER)
    if value is None:
        return 0
    if type(value) is bool or not isinstance(value, int):
        raise InvalidArgument(
            f"invalid value type for 'classification' parameter, expected int64_param "
            f"(output '{wanted.name}' got {value!r})"
        )
    if value < 0:
        raise InvalidArgument(
            f"invalid value for 'classification' parameter, expected >= 0 (output '{wanted.name}' got {value})"
        )
    if value and REGION in wanted.parameters:
        raise InvalidArgument(
            f"output can't set both 'shared_memory_region' and 'classification' (output '{wanted.name}')"
        )
    if value and datatype not in CLASSIFIABLE:
        raise InvalidArgument(
            f"class result not available for output due to unsupported type '{datatype}' (output '{wanted.name}')"
        )
    return int(value)


def read_labels(model_dir: Path, label_filename: str, output: str) -> list[str]:
    """The lines of an output's label file; the path must stay inside the model directory."""
    relative = Path(label_filename)
    if relative.is_absolute() or ".." in relative.parts:
        raise InvalidArgument(
            f"output '{output}': label_filename '{label_filename}' must be a file inside the model directory"
        )
    path = model_dir / relative
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidArgument(
            f"output '{output}': cannot read label_filename '{label_filename}': {reason}"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the newline that ends the last line starts no label
        lines.pop()
    return lines


def top_classes(values: np.ndarray, count: int, labels: Sequence[str]) -> list[bytes]:
    """One row's ``count`` highest values as ``value:index[:label]`` strings, highest first."""
    flat = values.reshape(-1)
    if flat.size > MAX_CLASSIFICATION_ELEMENTS:
        raise InvalidArgument(
            f"classification output tensor too large ({flat.size} elements, at most {MAX_CLASSIFICATION_ELEMENTS})"
        )
    size = flat.size
    # Descending with ties in ascending index order: a stable ascending sort of the reversed row, reversed.
    order = size - 1 - np.argsort(flat[::-1], kind="stable")[::-1]
    floating = flat.dtype.kind == "f"
    result = []
    for index in order[:count].tolist():
        value = flat[index]
        text = f"{float(value):f}:{index}" if floating else f"{int(value)}:{index}"
        if index < len(labels) and labels[index]:
            text += f":{labels[index]}"
        result.append(text.encode("utf-8"))
    return result


def classify(data: np.ndarray, count: int, labels: Sequence[str], batched: bool) -> np.ndarray:
    """The classification tensor (object array of bytes) for one output of one response."""
    if batched and data.ndim > 0:
        rows = [data[row] for row in range(data.shape[0])]
    else:
        rows = [data]
    per_row = min(count, int(np.prod(data.shape[1:] if batched and data.ndim > 0 else data.shape)))
    out = np.empty((len(rows), per_row), dtype=object)
    for row_index, row in enumerate(rows):
        out[row_index, :] = top_classes(row, count, labels)
    return out if batched and data.ndim > 0 else out.reshape(per_row)


def apply_classification(
    request: InferRequest,
    response: InferResponse,
    labels: Mapping[str, Sequence[str]],
    batched: bool,
) -> None:
    """Replace each output the request asked to classify by its classes (in place).

    The request was validated (``class_count``) before it ran; outputs without
    the parameter, and outputs already written to shared memory, are left alone.
    """
    counts = {
        wanted.name: int(wanted.parameters[PARAMETER])  # type: ignore[arg-type]  # validated by class_count
        for wanted in request.outputs
        if wanted.parameters.get(PARAMETER)
    }
    if not counts:
        return
    for index, output in enumerate(response.outputs):
        count = counts.get(output.name, 0)
        if not count or output.data is None:
            continue
        classes = classify(output.data, count, labels.get(output.name, ()), batched)
        response.outputs[index] = InferOutput(output.name, "BYTES", classes.shape, classes, output.parameters)

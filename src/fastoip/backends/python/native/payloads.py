"""A Python model's payloads: requests decoded to what ``predict`` takes, its return value encoded to responses.

The content types of the request and of each input decide what ``predict``
gets, and outputs carry their content type back (see
:mod:`fastoip.content_types`); outputs are cast and fitted to the declared
datatype and rank.  Jobs merged into one ``predict`` call are split back per job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....content_types import (
    ModelContentTypes,
    Tensor,
    decode_request,
    encode_output,
    split_response,
)
from ....datatypes import NUMPY_DTYPES, bf16_bits_from_float32
from ....errors import InternalError
from ....model_config import ModelSpec, TensorSpec
from ....scheduling.execute import check_rows, merge_inputs, row_slices
from ....types import InferOutput, InferResponse

if TYPE_CHECKING:
    from ....scheduling.job import Job

#: Request parameters that only steer the scheduler: requests that differ only in these batch together.
SCHEDULER_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end"})


class PayloadCodec:
    """Decodes jobs for one model's ``predict`` and encodes what it returns."""

    def __init__(self, name: str, version_str: str, spec: ModelSpec, defaults: ModelContentTypes) -> None:
        self.name = name
        self.version_str = version_str
        self.spec = spec
        self.defaults = defaults
        #: The declared output names, in order.
        self.declared = [t.name for t in spec.outputs]

    def decode(self, group: list[Job]) -> tuple[Any, dict]:
        request = group[0].request
        # Several requests: their rows in one array (new arrays, not pooled: the model may keep them).
        feeds = group[0].feeds if len(group) == 1 else merge_inputs(group)[0]
        tensors = []
        for tensor in request.inputs:
            data = feeds[tensor.name]
            tensors.append(Tensor(tensor.name, tensor.datatype, tuple(data.shape), data, tensor.parameters))
        content_type = request.parameters.get("content_type")
        payload = decode_request(tensors, content_type if isinstance(content_type, str) else None, self.defaults)
        return payload, dict(request.parameters)

    def encode(self, value: Any, group: list[Job]) -> list[InferResponse]:
        first = group[0]
        spec = self.spec
        declared = self.declared
        response_parameters: dict[str, Any] = {}
        split = split_response(value)
        if split is not None:
            parts, content_type = split
            response_parameters["content_type"] = content_type
        elif isinstance(value, dict):
            parts = value
        elif isinstance(value, tuple):
            if len(value) != len(declared):
                raise InternalError(
                    f"model '{self.name}': predict returned {len(value)} values but the model has "
                    f"{len(declared)} outputs ({', '.join(declared)})"
                )
            parts = dict(zip(declared, value, strict=True))
        elif len(declared) == 1:
            parts = {declared[0]: value}
        elif not declared:
            parts = {"output-1": value}
        else:
            raise InternalError(
                f"model '{self.name}': predict returned one {type(value).__name__} but the model has outputs "
                f"{', '.join(declared)}: return a dict {{output name: value}}"
            )
        if declared:
            for name in parts:
                if name not in spec.output_by_name:
                    raise InternalError(
                        f"model '{self.name}': predict returned output '{name}', which the model does not "
                        f"declare (outputs: {', '.join(declared)})"
                    )
        wanted = first.output_names or list(parts)
        requested: dict[str, str] = {
            o.name: asked
            for o in first.request.outputs
            if isinstance(asked := o.parameters.get("content_type"), str) and asked
        }
        encoded = []
        for name in wanted:
            if name not in parts:
                raise InternalError(f"model '{self.name}': predict did not return output '{name}'")
            output_type = requested.get(name) or self.defaults.outputs.get(name)
            tensor = encode_output(name, parts[name], output_type, from_request=name in requested)
            datatype, data = self._conform(tensor, spec.output_by_name.get(name))
            encoded.append((name, datatype, data, tensor.parameters))

        if len(group) == 1:
            return [self._response(first, encoded, response_parameters)]
        total = sum(job.batch_size for job in group)
        for name, _, data, _ in encoded:
            check_rows(self.name, name, data, total)
        return [
            self._response(
                job,
                [(name, datatype, data[rows], params) for name, datatype, data, params in encoded],
                response_parameters,
            )
            for job, rows in zip(group, row_slices(group), strict=True)
        ]

    def empty_response(self, job: Job) -> InferResponse:
        """A response with no outputs (a decoupled model that produced nothing, for a caller that needs one)."""
        return self._response(job, [], {})

    def _response(self, job: Job, outputs: list, parameters: dict) -> InferResponse:
        request = job.request
        return InferResponse(
            request.model_name,
            self.version_str,
            request.id,
            dict(parameters),
            [InferOutput(name, datatype, data.shape, data, dict(params)) for name, datatype, data, params in outputs],
        )

    def _conform(self, tensor: Tensor, spec: TensorSpec | None) -> tuple[str, np.ndarray]:
        """The output as the config declares it: datatype cast within its kind, rank fitted."""
        data, datatype = tensor.data, tensor.datatype
        if spec is not None:
            if datatype != spec.datatype:
                if "BYTES" in (datatype, spec.datatype):
                    raise InternalError(
                        f"model '{self.name}': output '{tensor.name}' is {datatype} data but the model "
                        f"declares {spec.datatype}"
                    )
                if spec.datatype == "BF16":
                    data = bf16_bits_from_float32(data.astype(np.float32))
                else:
                    target = NUMPY_DTYPES[spec.datatype]
                    if not np.can_cast(data.dtype, target, "same_kind"):
                        raise InternalError(
                            f"model '{self.name}': output '{tensor.name}' is {datatype} data, which does not "
                            f"cast to the declared {spec.datatype}"
                        )
                    data = data.astype(target)
                datatype = spec.datatype
            data = _fit_rank(data, spec.shape)
        if data.dtype != object:
            data = np.ascontiguousarray(data)
        return datatype, data


def _fit_rank(data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Add or drop one trailing dimension of 1 when that is all that separates ``data`` from ``shape``."""
    if data.ndim == len(shape):
        return data
    if data.ndim + 1 == len(shape) and shape[-1] in (1, -1):
        return data.reshape(data.shape + (1,))
    if data.ndim == len(shape) + 1 and data.shape[-1] == 1:
        return data.reshape(data.shape[:-1])
    return data


def batch_key(job: Job) -> tuple:
    request = job.request
    return (
        tuple(sorted((k, v) for k, v in request.parameters.items() if k not in SCHEDULER_PARAMETERS)),
        tuple((t.name, t.parameters.get("content_type")) for t in request.inputs),
        tuple((o.name, o.parameters.get("content_type")) for o in request.outputs),
    )

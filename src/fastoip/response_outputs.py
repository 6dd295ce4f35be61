"""What the config and the request make of a backend's outputs, per request, before they leave the Core.

Rules:
- Outputs of a model whose config has ``reshape`` go back to the config's dims.
- Then outputs the request asked to classify become their top classes
  (:mod:`fastoip.classification`).
- Runs after the backend and before any shared-memory write; outputs already in
  a region (data None) are left alone.
"""

from __future__ import annotations

from .classification import apply_classification
from .errors import InternalError
from .model_config import ModelSpec
from .types import InferRequest, InferResponse


def finish_outputs(spec: ModelSpec, request: InferRequest, response: InferResponse) -> None:
    """Reshape back and classify ``response``'s outputs in place."""
    if spec.reshaped:
        for output in response.outputs:
            if output.data is not None:
                try:
                    output.data = spec.client_output(output.name, output.data)
                except ValueError as exc:  # the model made a shape its config's reshape does not describe
                    raise InternalError(f"output '{output.name}' does not fit the config's reshape: {exc}") from None
                output.shape = output.data.shape
    if request.outputs:
        apply_classification(request, response, spec.labels, spec.batching)

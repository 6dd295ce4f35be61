"""Triton's LLM tensor contract (the vLLM and TensorRT-LLM Python models, Triton's ``mock_llm``): one generation
request as tensors, and what each response carries.

Rules (Triton's ``python/openai/openai_frontend/engine/utils/triton.py`` and vLLM's Triton model):
- In: ``text_input`` (BYTES, the prompt; required), and, each only when the model declares it: ``stream`` (BOOL),
  ``exclude_input_in_output`` (BOOL, always true: echo is the translator's job, so every model echoes alike),
  ``sampling_parameters`` (BYTES, vLLM's sampling parameters as JSON), ``return_num_input_tokens`` and
  ``return_num_output_tokens`` (BOOL, true), ``return_logprobs`` (BOOL), TensorRT-LLM's ``max_tokens`` (INT32).
  Every tensor is one element, shaped as the model declares it (each dimension 1).
- The sampling parameters also travel as request parameters (scalars only; ``stop`` as a JSON string), so a
  ``fastoip.Model`` generator reads them from ``parameters`` without declaring a tensor; so does a chat's
  ``tool_choice`` (not in ``sampling_parameters``: vLLM's SamplingParams would refuse an unknown member).
- Out, per response (only these are asked for, so a model's other outputs are not computed): ``text_output``
  (BYTES; a stream's responses are deltas), and optionally
  ``num_input_tokens`` (the prompt's tokens, the same on every response) and ``num_output_tokens`` (this
  response's tokens); ``logprobs`` (FP32, one per token of this response) when the model gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ...errors import InternalError, InvalidArgument
from ...types import InferInput, InferRequest, InferResponse, ParameterValue, RequestedOutput

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
#: A model input's datatype and shape, as its metadata gives them (-1: variable).
Declared = dict[str, tuple[str, tuple[int, ...]]]


@dataclass(slots=True)
class Piece:
    """What one response of a generation carries."""

    text: str
    input_tokens: int | None
    output_tokens: int | None
    logprobs: list[float] | None


def is_generator(declared: Declared) -> bool:
    return declared.get(TEXT_INPUT, ("",))[0] == "BYTES"


def _one(name: str, datatype: str, shape: tuple[int, ...], value: Any) -> InferInput:
    dims = tuple(1 for _ in shape) or (1,)
    dtype = object if datatype == "BYTES" else {"BOOL": np.bool_, "INT32": np.int32}[datatype]
    return InferInput(name, datatype, dims, np.array([value], dtype=dtype).reshape(dims))


def generation_request(
    model: str, declared: Declared, outputs: list[str], prompt: str, stream: bool, sampling: dict[str, Any],
    request_id: str, extra: dict[str, str] | None = None,
) -> InferRequest:
    """The tensors of one generation under the contract above; 400 when the model does not take ``text_input``."""
    if not is_generator(declared):
        raise InvalidArgument(
            f"model '{model}' does not generate text: it has no BYTES input '{TEXT_INPUT}' (Triton's LLM contract)"
        )
    values: dict[str, Any] = {
        TEXT_INPUT: prompt.encode(),
        "stream": stream,
        "exclude_input_in_output": True,
        "sampling_parameters": orjson.dumps(sampling),
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "return_logprobs": sampling.get("logprobs") is not None,
        "max_tokens": sampling["max_tokens"],
    }
    inputs = []
    for name, value in values.items():
        if name in declared:
            datatype, shape = declared[name]
            if datatype not in ("BYTES", "BOOL", "INT32"):
                continue  # a tensor of another form is the model's own; leave it to its default
            inputs.append(_one(name, datatype, shape, value))
    parameters: dict[str, ParameterValue] = {
        key: (orjson.dumps(value).decode() if isinstance(value, list) else value) for key, value in sampling.items()
    }
    parameters["stream"] = stream
    parameters.update(extra or {})
    wanted = [TEXT_OUTPUT, "num_input_tokens", "num_output_tokens"]
    if sampling.get("logprobs") is not None:
        wanted.append("logprobs")
    requested = [RequestedOutput(name) for name in wanted if name in outputs]
    return InferRequest(model, "", request_id, parameters, inputs, requested)


def read_piece(model: str, response: InferResponse) -> Piece:
    """The text (and token counts) of one response; 500 when it has no ``text_output``."""
    text = None
    input_tokens = output_tokens = None
    logprobs = None
    for output in response.outputs:
        data = output.data
        if data is None:
            continue
        if output.name == TEXT_OUTPUT:
            text = "".join(
                (item if isinstance(item, bytes) else str(item).encode()).decode("utf-8", "replace")
                for item in data.reshape(-1)
            )
        elif output.name == "num_input_tokens" and data.size:
            input_tokens = int(data.reshape(-1)[0])
        elif output.name == "num_output_tokens" and data.size:
            output_tokens = int(data.reshape(-1)[0])
        elif output.name == "logprobs" and data.size:
            logprobs = [float(v) for v in data.reshape(-1)]
    if text is None:
        raise InternalError(f"model '{model}' answered without a '{TEXT_OUTPUT}' output (Triton's LLM contract)")
    return Piece(text, input_tokens, output_tokens, logprobs)

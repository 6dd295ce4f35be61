"""``/v1/embeddings`` as tensors: which models serve it, each request's inputs as one infer request, and the answer.

Rules:
- A **text model** takes a BYTES input and gives an FP32 output ``[n, d]`` (a Python model, an ensemble of a
  tokenizer step and an encoder): a request's texts go as one BYTES tensor ``[n]`` (``[n, 1]`` when the model
  declares an inner dimension), so the dynamic batcher merges requests as it merges any others.  Its usage
  counts whitespace-separated words, unless the model gives ``num_input_tokens``.
- An **encoder** declares its tokenizer and pooling in config.pbtxt parameters: ``tokenizer`` (``bytes``: each
  UTF-8 byte is a token, id = byte + 3, between ``[CLS]`` = 1 and ``[SEP]`` = 2, padding 0), ``pooling``
  (``mean`` over the attention mask, or ``cls``: the first position), ``normalize`` (``true`` by default: unit
  length) and ``max_sequence_length`` (longer inputs are cut, default 512).  It takes INT64 ``input_ids`` and
  ``attention_mask`` ``[n, L]`` and gives its hidden states ``[n, L, d]`` (pooled here) or ``[n, d]``.
  L is the request's longest input rounded up to a power of two (at least 8), so requests of similar lengths
  share a shape and the dynamic batcher merges them; token-id inputs are taken as they are, each id checked
  against the tokenizer's vocabulary (0 to 258) before the model sees it.
- ``dimensions``: the model's own width, or fewer where the model declares ``embedding_dimensions: "truncate"``
  (a Matryoshka model: the first ``dimensions`` values, normalised again); otherwise 400.
- ``encoding_format: base64``: each vector's little-endian float32 bytes in base64 (what OpenAI's SDK decodes).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import orjson

from ...errors import InternalError, InvalidArgument
from ...types import InferInput, InferRequest, InferResponse, RequestedOutput
from .errors import BadParameter
from .requests import EmbeddingRequest

CLS, SEP, PAD, BYTE_OFFSET = 1, 2, 0, 3
#: Token ids of the ``bytes`` tokenizer: the three special ones and 256 bytes.
VOCABULARY = BYTE_OFFSET + 256
MIN_LENGTH = 8
FLOAT_TYPES = ("FP32", "FP16", "FP64", "BF16")


@dataclass(frozen=True)
class EmbeddingModel:
    """How one model serves embeddings (read from its metadata and config parameters)."""

    name: str
    #: "text" or "encoder".
    kind: str
    text_input: str
    output: str
    #: The text model's input shape after the batch dimension (empty: ``[n]``).
    inner_dims: tuple[int, ...] = ()
    pooling: str = "mean"
    normalize: bool = True
    max_length: int = 512
    truncate: bool = False
    #: Most rows one infer request may carry (0: any).
    max_batch: int = 0


def embedding_model(
    name: str,
    inputs: dict[str, tuple[str, tuple[int, ...]]],
    outputs: dict[str, tuple[str, tuple[int, ...]]],
    parameters: dict[str, str],
    max_batch_size: int,
) -> EmbeddingModel:
    """How ``name`` serves embeddings; 400 when it cannot."""
    float_outputs = [n for n, (datatype, _) in outputs.items() if datatype in FLOAT_TYPES]
    truncate = parameters.get("embedding_dimensions", "") == "truncate"
    if parameters.get("tokenizer"):
        if parameters["tokenizer"] != "bytes":
            raise InvalidArgument(f"model '{name}' names tokenizer '{parameters['tokenizer']}'; this server has "
                                  "the 'bytes' tokenizer (serve other tokenizers as a Python step in an ensemble)")
        if "input_ids" not in inputs or not float_outputs:
            raise InvalidArgument(f"model '{name}' declares a tokenizer but has no 'input_ids' input or no "
                                  "floating-point output")
        pooling = parameters.get("pooling", "mean")
        if pooling not in ("mean", "cls"):
            raise InvalidArgument(f"model '{name}': pooling '{pooling}' is not 'mean' or 'cls'")
        length = parameters.get("max_sequence_length", "512")
        return EmbeddingModel(
            name, "encoder", "input_ids", float_outputs[0], (), pooling,
            parameters.get("normalize", "true").lower() != "false",
            int(length) if length.isdigit() and int(length) >= 3 else 512, truncate, max_batch_size,
        )
    text_inputs = [n for n, (datatype, _) in inputs.items() if datatype == "BYTES"]
    if len(inputs) != 1 or not text_inputs or not float_outputs:
        raise InvalidArgument(f"model '{name}' does not serve embeddings: it needs one BYTES input and a "
                              "floating-point output [n, d], or a declared tokenizer (parameters 'tokenizer', "
                              "'pooling')")
    shape = inputs[text_inputs[0]][1]
    batched = max_batch_size > 0
    inner = shape[1:] if batched or (shape and shape[0] == -1) else shape
    return EmbeddingModel(name, "text", text_inputs[0], float_outputs[0], tuple(1 for _ in inner),
                          truncate=truncate, max_batch=max_batch_size)


def byte_tokens(text: str, max_length: int) -> list[int]:
    # a character is at least one byte: cut the text before encoding, so a huge input costs what is kept
    ids = [b + BYTE_OFFSET for b in text[: max_length].encode()][: max_length - 2]
    return [CLS, *ids, SEP]


def _bucket(length: int, limit: int) -> int:
    size = MIN_LENGTH
    while size < length:
        size *= 2
    return max(min(size, limit), length)


def embedding_requests(spec: EmbeddingModel, request: EmbeddingRequest) -> tuple[list[InferRequest], int]:
    """The infer requests for ``request`` (split at the model's batch size) and the tokens counted so far."""
    rows = request.count
    step = spec.max_batch if spec.max_batch > 0 else rows
    out = []
    if spec.kind == "text":
        if request.texts is None:
            raise BadParameter("input", f"model '{spec.name}' takes text; token-id input needs a model with a "
                               "declared tokenizer")
        for start in range(0, rows, step):
            texts = request.texts[start:start + step]
            shape = (len(texts), *spec.inner_dims)
            data = np.array([t.encode() for t in texts], dtype=object).reshape(shape)
            out.append(InferRequest(spec.name, "", "", {}, [InferInput(spec.text_input, "BYTES", shape, data)],
                                    [RequestedOutput(spec.output)]))
        return out, sum(len(t.split()) for t in request.texts)
    if request.tokens is not None:
        for given in request.tokens:
            low, high = min(given), max(given)
            if low < 0 or high >= VOCABULARY:
                raise BadParameter("input", f"model '{spec.name}' takes token ids from 0 to {VOCABULARY - 1} (its "
                                   f"'bytes' tokenizer), got {low if low < 0 else high}")
    token_lists = (
        [byte_tokens(t, spec.max_length) for t in request.texts] if request.texts is not None
        else [ids[: spec.max_length] for ids in request.tokens or ()]
    )
    counted = 0
    for start in range(0, rows, step):
        group = token_lists[start:start + step]
        length = _bucket(max(len(ids) for ids in group), spec.max_length)
        ids = np.full((len(group), length), PAD, dtype=np.int64)
        mask = np.zeros((len(group), length), dtype=np.int64)
        for row, tokens in enumerate(group):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        counted += int(mask.sum())
        inputs = [InferInput("input_ids", "INT64", ids.shape, ids),
                  InferInput("attention_mask", "INT64", mask.shape, mask)]
        out.append(InferRequest(spec.name, "", "", {}, inputs, [RequestedOutput(spec.output)]))
    return out, counted


def vectors(spec: EmbeddingModel, request: InferRequest, response: InferResponse) -> np.ndarray:
    """The ``[rows, d]`` float32 vectors of one response, pooled and normalised as the model declares."""
    try:
        values = response.output(spec.output).data
    except KeyError:
        values = None
    if values is None:
        raise InternalError(f"model '{spec.name}' gave no '{spec.output}' output")
    values = np.asarray(values, dtype=np.float32)
    rows = request.inputs[0].shape[0]
    if spec.kind == "encoder" and values.ndim == 3:
        mask = request.inputs[1].data
        assert mask is not None
        if spec.pooling == "cls":
            values = values[:, 0, :]
        else:
            weights = mask[:, : values.shape[1], None].astype(np.float32)
            values = (values * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    values = values.reshape(rows, -1) if values.size else values.reshape(rows, 0)
    if spec.kind == "encoder" and spec.normalize:
        values = _unit(values)
    return values


def _unit(values: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    return values / np.maximum(norms, 1e-12)


def fit_dimensions(spec: EmbeddingModel, values: np.ndarray, dimensions: int | None) -> np.ndarray:
    width = values.shape[1]
    if dimensions is None or dimensions == width:
        return values
    if not spec.truncate or dimensions > width:
        allowed = f"at most {width}" if spec.truncate else f"only {width} (its vectors cannot be shortened)"
        raise BadParameter("dimensions", f"model '{spec.name}' gives {width} dimensions; 'dimensions' may be "
                           f"{allowed}, got {dimensions}")
    return _unit(values[:, :dimensions])


def embeddings_json(model: str, values: np.ndarray, as_base64: bool, prompt_tokens: int) -> bytes:
    values = np.ascontiguousarray(values, dtype="<f4")
    data = []
    for index, row in enumerate(values):
        vector: object = base64.b64encode(row.tobytes()).decode() if as_base64 else row
        data.append({"object": "embedding", "index": index, "embedding": vector})
    body = {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

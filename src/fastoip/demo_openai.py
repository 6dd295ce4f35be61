"""The OpenAI examples of the demo repository (``fastoip demo-repository --openai OUT``), built here, nothing
downloaded:

- ``tiny_embedder``: an ONNX encoder over bytes: ``input_ids``, ``attention_mask`` INT64 [batch, seq] ->
  ``last_hidden_state`` FP32 [batch, seq, 32] (a seeded byte embedding table, one tanh layer, masked);
  its config declares the ``bytes`` tokenizer, mean pooling and Matryoshka ``dimensions``, and batches
  dynamically, so ``/v1/embeddings`` requests share batches.
- ``tiny_chat``: a deterministic word generator with Triton's LLM tensor contract (decoupled: one response per
  word; up to 64 generations interleave on its one instance, ``max_concurrency``), a chat template in its
  folder, and a tool call when the prompt offers tools (of the function ``tool_choice`` forces, else the first).
  At temperature 0 its words follow from the prompt alone; otherwise from ``seed`` (random without one).

They are not in the default repository ``fastoip serve`` writes: the generator is a Python model, and each
Python model starts a worker process.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from onnx import ModelProto

EMBEDDER_WIDTH = 32
#: Byte ids 0..255 are offset by 3 (0 pad, 1 [CLS], 2 [SEP]): fastoip.wire.openai.embeddings' ``bytes`` tokenizer.
VOCABULARY = 259

EMBEDDER_CONFIG = """name: "tiny_embedder"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 32 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
parameters { key: "tokenizer" value: { string_value: "bytes" } }
parameters { key: "pooling" value: { string_value: "mean" } }
parameters { key: "max_sequence_length" value: { string_value: "256" } }
parameters { key: "embedding_dimensions" value: { string_value: "truncate" } }
"""

CHAT_CONFIG = """name: "tiny_chat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_logprobs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "logprobs" data_type: TYPE_FP32 dims: [ 1 ] }
]
parameters { key: "tool_call_parser" value: { string_value: "hermes" } }
parameters { key: "max_concurrency" value: { string_value: "64" } }
"""

CHAT_TEMPLATE = """{% if tools %}[tools] {{ tools | tojson }}
{% endif %}{% for message in messages %}[{{ message.role }}] {{ message.content or '' }}
{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"""

CHAT_MODEL = '''"""tiny_chat: a deterministic word generator with Triton's LLM tensor contract (fastoip demo)."""

import json
import random
import zlib

import numpy as np

import fastoip

WORDS = ("the quick brown fox jumps over a lazy dog by the river under green trees while "
         "soft rain falls on blue stones and the sun sets").split()
# The per-token tensors that never change, made once (responses only read them): a token costs its word.
ONE_TOKEN = np.array([1], dtype=np.int32)
LOGPROBS = [np.array([-0.25 * (1 + index)], dtype=np.float32) for index in range(4)]


def _scalar(inputs, name, default):
    value = inputs.get(name)
    return default if value is None else value.reshape(-1)[0]


class TinyChat(fastoip.Model):
    async def predict(self, inputs, parameters):
        prompt = _scalar(inputs, "text_input", b"").decode("utf-8", "replace")
        sampling = json.loads(_scalar(inputs, "sampling_parameters", b"{}") or b"{}")
        max_tokens = int(sampling.get("max_tokens", 16))
        temperature = float(sampling.get("temperature", 1.0))
        prompt_tokens = np.array([len(prompt.encode())], dtype=np.int32)
        if prompt.startswith("[tools] "):
            tools = json.loads(prompt.splitlines()[0][len("[tools] "):])
            asked = [line[len("[user] "):] for line in prompt.splitlines() if line.startswith("[user] ")]
            names = [tool["function"]["name"] for tool in tools]
            forced = parameters.get("tool_choice")  # the function the request forces, if it names one
            call = {"name": forced if forced in names else names[0],
                    "arguments": {"query": asked[-1] if asked else ""}}
            yield {"text_output": ["<tool_call>" + json.dumps(call) + "</tool_call>"],
                   "num_input_tokens": prompt_tokens, "num_output_tokens": np.array([1], dtype=np.int32),
                   "logprobs": np.array([-0.5], dtype=np.float32)}
            return
        start = zlib.crc32(prompt.encode())
        rng = random.Random(sampling.get("seed"))
        for index in range(max_tokens):
            if temperature == 0:
                word = WORDS[(start + index * 7) % len(WORDS)]
            else:
                word = rng.choice(WORDS)
            # every output, every response (a V2 caller asks for all; the OpenAI route asks for what it needs)
            yield {"text_output": [(" " if index else "") + word], "num_input_tokens": prompt_tokens,
                   "num_output_tokens": ONE_TOKEN, "logprobs": LOGPROBS[index % 4]}
'''


def build_embedder() -> ModelProto:
    """Byte embeddings (seed 0) -> MatMul 32x32 -> Tanh, times the attention mask."""
    from onnx import TensorProto, helper, numpy_helper

    from .demo import _model

    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCABULARY, EMBEDDER_WIDTH)).astype(np.float32)
    weight = (rng.standard_normal((EMBEDDER_WIDTH, EMBEDDER_WIDTH)) / np.sqrt(EMBEDDER_WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["embedded"], name="embed"),
        helper.make_node("MatMul", ["embedded", "weight"], ["mixed"], name="mix"),
        helper.make_node("Tanh", ["mixed"], ["hidden"], name="tanh"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask3"], name="unsqueeze"),
        helper.make_node("Mul", ["hidden", "mask3"], ["last_hidden_state"], name="mask"),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
              for n in ("input_ids", "attention_mask")]
    output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", EMBEDDER_WIDTH])
    initializers = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "weight"),
                    numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis")]
    return _model(helper.make_graph(nodes, "tiny_embedder", inputs, [output], initializer=initializers))


def write_openai_examples(root: Path) -> Path:
    """Write ``tiny_embedder`` and ``tiny_chat`` into the repository ``root``."""
    from onnx import checker

    embedder = build_embedder()
    checker.check_model(embedder)
    (root / "tiny_embedder" / "1").mkdir(parents=True, exist_ok=True)
    (root / "tiny_embedder" / "1" / "model.onnx").write_bytes(embedder.SerializeToString())
    (root / "tiny_embedder" / "config.pbtxt").write_text(EMBEDDER_CONFIG)
    (root / "tiny_chat" / "1").mkdir(parents=True, exist_ok=True)
    (root / "tiny_chat" / "1" / "model.py").write_text(CHAT_MODEL)
    (root / "tiny_chat" / "config.pbtxt").write_text(CHAT_CONFIG)
    (root / "tiny_chat" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return root

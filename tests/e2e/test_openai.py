"""OpenAI's API on a real fastoip process, read by the ``openai`` SDK (sync and async) and by raw HTTP.

The repository: the demo's OpenAI examples (``tiny_embedder``: a byte-tokenised ONNX encoder behind the
dynamic batcher; ``tiny_chat``: a decoupled word generator with a chat template and tool calls), a Python text
embedder (BYTES -> FP32 [n, d]), a Triton ``TritonPythonModel`` in the shape of Triton's ``mock_llm``
(``text_input`` / ``stream`` [1, 1], ``text_output`` only), and a slow generator that records each word it makes
(to see a disconnect cancel it).  Served at ``/v1`` and ``/openai/v1`` on the HTTP port and at ``/v1`` on
``--openai-port``.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest

from fastoip.demo_openai import write_openai_examples
from python_models import write_python_model
from serverproc import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(240)

TEXT_EMBEDDER = """
    import numpy as np
    import fastoip

    class Letters(fastoip.Model):
        @fastoip.batchable
        def predict(self, inputs, parameters):
            texts = [t.decode() for t in inputs["TEXT"].reshape(-1)]
            return {"EMBEDDING": np.array([[len(t), t.count("a"), 1.0] for t in texts], dtype=np.float32)}
"""
TEXT_EMBEDDER_CONFIG = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""

#: Triton's python_backend API, in the shape of Triton's mock_llm: each word of the prompt back, one response each.
TRITON_LLM = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
                for word in text.split()[-3:]:
                    out = pb_utils.Tensor("text_output", np.array([[word.encode() + b" "]], dtype=object))
                    sender.send(pb_utils.InferenceResponse([out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""
TRITON_LLM_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1, 1 ] },
            { name: "stream" data_type: TYPE_BOOL dims: [ 1, 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1, -1 ] } ]
"""

#: The same model with the ``bytes`` tokenizer (token-id prompts, usage counted in bytes) and a fill-in-the-middle
#: template (``suffix``).
BYTES_LLM_CONFIG = TRITON_LLM_CONFIG + """
    parameters { key: "tokenizer" value: { string_value: "bytes" } }
    parameters { key: "fim_template" value: { string_value: "{prompt} <FILL> {suffix}" } }
"""


def write_huggingface_llm(root: Path) -> None:
    """``hf_llm``: the same model with a Hugging Face tokenizer.json (built here, no download) and a
    tokenizer_config.json carrying the chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "[UNK] <s> one two three four about rivers go tell me , !".split()
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation apart
    tokenizer.add_special_tokens(["<s>"])
    write_python_model(root, "hf_llm", TRITON_LLM, TRITON_LLM_CONFIG)
    (root / "hf_llm" / "tokenizer.json").write_text(tokenizer.to_str())
    (root / "hf_llm" / "tokenizer_config.json").write_bytes(orjson.dumps({
        "bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}go"}))


SLOW = """
    import asyncio
    import fastoip

    class Slow(fastoip.Model):
        async def predict(self, inputs, parameters):
            log = self.parameters["log"]
            for index in range(2000):
                with open(log, "a") as file:
                    file.write("w\\n")
                await asyncio.sleep(0.02)
                yield {"text_output": [f" w{index}"]}
"""
SLOW_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
    parameters { key: "log" value: { string_value: "LOG" } }
"""

#: Two words, then a failure: an error after the stream started.
FAILING = """
    import fastoip

    class Failing(fastoip.Model):
        async def predict(self, inputs, parameters):
            yield {"text_output": ["one"]}
            yield {"text_output": [" two"]}
            raise RuntimeError("the model broke after two words")
"""
FAILING_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

#: A model that writes two tool calls a few characters at a time (as an LLM's tokens come), after some words.
TOOL_STREAMER = """
    import fastoip

    TEXT = ('Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
            '</tool_call><tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>')

    class ToolStreamer(fastoip.Model):
        async def predict(self, inputs, parameters):
            for start in range(0, len(TEXT), 5):
                yield {"text_output": [TEXT[start:start + 5]]}
"""
TOOL_STREAMER_CONFIG = FAILING_CONFIG

USER = [{"role": "user", "content": "tell me about rivers"}]
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                                 "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_openai_examples(tmp_path_factory.mktemp("openai"))
    write_python_model(root, "letters", TEXT_EMBEDDER, TEXT_EMBEDDER_CONFIG)
    write_python_model(root, "triton_llm", TRITON_LLM, TRITON_LLM_CONFIG)
    log = root / "slow.log"
    write_python_model(root, "slow", SLOW, SLOW_CONFIG.replace("LOG", str(log)))
    write_python_model(root, "failing", FAILING, FAILING_CONFIG)
    write_python_model(root, "tool_streamer", TOOL_STREAMER, TOOL_STREAMER_CONFIG)
    write_python_model(root, "bytes_llm", TRITON_LLM, BYTES_LLM_CONFIG)
    write_huggingface_llm(root)
    process = ServerProcess(root, "--openai-port", "0", http=True)
    process._want.add("openai")
    with process:
        process.slow_log = log  # type: ignore[attr-defined]
        yield process


def bases(server: ServerProcess) -> list[str]:
    http, port = server.http_port, server.child.ports["openai"]  # type: ignore[union-attr]
    return [f"http://127.0.0.1:{http}/v1", f"http://127.0.0.1:{http}/openai/v1", f"http://127.0.0.1:{port}/v1"]


@pytest.fixture(params=[0, 1, 2], ids=["main-v1", "main-openai-v1", "openai-port"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=bases(server)[request.param], api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=bases(server)[2], api_key="unused", max_retries=0) as one:
        yield one


def post(server: ServerProcess, path: str, body: Any, base: int = 2) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(bases(server)[base] + path, content=content, timeout=60)


# -- models ---------------------------------------------------------------------------------------------
def test_list_and_retrieve(client: openai.OpenAI) -> None:
    names = {m.id for m in client.models.list().data}
    assert {"tiny_chat", "tiny_embedder", "letters", "triton_llm"} <= names
    model = client.models.retrieve("tiny_chat")
    assert (model.id, model.object, model.owned_by) == ("tiny_chat", "model", "fastoip")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_main_port_models_answer_kserve_and_openai(server: ServerProcess) -> None:
    doc = httpx.get(bases(server)[0] + "/models").json()
    assert "tiny_chat" in doc["models"] and doc["object"] == "list"
    assert "tiny_chat" in {m["id"] for m in doc["data"]}
    doc = httpx.get(bases(server)[0] + "/models/tiny_chat").json()
    assert doc["name"] == doc["id"] == "tiny_chat" and doc["ready"] is True


def test_unknown_model_is_openai_404_on_every_route(server: ServerProcess) -> None:
    for path, body in [("/embeddings", {"model": "nope", "input": "x"}),
                       ("/chat/completions", {"model": "nope", "messages": USER}),
                       ("/completions", {"model": "nope", "prompt": "x"})]:
        for base in (1, 2):
            answer = post(server, path, body, base)
            assert answer.status_code == 404, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "model_not_found" and "nope" in error["message"] and error["type"]
    answer = httpx.get(bases(server)[2] + "/models/nope")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/chat/completions", {"model": "tiny_chat", "messages": USER, "temperature": 3}, "temperature"),
    ("/chat/completions", {"model": "tiny_chat", "messages": []}, "messages"),
    ("/chat/completions", {"model": "tiny_chat", "messages": USER, "n": 0}, "n"),
    ("/chat/completions", {"model": "tiny_chat", "messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/chat/completions", {"model": "tiny_chat", "messages": USER, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/chat/completions", {"model": "tiny_chat", "messages": [{"role": "wizard", "content": "x"}]},
     "messages[0].role"),
    ("/chat/completions", {"model": "tiny_chat", "messages": USER, "tool_choice": "required"}, "tool_choice"),
    ("/chat/completions", {"messages": USER}, "model"),
    ("/completions", {"model": "tiny_chat", "prompt": 5}, "prompt"),
    ("/completions", {"model": "tiny_chat", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/embeddings", {"model": "tiny_embedder", "input": []}, "input"),
    ("/embeddings", {"model": "tiny_embedder", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ("/embeddings", {"model": "tiny_embedder", "input": "x", "dimensions": 64}, "dimensions"),
    ("/embeddings", {"model": "letters", "input": "x", "dimensions": 2}, "dimensions"),
    ("/embeddings", {"model": "letters", "input": [1, 2, 3]}, "input"),
    ("/embeddings", {"model": "tiny_embedder", "input": [1, 99999, 2]}, "input"),
    ("/embeddings", {"model": "tiny_embedder", "input": [[1, 2], [-5]]}, "input"),
    ("/embeddings", b"{not json", "body"),
])
def test_bad_parameter_is_400_naming_it(server: ServerProcess, path: str, body: Any, param: str) -> None:
    for base in (0, 2):
        answer = post(server, path, body, base)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert httpx.get(bases(server)[2] + "/models/tiny_chat").status_code == 200  # still serving


def test_model_of_the_wrong_kind_is_400(server: ServerProcess) -> None:
    answer = post(server, "/embeddings", {"model": "tiny_chat", "input": "x"})
    assert answer.status_code == 400 and "does not serve embeddings" in answer.json()["error"]["message"]
    answer = post(server, "/chat/completions", {"model": "tiny_embedder", "messages": USER})
    assert answer.status_code == 400 and "text_input" in answer.json()["error"]["message"]


def test_router_errors_on_the_openai_port_are_openai_bodies(server: ServerProcess) -> None:
    answer = httpx.get(bases(server)[2] + "/chat/completions")
    assert answer.status_code == 405 and answer.json()["error"]["message"]
    answer = httpx.get(bases(server)[2] + "/nothing")
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "invalid_request_error"


# -- embeddings -----------------------------------------------------------------------------------------
def test_embeddings_every_input_form(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model="tiny_embedder", input="hello")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 32
    assert abs(np.linalg.norm(one.data[0].embedding) - 1) < 1e-5  # mean pooled, normalised
    assert one.usage.prompt_tokens == len("hello") + 2  # bytes + [CLS] + [SEP]
    many = client.embeddings.create(model="tiny_embedder", input=["hello", "a longer sentence of text"])
    assert [d.index for d in many.data] == [0, 1]
    np.testing.assert_allclose(many.data[0].embedding, one.data[0].embedding, atol=1e-5)
    ids = [1, *(b + 3 for b in b"hello"), 2]  # the same tokens as the text
    tokens = client.embeddings.create(model="tiny_embedder", input=ids)
    np.testing.assert_allclose(tokens.data[0].embedding, one.data[0].embedding, atol=1e-5)
    lists = client.embeddings.create(model="tiny_embedder", input=[ids, ids[:3]])
    assert len(lists.data) == 2 and lists.usage.prompt_tokens == len(ids) + 3


def test_embeddings_base64_and_dimensions(sdk: openai.OpenAI, server: ServerProcess) -> None:
    floats = sdk.embeddings.create(model="tiny_embedder", input=["abc", "xyz"])
    raw = post(server, "/embeddings", {"model": "tiny_embedder", "input": ["abc", "xyz"], "encoding_format": "base64"})
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw.json()["data"]]
    for got, want in zip(decoded, floats.data, strict=True):
        np.testing.assert_allclose(got, want.embedding, atol=1e-6)
    short = sdk.embeddings.create(model="tiny_embedder", input="abc", dimensions=8)
    assert len(short.data[0].embedding) == 8 and abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5
    # the SDK's own base64 path (its default when numpy is installed) decodes to the same vectors
    sdk_b64 = sdk.embeddings.create(model="tiny_embedder", input=["abc", "xyz"], encoding_format="base64")
    assert isinstance(sdk_b64.data[0].embedding, str)


def test_text_model_embeddings(sdk: openai.OpenAI) -> None:
    answer = sdk.embeddings.create(model="letters", input=["banana", "kiwi"] * 6)  # 12 texts, batch size 8
    assert [d.embedding for d in answer.data[:2]] == [[6.0, 3.0, 1.0], [4.0, 0.0, 1.0]]
    assert len(answer.data) == 12 and answer.usage.prompt_tokens == 12


def test_embedding_requests_share_batches(server: ServerProcess) -> None:
    stats_url = f"http://127.0.0.1:{server.http_port}/v2/models/tiny_embedder/stats"

    def counts() -> tuple[int, int]:
        stats = httpx.get(stats_url).json()["model_stats"][0]
        return stats["inference_count"], stats["execution_count"]

    before = counts()

    async def many() -> None:
        async with openai.AsyncOpenAI(base_url=bases(server)[2], api_key="unused", max_retries=0) as sdk:
            await asyncio.gather(*(sdk.embeddings.create(model="tiny_embedder", input=f"text {i}")
                                   for i in range(48)))

    asyncio.run(many())
    after = counts()
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 48 and executions < inferences  # the batcher merged requests


# -- chat and completions -----------------------------------------------------------------------------------
def chat(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    return sdk.chat.completions.create(model="tiny_chat", messages=USER, **kwargs)


def test_chat_non_streamed(client: openai.OpenAI) -> None:
    answer = chat(client, temperature=0, max_completion_tokens=6)
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and len(choice.message.content.split()) == 6
    assert choice.finish_reason == "length" and answer.object == "chat.completion"
    prompt = "[user] tell me about rivers\n[assistant]"  # the model folder's chat template rendered it
    assert answer.usage.prompt_tokens == len(prompt.encode()) and answer.usage.completion_tokens == 6
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 6
    # max_completion_tokens wins over max_tokens
    both = chat(client, temperature=0, max_completion_tokens=2, max_tokens=9)
    assert len(both.choices[0].message.content.split()) == 2


def test_chat_streamed_equals_non_streamed(client: openai.OpenAI) -> None:
    whole = chat(client, seed=7, max_tokens=8)
    chunks = list(chat(client, seed=7, max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage(server: ServerProcess) -> None:
    with httpx.stream("POST", bases(server)[2] + "/chat/completions", timeout=60,
                      json={"model": "tiny_chat", "messages": USER, "stream": True, "max_tokens": 3}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    bodies = [orjson.loads(e[len("data: "):]) for e in events[:-1]]
    assert all("usage" not in b for b in bodies) and len(bodies) == 5  # role, 3 words, finish


def test_stop_strings(sdk: openai.OpenAI) -> None:
    words = chat(sdk, temperature=0, max_tokens=10).choices[0].message.content
    stop_word = words.split()[3]
    cut = words[: words.index(" " + stop_word)] if words.index(stop_word) else ""
    stopped = chat(sdk, temperature=0, max_tokens=10, stop=[" " + stop_word, "never-said"])
    assert stopped.choices[0].message.content == cut and stopped.choices[0].finish_reason == "stop"
    streamed = chat(sdk, temperature=0, max_tokens=10, stop=" " + stop_word, stream=True)
    pieces = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == cut
    assert [c.choices[0].finish_reason for c in pieces if c.choices[0].finish_reason] == ["stop"]


def test_n_choices_and_seed(sdk: openai.OpenAI) -> None:
    answer = chat(sdk, n=3, seed=11, max_tokens=5)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    again = chat(sdk, n=3, seed=11, max_tokens=5)
    assert [c.message.content for c in answer.choices] == [c.message.content for c in again.choices]
    assert answer.usage.completion_tokens == 15
    streamed = list(chat(sdk, n=2, seed=11, max_tokens=5, stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in streamed if c.choices[0].index == index]
        assert "".join(c.delta.content or "" for c in mine) == answer.choices[index].message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]


def test_completions_echo_and_stream(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="tiny_chat", prompt="once upon", temperature=0, max_tokens=4)
    assert plain.object == "text_completion" and len(plain.choices[0].text.split()) == 4
    echoed = client.completions.create(model="tiny_chat", prompt="once upon", temperature=0, max_tokens=4, echo=True)
    assert echoed.choices[0].text == "once upon" + plain.choices[0].text
    chunks = list(client.completions.create(model="tiny_chat", prompt="once upon", temperature=0, max_tokens=4,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 4
    two = client.completions.create(model="tiny_chat", prompt=["a", "b"], temperature=0, max_tokens=2)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text != two.choices[1].text


def test_logprobs_where_the_model_gives_them(sdk: openai.OpenAI) -> None:
    answer = chat(sdk, temperature=0, max_tokens=3, logprobs=True)
    content = answer.choices[0].logprobs.content
    assert [t.logprob for t in content] == [-0.25, -0.5, -0.75]
    assert "".join(t.token for t in content) == answer.choices[0].message.content
    completion = sdk.completions.create(model="tiny_chat", prompt="x", temperature=0, max_tokens=2, logprobs=1)
    assert completion.choices[0].logprobs.token_logprobs == [-0.25, -0.5]
    assert chat(sdk, temperature=0, max_tokens=3).choices[0].logprobs is None


def test_tool_calls(sdk: openai.OpenAI) -> None:
    asked = [{"role": "user", "content": "weather in Paris?"}]
    answer = sdk.chat.completions.create(model="tiny_chat", messages=asked, tools=[WEATHER_TOOL])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"query": "weather in Paris?"}
    chunks = list(sdk.chat.completions.create(model="tiny_chat", messages=asked, tools=[WEATHER_TOOL], stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls if c.id] == ["get_weather"]
    assert orjson.loads("".join(c.function.arguments for c in calls)) == {"query": "weather in Paris?"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    # tool_choice reaches the model: it calls the function the request forces
    other = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    forced = sdk.chat.completions.create(model="tiny_chat", messages=asked, tools=[WEATHER_TOOL, other],
                                         tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert forced.choices[0].message.tool_calls[0].function.name == "get_time"
    # tool_choice none: the text stays text
    text = sdk.chat.completions.create(model="tiny_chat", messages=asked, tools=[WEATHER_TOOL], tool_choice="none")
    assert text.choices[0].message.tool_calls is None and "<tool_call>" in text.choices[0].message.content


TWO_TOOLS = [WEATHER_TOOL, {"type": "function", "function": {"name": "get_time", "parameters": {}}}]
EXPECTED_CALLS = [("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {"zone": "CET"})]


def _streamed_calls(chunks: list[Any]) -> tuple[str, list[tuple[str, Any]]]:
    """OpenAI's streamed tool-call deltas put together as a client does, checking their order and form."""
    content, names, arguments, fragments = "", {}, {}, 0
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id is not None:  # a call's first delta: its id, type and whole name
                assert call.index not in names and call.type == "function" and call.function.name
                names[call.index], arguments[call.index] = call.function.name, call.function.arguments or ""
            else:
                assert call.index in names and call.function.name is None
                arguments[call.index] += call.function.arguments
                fragments += 1
    assert fragments > 2  # the arguments came in pieces, not whole at the end
    return content, [(names[i], orjson.loads(arguments[i])) for i in sorted(names)]


def test_tool_calls_stream_as_they_come(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(model="tool_streamer", messages=USER, tools=TWO_TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [(c.function.name, orjson.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        EXPECTED_CALLS
    chunks = list(sdk.chat.completions.create(model="tool_streamer", messages=USER, tools=TWO_TOOLS, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    assert _streamed_calls(chunks) == ("Checking.", EXPECTED_CALLS)
    # the first call's name went before the model had written its second call
    first_name = next(i for i, c in enumerate(chunks) if (c.choices[0].delta.tool_calls or [None])[0] is not None)
    second_name = next(i for i, c in enumerate(chunks) for t in (c.choices[0].delta.tool_calls or [])
                       if t.index == 1)
    assert first_name < second_name - 2

    async def run() -> None:
        async with openai.AsyncOpenAI(base_url=str(sdk.base_url),
                                      api_key="unused", max_retries=0) as client:
            stream = await client.chat.completions.create(model="tool_streamer", messages=USER, tools=TWO_TOOLS,
                                                          stream=True)
            assert _streamed_calls([c async for c in stream]) == ("Checking.", EXPECTED_CALLS)

    asyncio.run(run())
    # without tools the same text is content, streamed as it came
    plain = list(sdk.chat.completions.create(model="tool_streamer", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in plain).startswith("Checking. <tool_call>")


def test_triton_python_model_serves_chat(sdk: openai.OpenAI) -> None:
    """A TritonPythonModel with mock_llm's tensors ([1, 1], text_output only): tokens counted by responses."""
    answer = sdk.completions.create(model="triton_llm", prompt="one two three four", max_tokens=16)
    assert answer.choices[0].text == "two three four " and answer.usage.completion_tokens == 3
    assert answer.choices[0].finish_reason == "stop"
    chunks = list(sdk.chat.completions.create(model="triton_llm", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "about rivers <|assistant|> "


def test_token_id_prompts_are_decoded_by_the_models_tokenizer(sdk: openai.OpenAI, server: ServerProcess) -> None:
    ids = {"bytes_llm": ([b + 3 for b in b"one two three four"], [b + 3 for b in b"one two"]),
           "hf_llm": ([2, 3, 4, 5], [2, 1, 3])}  # 1 is <s>: special, skipped
    for model, (prompt, short) in ids.items():
        answer = sdk.completions.create(model=model, prompt=prompt, max_tokens=16)
        assert answer.choices[0].text == "two three four ", model
        two = sdk.completions.create(model=model, prompt=[prompt, short], max_tokens=16)
        assert [c.text for c in two.choices] == ["two three four ", "one two "], model
    # no tokenizer, or an id past the vocabulary: 400 naming prompt
    for model, prompt in [("triton_llm", [5, 6]), ("tiny_chat", [[5]]), ("bytes_llm", [259]), ("hf_llm", [[1], [99]])]:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.completions.create(model=model, prompt=prompt)
        assert refused.value.body["param"] == "prompt", model  # type: ignore[index]
    for bad in ([-1], [[]], [1, "a"], [[1], "a"], [True]):
        answer = post(server, "/completions", {"model": "bytes_llm", "prompt": bad})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "prompt", bad


def test_suffix_fills_in_the_middle_where_the_model_says_how(sdk: openai.OpenAI) -> None:
    answer = sdk.completions.create(model="bytes_llm", prompt="one two", suffix="three four", max_tokens=16)
    assert answer.choices[0].text == "<FILL> three four "  # the model saw "one two <FILL> three four"
    # one pass over the template: what the client writes is never a field
    tricky = sdk.completions.create(model="bytes_llm", prompt="{suffix} {prompt}", suffix="{prompt} x")
    assert tricky.choices[0].text == "<FILL> {prompt} x "
    chunks = list(sdk.completions.create(model="bytes_llm", prompt="one two", suffix="three four", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "<FILL> three four "
    for model, extra in [("tiny_chat", {}), ("bytes_llm", {"echo": True})]:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.completions.create(model=model, prompt="x", suffix="y", **extra)
        assert refused.value.body["param"] == "suffix", model  # type: ignore[index]


def test_huggingface_tokenizer_counts_usage_and_its_config_gives_the_template(sdk: openai.OpenAI) -> None:
    # mock_llm's shape reports no counts: the tokenizer.json counts them (words and punctuation apart)
    answer = sdk.completions.create(model="hf_llm", prompt="one, two three, four", max_tokens=16)
    assert answer.choices[0].text == "two three, four "
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (6, 4)
    # the chat template of tokenizer_config.json, with its bos_token; the template's "go" ends the prompt
    chat = sdk.chat.completions.create(model="hf_llm", messages=[{"role": "user", "content": "about rivers!"}])
    assert chat.choices[0].message.content == "<s>about rivers! go "  # the model's last three words
    # "<s>", "about", "rivers", "!", "go" (the prompt's words: 3); the answer is the same five
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (5, 5)
    chunks = list(sdk.chat.completions.create(model="hf_llm", messages=[{"role": "user", "content": "about rivers!"}],
                                              stream=True, stream_options={"include_usage": True}))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 5)
    # the bytes tokenizer counts bytes
    counted = sdk.completions.create(model="bytes_llm", prompt="one two", max_tokens=16).usage
    assert (counted.prompt_tokens, counted.completion_tokens) == (7, 8)


def test_a_long_conversation_renders_off_the_loop_alike(sdk: openai.OpenAI) -> None:
    """Over 32 KiB of content the chat template renders in the executor: the same prompt either way."""
    long = [{"role": "user", "content": "word " * 10_000 + "one two"}]
    answer = sdk.chat.completions.create(model="triton_llm", messages=long)
    assert answer.choices[0].message.content == "one two <|assistant|> "


def test_async_client(server: ServerProcess) -> None:
    async def run() -> None:
        async with openai.AsyncOpenAI(base_url=bases(server)[0], api_key="unused", max_retries=0) as sdk:
            whole = await sdk.chat.completions.create(model="tiny_chat", messages=USER, seed=3, max_tokens=5)
            stream = await sdk.chat.completions.create(model="tiny_chat", messages=USER, seed=3, max_tokens=5,
                                                       stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            assert text == whole.choices[0].message.content
            vectors = await sdk.embeddings.create(model="tiny_embedder", input=["a", "b"])
            assert len(vectors.data) == 2
            models = await sdk.models.list()
            assert "tiny_chat" in {m.id async for m in models}
            # token-id prompts, suffix and tokenizer counts, streamed through the async client
            stream = await sdk.completions.create(model="hf_llm", prompt=[[2, 3, 4, 5]], stream=True,
                                                  stream_options={"include_usage": True})
            chunks = [c async for c in stream]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == "two three four "
            assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 3)
            filled = await sdk.completions.create(model="bytes_llm", prompt="a b", suffix="c")
            assert filled.choices[0].text == "b <FILL> c "

    asyncio.run(run())


def test_an_error_after_the_stream_started_is_an_event(server: ServerProcess, sdk: openai.OpenAI) -> None:
    with httpx.stream("POST", bases(server)[2] + "/chat/completions", timeout=60,
                      json={"model": "failing", "messages": USER, "stream": True}) as answer:
        assert answer.status_code == 200
        events = [line[len("data: "):] for line in answer.iter_lines() if line]
    assert events[-1] == "[DONE]"
    bodies = [orjson.loads(event) for event in events[:-1]]
    assert [b["choices"][0]["delta"].get("content") for b in bodies[:3]] == ["", "one", " two"]
    assert "the model broke after two words" in bodies[-1]["error"]["message"]
    with pytest.raises(openai.InternalServerError, match="broke after two words"):
        chat_of = sdk.chat.completions.create(model="failing", messages=USER)
        del chat_of


def test_large_bodies_are_parsed_off_the_loop(client: openai.OpenAI) -> None:
    """A body over 2 MiB goes to the JSON processes (issue 27's pool) and answers as any other."""
    texts = [f"{i} " + "x" * 1500 for i in range(1600)]  # ~2.5 MB of JSON
    answer = client.embeddings.create(model="tiny_embedder", input=texts)
    assert len(answer.data) == 1600 and answer.data[1599].index == 1599
    assert answer.usage.prompt_tokens == 1600 * 256  # each cut at max_sequence_length


def test_disconnect_cancels_the_generation(server: ServerProcess) -> None:
    log: Path = server.slow_log  # type: ignore[attr-defined]
    with httpx.stream("POST", bases(server)[2] + "/chat/completions", timeout=60,
                      json={"model": "slow", "messages": USER, "stream": True}) as answer:
        lines = answer.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk
        assert wait_until(lambda: log.exists() and len(log.read_text()) >= 10, timeout=30)
    # the client went away: the model stops (it would make 2000 words over 40 s otherwise)
    time.sleep(1.0)
    settled = len(log.read_text())
    time.sleep(1.0)
    assert len(log.read_text()) == settled < 2 * 2000


def test_a_client_that_reads_nothing_gets_its_request_cancelled(server: ServerProcess) -> None:
    """Back-pressure: a streamed client that stops reading does not make the server buffer the model's output
    without bound: past a bounded number of unread responses the model's request is cancelled, with a log line."""
    import socket

    body = orjson.dumps({"model": "tiny_chat", "messages": USER, "stream": True, "max_tokens": 300_000})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's buffers fill soon
    try:
        sock.connect(("127.0.0.1", server.child.ports["openai"]))  # type: ignore[union-attr]
        sock.sendall(head + body)
        # it reads nothing: 300 000 words would take minutes to send and hundreds of MB to hold
        assert wait_until(lambda: "client left 1024 responses unread" in server.output(), timeout=90), \
            server.output()[-2000:]
        assert "model 'tiny_chat'" in server.output()
        # the server serves on meanwhile
        answer = post(server, "/chat/completions", {"model": "tiny_chat", "messages": USER, "max_tokens": 2})
        assert answer.status_code == 200
    finally:
        sock.close()


# -- model control and restrictions ---------------------------------------------------------------------------
def openai_server(root: Path, *flags: str) -> ServerProcess:
    process = ServerProcess(root, "--openai-port", "0", *flags, http=True)
    process._want.add("openai")
    return process


def test_model_control_in_explicit_mode(tmp_path: Path) -> None:
    root = write_openai_examples(tmp_path)
    with openai_server(root, "--model-control-mode", "explicit") as process:
        base = bases(process)[2]
        assert httpx.get(base + "/models").json()["data"] == []
        loaded = httpx.post(base + "/models/tiny_embedder/load", timeout=120)
        assert loaded.status_code == 200 and loaded.json()["id"] == "tiny_embedder"
        assert [m["id"] for m in httpx.get(base + "/models").json()["data"]] == ["tiny_embedder"]
        assert post(process, "/embeddings", {"model": "tiny_embedder", "input": "x"}).status_code == 200
        unloaded = httpx.post(base + "/models/tiny_embedder/unload", timeout=120)
        assert unloaded.json() == {"status": "success", "model": "tiny_embedder"}
        assert httpx.get(base + "/models").json()["data"] == []
        missing = httpx.post(base + "/models/nope/load", timeout=60)
        assert missing.status_code == 400 and "Failed to load model 'nope'" in missing.json()["error"]["message"]
        # Triton's frontend: loading a loaded model, or unloading one not loaded, is 400 (not a reload)
        assert httpx.post(base + "/models/tiny_chat/unload").json()["detail"] == "Unknown model: tiny_chat"
        assert httpx.post(base + "/models/tiny_embedder/load", timeout=120).status_code == 200
        again = httpx.post(base + "/models/tiny_embedder/load", timeout=120)
        assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]


def test_model_control_refused_without_explicit_mode(server: ServerProcess) -> None:
    for base in (0, 2):
        answer = httpx.post(bases(server)[base] + "/models/tiny_chat/unload", timeout=60)
        assert answer.status_code == 400, answer.text
        assert "requires --model-control-mode=explicit" in answer.json()["error"]["message"]
    assert httpx.get(bases(server)[2] + "/models/tiny_chat").status_code == 200  # still loaded


def test_restricted_api_applies_to_openai_routes(tmp_path: Path) -> None:
    """--http-restricted-api: 403 on the main port (Triton's HTTP frontend), 401 on the OpenAI port, where the
    groups are Triton's OpenAI frontend's (listing models is model-repository there)."""
    root = write_openai_examples(tmp_path)
    flags = ("--http-restricted-api", "inference:infer-key=secret", "--http-restricted-api",
             "model-repository:admin-key=admin", "--model-control-mode", "explicit", "--load-model", "tiny_embedder")
    with openai_server(root, *flags) as process:
        request = {"model": "tiny_embedder", "input": "x"}
        for base, status in ((0, 403), (1, 403), (2, 401)):
            refused = post(process, "/embeddings", request, base)
            assert refused.status_code == status and "infer-key" in refused.text
            allowed = httpx.post(bases(process)[base] + "/embeddings", json=request, headers={"infer-key": "secret"})
            assert allowed.status_code == 200
        assert httpx.post(bases(process)[2] + "/models/tiny_embedder/unload").status_code == 401
        assert httpx.get(bases(process)[2] + "/models").status_code == 401
        assert httpx.get(bases(process)[0] + "/models").status_code == 200  # metadata on the main port: open
        assert httpx.get(bases(process)[2] + "/models", headers={"admin-key": "admin"}).status_code == 200


def test_openai_restricted_api_flag(tmp_path: Path) -> None:
    root = write_openai_examples(tmp_path)
    flags = ("--openai-restricted-api", "health,metrics", "probe", "yes")
    with openai_server(root, *flags) as process:
        port = f"http://127.0.0.1:{process.child.ports['openai']}"  # type: ignore[union-attr]
        assert httpx.get(port + "/health/ready").status_code == 401
        assert httpx.get(port + "/health/ready", headers={"probe": "yes"}).status_code == 200
        assert httpx.get(port + "/metrics").status_code == 401
        assert "nv_inference" in httpx.get(port + "/metrics", headers={"probe": "yes"}).text
        assert httpx.get(port + "/v1/models").status_code == 200
        assert post(process, "/embeddings", {"model": "tiny_embedder", "input": "x"}, 0).status_code == 200
    for bad, words in ((["wizards", "k", "v"], "Unknown API 'wizards'"),
                       (["health", "k", "v", "--openai-restricted-api", "health", "j", "w"], "multiple config groups")):
        process = openai_server(root, "--openai-restricted-api", *bad)
        with pytest.raises(Exception, match=words):
            process.start(timeout=60)
        process.stop()


# -- the inference gateway's metrics ---------------------------------------------------------------------------
def metric(text: str, name: str, model: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model_name="{model}"}} '):
            return float(line.split()[-1])
    return None


def test_gateway_metrics(server: ServerProcess, sdk: openai.OpenAI) -> None:
    port = f"http://127.0.0.1:{server.child.ports['openai']}"  # type: ignore[union-attr]
    before = metric(httpx.get(port + "/metrics").text, "vllm:generation_tokens_total", "tiny_chat") or 0
    answer = chat(sdk, temperature=0, max_tokens=4)
    text = httpx.get(port + "/metrics").text
    assert metric(text, "vllm:generation_tokens_total", "tiny_chat") == before + answer.usage.completion_tokens
    assert (metric(text, "vllm:prompt_tokens_total", "tiny_chat") or 0) >= answer.usage.prompt_tokens
    assert metric(text, "vllm:num_requests_waiting", "tiny_chat") == 0
    assert metric(text, "vllm:gpu_cache_usage_perc", "tiny_embedder") == 0
    with httpx.stream("POST", bases(server)[2] + "/chat/completions", timeout=60,
                      json={"model": "slow", "messages": USER, "stream": True}) as stream:
        lines = stream.iter_lines()  # held: a dropped iterator closes the stream
        next(lines)
        running = metric(httpx.get(port + "/metrics").text, "vllm:num_requests_running", "slow")
    assert running == 1
    assert wait_until(lambda: metric(httpx.get(port + "/metrics").text, "vllm:num_requests_running", "slow") == 0,
                      timeout=30)


# -- the README's example and the demo repository ---------------------------------------------------------------
def test_readme_example_runs_as_written(server: ServerProcess) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## OpenAI API"):]
    section = section[: section.index("\n## ", 1)]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[: block.index("```")].replace("localhost:8000", f"127.0.0.1:{server.http_port}")
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "'tiny_chat'" in lines[0] and lines[1] == "2 16 14"
    assert "get_weather" in lines[-1] and "CompletionUsage" in done.stdout


def test_demo_repository_writes_the_openai_examples(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fastoip.cli", "demo-repository", "--openai", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m" / "tiny_chat" / "chat_template.jinja").is_file()
    assert (tmp_path / "m" / "tiny_embedder" / "1" / "model.onnx").is_file()
    assert (tmp_path / "m" / "simple" / "1" / "model.onnx").is_file()  # the demo's own models too


# -- fastoip bench openai -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "model", "keys"), [
    ("embeddings", "tiny_embedder", ("inputs_per_s",)),
    ("chat", "tiny_chat", ("ttft_p50_ms", "itl_p99_ms", "tokens_per_s")),
])
def test_bench_loads_the_openai_routes(server: ServerProcess, tmp_path: Path, kind: str, model: str,
                                       keys: tuple[str, ...]) -> None:
    report = tmp_path / "levels.json"
    done = subprocess.run(
        [sys.executable, "-m", "fastoip.cli", "bench", "openai", kind, bases(server)[1], "-m", model,
         "--concurrency-range", "1:4:4", "--duration", "1", "--max-tokens", "8", "--inputs", "3",
         "--json", str(report)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    levels = orjson.loads(report.read_bytes())["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert level["requests_per_s"] > 0 and level["errors"] == {} and all(level[key] >= 0 for key in keys)
    if kind == "chat":  # 8 tokens a request: the tokens counted are the requests' tokens
        assert abs(levels[0]["tokens_per_s"] - 8 * levels[0]["requests_per_s"]) <= 8 * 2


# -- an ensemble as a text model: tokenizer step -> ONNX encoder -> pooling step ------------------------------------
TOKENIZER = """
    import numpy as np
    import fastoip

    class Tokens(fastoip.Model):
        @fastoip.batchable
        def predict(self, inputs, parameters):
            ids = np.zeros((len(inputs["TEXT"]), 32), dtype=np.int64)
            for row, text in enumerate(inputs["TEXT"].reshape(-1)):
                tokens = [1, *(b + 3 for b in bytes(text)[:30]), 2]
                ids[row, : len(tokens)] = tokens
            return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
"""
TOKENIZER_CONFIG = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "input_ids" data_type: TYPE_INT64 dims: [ 32 ] },
             { name: "attention_mask" data_type: TYPE_INT64 dims: [ 32 ] } ]
"""
POOLING = """
    import numpy as np
    import fastoip

    class Pool(fastoip.Model):
        @fastoip.batchable
        def predict(self, inputs, parameters):
            weights = inputs["MASK"][:, :, None].astype(np.float32)
            pooled = (inputs["HIDDEN"] * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            return {"EMBEDDING": pooled / np.linalg.norm(pooled, axis=1, keepdims=True)}
"""
POOLING_CONFIG = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "HIDDEN" data_type: TYPE_FP32 dims: [ 32, 32 ] },
            { name: "MASK" data_type: TYPE_INT64 dims: [ 32 ] } ]
    output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 32 ] } ]
"""
TEXT_ENCODER = """
name: "text_encoder"
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 32 ] } ]
ensemble_scheduling { step [
  { model_name: "tokens" model_version: -1 input_map { key: "TEXT" value: "TEXT" }
    output_map [ { key: "input_ids" value: "ids" }, { key: "attention_mask" value: "mask" } ] },
  { model_name: "tiny_embedder" model_version: -1
    input_map [ { key: "input_ids" value: "ids" }, { key: "attention_mask" value: "mask" } ]
    output_map { key: "last_hidden_state" value: "hidden" } },
  { model_name: "pool" model_version: -1 input_map [ { key: "HIDDEN" value: "hidden" }, { key: "MASK" value: "mask" } ]
    output_map { key: "EMBEDDING" value: "EMBEDDING" } }
] }
"""


def test_an_ensemble_of_tokenizer_encoder_and_pooling_serves_embeddings(tmp_path: Path) -> None:
    root = write_openai_examples(tmp_path)
    write_python_model(root, "tokens", TOKENIZER, TOKENIZER_CONFIG)
    write_python_model(root, "pool", POOLING, POOLING_CONFIG)
    (root / "text_encoder" / "1").mkdir(parents=True)
    (root / "text_encoder" / "config.pbtxt").write_text(TEXT_ENCODER)
    with openai_server(root) as process:
        with openai.OpenAI(base_url=bases(process)[2], api_key="unused", max_retries=0) as sdk:
            texts = ["hello", "a longer sentence", "x"]
            through_ensemble = sdk.embeddings.create(model="text_encoder", input=texts)
            direct = sdk.embeddings.create(model="tiny_embedder", input=texts)
    assert [len(d.embedding) for d in through_ensemble.data] == [32, 32, 32]
    for got, want in zip(through_ensemble.data, direct.data, strict=True):
        np.testing.assert_allclose(got.embedding, want.embedding, atol=1e-5)

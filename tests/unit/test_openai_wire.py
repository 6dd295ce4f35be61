"""The OpenAI translator's sans-I/O parts: request checks, stop strings, tool-call parsers, chat templates,
the LLM tensor contract and the embedding tensors."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastoip.errors import InternalError, InvalidArgument
from fastoip.types import InferOutput, InferResponse
from fastoip.wire.openai import contract, embeddings, requests, tools
from fastoip.wire.openai.chat import DEFAULT_TEMPLATE, ChatTemplate, template_from_tokenizer_config
from fastoip.wire.openai.errors import BadParameter, error_body
from fastoip.wire.openai.stops import StopScanner


def body(**members: object) -> bytes:
    return orjson.dumps(members)


# -- requests --------------------------------------------------------------------------------------------
def test_chat_request_reads_openai_members() -> None:
    chat = requests.parse_chat(body(
        model="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        max_tokens=9, max_completion_tokens=3, stop="x", seed=4, stream=True,
        stream_options={"include_usage": True},
        logprobs=True, top_logprobs=2, tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "f"}}, some_engine_extra=1,
    ))
    assert chat.max_tokens == 3 and chat.stop == ["x"] and chat.seed == 4 and chat.include_usage
    assert chat.messages[0]["content"] == "ab" and chat.logprobs == 2
    assert (chat.tool_choice, chat.forced_tool) == ("required", "f")
    assert chat.model_parameters() == {"tool_choice": "f"}
    no_tools = requests.parse_chat(body(model="m", messages=[{"role": "user", "content": "x"}]))
    assert no_tools.model_parameters() == {} and no_tools.tool_choice_name is None
    assert chat.parameters(5) == {"max_tokens": 3, "stop": ["x"], "seed": 5, "logprobs": 2}


@pytest.mark.parametrize(("members", "param"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["x" * 1025]}, "stop"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1.5}, "seed"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
])
def test_chat_request_refusals_name_the_member(members: dict, param: str) -> None:
    with pytest.raises(BadParameter) as caught:
        requests.parse_chat(orjson.dumps(members))
    assert caught.value.param == param and caught.value.http_status == 400


def test_completion_choices_are_bounded() -> None:
    with pytest.raises(BadParameter, match="more than 128 choices"):
        requests.parse_completion(body(model="m", prompt=["a"] * 5, n=30))
    assert len(requests.parse_completion(body(model="m", prompt=["a"] * 4, n=32)).prompts) == 4


def test_completion_token_prompts_and_suffix() -> None:
    one = requests.parse_completion(body(model="m", prompt=[5, 6]))
    assert (one.prompts, one.token_prompts) == ([], [[5, 6]])
    assert requests.parse_completion(body(model="m", prompt=[[5], [6, 7]])).token_prompts == [[5], [6, 7]]
    assert requests.parse_completion(body(model="m", prompt="a", suffix="b")).suffix == "b"
    for bad in ([], [-1], [[]], [True], [[1], "a"], [1.5]):
        with pytest.raises(BadParameter) as caught:
            requests.parse_completion(body(model="m", prompt=bad))
        assert caught.value.param == "prompt", bad
    for members in ({"suffix": 3}, {"suffix": "b", "echo": True}):
        with pytest.raises(BadParameter) as caught:
            requests.parse_completion(body(model="m", prompt="a", **members))
        assert caught.value.param == "suffix"
    with pytest.raises(BadParameter, match="more than 128 choices"):
        requests.parse_completion(body(model="m", prompt=[[1]] * 5, n=30))


def test_tokenizers_decode_and_count() -> None:
    from tokenizers import Tokenizer as Built
    from tokenizers import models, pre_tokenizers

    from fastoip.wire.openai.tokenizer import BytesTokenizer, HuggingFaceTokenizer

    assert BytesTokenizer().decode([1, 3 + ord("h"), 3 + ord("i"), 2, 0]) == "hi"  # specials decode to nothing
    assert BytesTokenizer().count("hé") == 3
    with pytest.raises(ValueError, match="259"):
        BytesTokenizer().decode([259])
    built = Built(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "<s>": 3}, unk_token="[UNK]"))
    built.pre_tokenizer = pre_tokenizers.Whitespace()
    built.add_special_tokens(["<s>"])
    loaded = HuggingFaceTokenizer.from_json(built.to_str())
    assert loaded.decode([3, 1, 2]) == "a b" and loaded.count("a b, c") == 4
    with pytest.raises(ValueError, match="4"):
        loaded.decode([4])


def test_embedding_inputs() -> None:
    assert requests.parse_embedding(body(model="m", input="a")).texts == ["a"]
    assert requests.parse_embedding(body(model="m", input=[1, 2])).tokens == [[1, 2]]
    assert requests.parse_embedding(body(model="m", input=[[1], [2, 3]])).tokens == [[1], [2, 3]]
    for bad in ([], [""], [[1], []], [1, "a"], {"a": 1}, ["a"] * 2049):
        with pytest.raises(BadParameter):
            requests.parse_embedding(body(model="m", input=bad))


def test_error_body_is_openai_form() -> None:
    doc = orjson.loads(error_body(404, "gone"))
    assert doc == {"error": {"message": "gone", "type": "invalid_request_error", "param": None,
                             "code": "model_not_found"}, "detail": "gone"}
    assert orjson.loads(error_body(500, "x"))["error"]["type"] == "server_error"


# -- stop strings -------------------------------------------------------------------------------------------
def test_stop_string_straddling_deltas() -> None:
    scanner = StopScanner(["END"])
    assert scanner.feed("abc E") == "abc "
    assert scanner.feed("N") == ""
    assert scanner.feed("D and more") == "" and scanner.stopped
    scanner = StopScanner(["END"])
    assert scanner.feed("xE") == "x" and scanner.feed("x") == "Ex" and not scanner.stopped
    assert scanner.feed("E") == "" and scanner.flush() == "E"


@given(st.lists(st.text(alphabet="abE", max_size=6), max_size=12), st.sampled_from(["EE", "aEb", "E", "ba"]))
def test_stop_scanner_equals_cutting_the_whole_text(deltas: list[str], stop: str) -> None:
    scanner = StopScanner([stop])
    sent = ""
    for delta in deltas:
        sent += scanner.feed(delta)
        if scanner.stopped:
            break
    sent += scanner.flush()
    whole = "".join(deltas)
    assert sent == (whole[: whole.index(stop)] if stop in whole else whole)


# -- tool calls ---------------------------------------------------------------------------------------------
def test_hermes_and_json_parsers() -> None:
    text = 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    assert tools.parse_hermes(text) == ("ok", [{"name": "f", "arguments": '{"a":1}'}])
    assert tools.parse_hermes("<tool_call>{broken</tool_call>")[1] == []
    assert tools.parse_json('[{"name": "g", "parameters": {}}]') == (None, [{"name": "g", "arguments": "{}"}])
    assert tools.parse_json("plain words") == ("plain words", [])


def test_parsers_are_pluggable_and_bounded() -> None:
    tools.register_tool_call_parser("always", lambda text: (None, [{"name": "x", "arguments": "{}"}]))
    parser = tools.tool_call_parser("always")
    assert parser is not None and parser("hi")[1] == [{"name": "x", "arguments": "{}"}]
    huge = "a" * (tools.MAX_PARSED_CHARS + 1)
    assert parser(huge) == (huge, [])
    assert tools.tool_call_parser("nope") is None


def _stream(name: str, text: str, step: int) -> tuple[str, dict[int, str], dict[int, str], int]:
    """Feed ``text`` to a streamed parser ``step`` characters at a time: content, names and arguments by call."""
    parser = tools.tool_call_stream_parser(name)
    assert parser is not None
    events = [e for i in range(0, len(text), step) for e in parser.feed(text[i:i + step])] + parser.finish()
    names = {e.index: e.text for e in events if e.kind == "call"}
    pieces: dict[int, list[str]] = {}
    for event in events:
        if event.kind == "arguments":
            assert event.index in names  # a call's name is sent before any of its arguments
            pieces.setdefault(event.index, []).append(event.text)
    arguments = {index: "".join(parts) for index, parts in pieces.items()}
    return "".join(e.text for e in events if e.kind == "content"), names, arguments, parser.calls


@pytest.mark.parametrize("step", [1, 2, 5, 13, 10_000])
def test_hermes_streamed_matches_whole(step: int) -> None:
    text = ('Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "n": [1, {"a": 2}]}}'
            '</tool_call>\n<tool_call>{"arguments": {}, "name": "g"}</tool_call>')
    content, calls = tools.parse_hermes(text)
    streamed, names, arguments, count = _stream("hermes", text, step)
    assert streamed == content and count == len(calls) == 2
    assert [names[i] for i in range(2)] == [c["name"] for c in calls]
    assert [orjson.loads(arguments[i]) for i in range(2)] == [orjson.loads(c["arguments"]) for c in calls]


def test_hermes_streams_arguments_before_the_call_ends() -> None:
    parser = tools.HermesStream()
    assert parser.feed("<tool_call>") == []
    assert [(e.kind, e.text) for e in parser.feed('{"name": "f", "argum')] == []
    assert [(e.kind, e.text) for e in parser.feed('ents": {"q": "par')] == [("call", "f"), ("arguments", '{"q": "par')]
    assert [(e.kind, e.text) for e in parser.feed('is"}}</tool')] == [("arguments", 'is"}')]
    assert parser.feed("_call>") == [] and parser.finish() == [] and parser.calls == 1


@pytest.mark.parametrize("text", ["plain text < not a tag <tool_cal", "x <tool_call>{broken</tool_call> y",
                                  "ends inside <tool_call>{\"nam", "  spaced  "])
def test_hermes_streamed_text_that_is_no_call_is_content(text: str) -> None:
    for step in (1, 4, 100):
        assert _stream("hermes", text, step) == (text, {}, {}, 0)


def test_a_long_streamed_call_is_linear_work() -> None:
    """A call near the parse bound, 8 characters a delta: its text is kept as pieces, scanned once (joining a growing
    string on every delta made this minutes of copying)."""
    import time

    value = "x" * (tools.MAX_PARSED_CHARS - 100)
    text = '<tool_call>{"name": "f", "arguments": {"v": "' + value + '"}}</tool_call>'
    started = time.monotonic()
    content, names, arguments, count = _stream("hermes", text, 8)
    assert time.monotonic() - started < 15  # about a second on a loaded machine
    assert (content, names, count) == ("", {0: "f"}, 1) and orjson.loads(arguments[0]) == {"v": value}


def test_json_streamed_and_registered_parsers() -> None:
    assert _stream("json", '  {"name": "f", "parameters": {"a": 1}}', 3)[1:] == ({0: "f"}, {0: '{"a":1}'}, 1)
    parser = tools.tool_call_stream_parser("json")
    assert parser is not None and parser.feed("hello") == [tools.ToolEvent("content", "hello")]  # sent at once
    tools.register_tool_call_parser("upper", lambda text: (None, [{"name": text.upper(), "arguments": "{}"}]))
    assert _stream("upper", "abc", 1)[1:] == ({0: "ABC"}, {0: "{}"}, 1)  # held, parsed whole at the end
    assert tools.tool_call_stream_parser("nope") is None


# -- chat templates ----------------------------------------------------------------------------------------
def test_default_template_and_tokenizer_config() -> None:
    prompt = ChatTemplate(DEFAULT_TEMPLATE).render("m", [{"role": "user", "content": "hi"}], None)
    assert prompt == "<|user|>\nhi\n<|assistant|>\n"
    config = {"chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}],
              "bos_token": {"content": "<s>"}}
    template = template_from_tokenizer_config(config)
    assert template is not None and template.render("m", [{"role": "user", "content": "x"}], None) == "<s>x"


def test_template_sees_tool_choice() -> None:
    template = ChatTemplate("{{ tool_choice }}|{{ tools | length }}")
    assert template.render("m", [], [{"type": "function"}], "get_time") == "get_time|1"


def test_template_is_sandboxed_and_errors_are_named() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(InternalError, match="model 'm' chat template failed"):
        escape.render("m", [], None)
    refusing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidArgument, match="roles must alternate"):
        refusing.render("m", [], None)
    with pytest.raises(InternalError, match="does not compile"):
        ChatTemplate("{% for %}")


# -- the LLM tensor contract ---------------------------------------------------------------------------------
def test_generation_request_sends_only_declared_tensors() -> None:
    declared = {"text_input": ("BYTES", (1, 1)), "stream": ("BOOL", (1, 1)), "sampling_parameters": ("BYTES", (1,))}
    request = contract.generation_request("m", declared, ["text_output"], "hi", True, {"max_tokens": 4,
                                          "stop": ["x"]}, "id")
    by_name = {i.name: i for i in request.inputs}
    assert set(by_name) == set(declared) and by_name["text_input"].shape == (1, 1)
    assert by_name["text_input"].data.tolist() == [[b"hi"]] and by_name["stream"].data.tolist() == [[True]]
    assert orjson.loads(by_name["sampling_parameters"].data[0]) == {"max_tokens": 4, "stop": ["x"]}
    assert [o.name for o in request.outputs] == ["text_output"]
    assert request.parameters["stop"] == '["x"]' and request.parameters["max_tokens"] == 4
    with_choice = contract.generation_request("m", declared, [], "hi", False, {"max_tokens": 1}, "",
                                              {"tool_choice": "auto"})
    assert with_choice.parameters["tool_choice"] == "auto"
    assert "tool_choice" not in orjson.loads(
        next(i for i in with_choice.inputs if i.name == "sampling_parameters").data[0])
    with pytest.raises(InvalidArgument, match="no BYTES input 'text_input'"):
        contract.generation_request("m", {"x": ("FP32", (1,))}, [], "hi", False, {"max_tokens": 1}, "")


def test_read_piece() -> None:
    response = InferResponse("m", outputs=[
        InferOutput("text_output", "BYTES", (1, 2), np.array([[b"a", "é".encode()]], dtype=object)),
        InferOutput("num_output_tokens", "INT32", (1,), np.array([2], dtype=np.int32)),
    ])
    piece = contract.read_piece("m", response)
    assert (piece.text, piece.output_tokens, piece.input_tokens) == ("aé", 2, None)
    with pytest.raises(InternalError, match="without a 'text_output'"):
        contract.read_piece("m", InferResponse("m", outputs=[]))


# -- embeddings ----------------------------------------------------------------------------------------------
ENCODER_INPUTS = {"input_ids": ("INT64", (-1, -1)), "attention_mask": ("INT64", (-1, -1))}
ENCODER_OUTPUTS = {"last_hidden_state": ("FP32", (-1, -1, 4))}


def test_encoder_requests_bucket_lengths_and_split_at_batch_size() -> None:
    spec = embeddings.embedding_model("e", ENCODER_INPUTS, ENCODER_OUTPUTS, {"tokenizer": "bytes"}, 2)
    parsed = requests.parse_embedding(body(model="e", input=["ab", "abcdefghij", "x"]))
    infers, tokens = embeddings.embedding_requests(spec, parsed)
    assert [i.inputs[0].shape for i in infers] == [(2, 16), (1, 8)]  # 12 tokens -> 16, 3 -> 8
    assert tokens == 4 + 12 + 3
    assert infers[0].inputs[0].data[0, :4].tolist() == [1, ord("a") + 3, ord("b") + 3, 2]


def test_encoder_pooling_and_truncation() -> None:
    spec = embeddings.embedding_model("e", ENCODER_INPUTS, ENCODER_OUTPUTS,
                                      {"tokenizer": "bytes", "embedding_dimensions": "truncate"}, 0)
    parsed = requests.parse_embedding(body(model="e", input=["ab"]))
    (infer,), _ = embeddings.embedding_requests(spec, parsed)
    hidden = np.zeros((1, 8, 4), dtype=np.float32)
    hidden[0, :4] = [[3, 0, 0, 0], [3, 0, 0, 0], [0, 4, 0, 0], [0, 4, 0, 0]]  # mean (1.5, 2)
    hidden[0, 4:] = 100  # padding: masked out of the mean
    vectors = embeddings.vectors(spec, infer, InferResponse("e", outputs=[
        InferOutput("last_hidden_state", "FP32", hidden.shape, hidden)]))
    np.testing.assert_allclose(vectors, [[0.6, 0.8, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(embeddings.fit_dimensions(spec, vectors, 1), [[1.0]])
    with pytest.raises(BadParameter):
        embeddings.fit_dimensions(spec, vectors, 5)


def test_models_that_cannot_embed_say_why() -> None:
    with pytest.raises(InvalidArgument, match="does not serve embeddings"):
        embeddings.embedding_model("x", {"a": ("FP32", (-1,))}, {"b": ("FP32", (-1,))}, {}, 0)
    with pytest.raises(InvalidArgument, match="'bytes' tokenizer"):
        embeddings.embedding_model("x", ENCODER_INPUTS, ENCODER_OUTPUTS, {"tokenizer": "sentencepiece"}, 0)
    with pytest.raises(InvalidArgument, match="pooling 'max'"):
        embeddings.embedding_model("x", ENCODER_INPUTS, ENCODER_OUTPUTS, {"tokenizer": "bytes", "pooling": "max"}, 0)


def test_many_first_requests_compile_and_load_once(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A burst of requests to a model not yet seen: one compile of its template and one load of its tokenizer.json
    (each a fifth of a second or more), not one per request."""
    from tokenizers import Tokenizer as Built
    from tokenizers import models

    from fastoip.server.http.openai import templates, tokenizers

    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    built = Built(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    (tmp_path / "tokenizer.json").write_text(built.to_str())
    chat_templates, model_tokenizers = templates.ChatTemplates(), tokenizers.ModelTokenizers()
    compiled, loaded = [], []
    compile_once, load_once = chat_templates._load, tokenizers._load

    def counting_compile(*args):  # type: ignore[no-untyped-def]
        compiled.append(1)
        return compile_once(*args)

    def counting_load(*args):  # type: ignore[no-untyped-def]
        loaded.append(1)
        return load_once(*args)

    monkeypatch.setattr(chat_templates, "_load", counting_compile)
    monkeypatch.setattr(tokenizers, "_load", counting_load)

    async def burst() -> None:
        results = await asyncio.gather(*(chat_templates.get(tmp_path) for _ in range(20)),
                                       *(model_tokenizers.get(tmp_path, None) for _ in range(20)))
        assert len({id(r) for r in results[:20]}) == 1 and len({id(r) for r in results[20:]}) == 1

    asyncio.run(burst())
    assert (len(compiled), len(loaded)) == (1, 1)


def test_chat_templates_are_read_from_the_folder_and_bounded(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fastoip.server.http.openai import templates

    monkeypatch.setattr(templates, "MAX_CACHED", 2)
    monkeypatch.setattr(templates, "RECHECK_S", 0.0)
    chat_templates = templates.ChatTemplates()

    class Cache:  # the templates compile in the executor: each get on a loop of its own
        _cache = chat_templates._cache

        @staticmethod
        def get(folder):  # type: ignore[no-untyped-def]
            return asyncio.run(chat_templates.get(folder))

    cache = Cache()
    folders = []
    for index in range(3):
        folder = tmp_path / str(index)
        folder.mkdir()
        (folder / "chat_template.jinja").write_text(f"{index}:{{{{ messages[0].content }}}}")
        folders.append(folder)
        assert cache.get(folder).render("m", [{"role": "user", "content": "x"}], None) == f"{index}:x"
    assert len(cache._cache) == 2 and folders[0] not in cache._cache
    (tmp_path / "none").mkdir()
    assert cache.get(tmp_path / "none").render("m", [{"role": "user", "content": "x"}], None).startswith("<|user|>")
    (folders[2] / "chat_template.jinja").write_text("changed")
    import os
    os.utime(folders[2] / "chat_template.jinja", ns=(1, 1))  # another modification time: read again
    assert cache.get(folders[2]).render("m", [], None) == "changed"
    monkeypatch.setattr(templates, "RECHECK_S", 60.0)  # within the recheck time the files are not looked at
    (folders[2] / "chat_template.jinja").write_text("again")
    os.utime(folders[2] / "chat_template.jinja", ns=(2, 2))
    assert cache.get(folders[2]).render("m", [], None) == "changed"

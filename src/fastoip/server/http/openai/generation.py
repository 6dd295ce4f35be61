"""Completions and chat completions over the Core: each choice one model call, streamed or gathered.

Rules:
- Each prompt (completions may send several) times ``n`` is one choice and one call, all started at once; with a
  ``seed``, choice ``i`` of a prompt gets ``seed + i`` (choices differ, and a fixed seed gives the same answer
  streamed or not).  The model's prompt is the chat template's rendering (chat) or the prompt itself.
- Stop strings are enforced here as well as asked of the model (:mod:`fastoip.wire.openai.stops`); once one is
  met, the call is cancelled.  ``finish_reason`` is ``stop``, or ``length`` when the model's output token count
  (or, when it gives none, its responses: one token each) reaches ``max_tokens``, or ``tool_calls``.
- Tool calls: with ``tools`` given and ``tool_choice`` not ``none``, the model's text goes through its tool-call
  parser (config parameter ``tool_call_parser``, ``hermes`` by default); a streamed answer through the parser's
  streamed form (:mod:`fastoip.wire.openai.tools`): content as it comes, each call's name then its arguments'
  fragments, and one ``finish_reason``: ``tool_calls`` when a call was sent.
- Usage: the prompt tokens are what the model reports (``num_input_tokens``), counted once per prompt, else the
  model's tokenizer's count of the prompt (:mod:`.tokenizers`), else its whitespace-separated words; the
  completion tokens are ``num_output_tokens`` summed, else the tokenizer's count of the text, else responses.
- Completions: token-id prompts are decoded by the model's tokenizer (none: 400 naming ``prompt``); ``suffix``
  needs the model's ``fim_template`` config parameter (its ``{prompt}`` and ``{suffix}`` replaced: the model's
  fill-in-the-middle prompt; none: 400 naming ``suffix``), and reaches the model as the request parameter
  ``suffix`` too.
- The usage of every answer is added to the inference gateway's token counters (``fastoip.metrics.gateway``).
- Back-pressure: a streamed call holds at most :data:`STREAM_PENDING` responses its client has not taken (the
  HTTP server stops taking chunks while the socket's buffers are full); past that its model's request is
  cancelled (:class:`..model_call.ModelCall`).  Choices after the first are streamed after it, so theirs may
  also hold ``max_tokens`` responses meanwhile (no more than the non-streamed answer would hold).
- Streamed: the answer's status is decided by the first choice's first answer (an error there is an ordinary
  error response); a failure later is one ``data: {"error": ...}`` event, then ``[DONE]``.  The client going
  away closes the generator, which cancels every call still running.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ....core import Core
from ....errors import InferenceError, InternalError
from ....metrics.gateway import TOKENS
from ....types import InferResponse
from ....wire.openai import answers, contract, tools
from ....wire.openai.answers import Choice, ChunkWriter, Envelope, TokenLogprobs, Usage
from ....wire.openai.errors import BadParameter, error_of
from ....wire.openai.requests import ChatRequest, CompletionRequest, Sampling
from ....wire.openai.stops import StopScanner
from ....wire.openai.tokenizer import Tokenizer
from ..model_call import ModelCall

#: The fields of a model's ``fim_template``.
FIM_FIELDS = re.compile(r"\{(prompt|suffix)\}")
#: Responses a streamed call may hold unread before its request is cancelled (each is one delta, a few hundred bytes).
STREAM_PENDING = 1024


@dataclass
class Plan:
    """Everything one generation needs, decided before any call starts."""

    model: str
    sampling: Sampling
    #: The model's prompt of each prompt group (chat: one).
    prompts: list[str]
    chat: bool
    echo: bool = False
    parser: tools.Parser | None = None
    #: The tool-call parser's name (a streamed choice makes its own streamed parser of it).
    parser_name: str = ""
    declared: contract.Declared = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    #: Request parameters beside the sampling ones (a chat's ``tool_choice``, a completion's ``suffix``).
    extra: dict[str, str] = field(default_factory=dict)
    #: The model's tokenizer, where it has one (usage counts).
    tokenizer: Tokenizer | None = None


@dataclass
class ChoiceState:
    """One running choice: its call, what it has said, its counts."""

    index: int
    prompt_index: int
    call: ModelCall
    scanner: StopScanner
    text: str = ""
    #: The text's pieces as they come (joined once at the end: adding to a string each time copies it each time).
    parts: list[str] = field(default_factory=list)
    responses: int = 0
    output_tokens: int | None = None
    input_tokens: int | None = None
    logprobs: TokenLogprobs | None = None
    pending: InferResponse | None = None

    def count(self, piece: contract.Piece) -> None:
        self.responses += 1
        if piece.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + piece.output_tokens
        if piece.input_tokens is not None and self.input_tokens is None:
            self.input_tokens = piece.input_tokens
        if piece.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = TokenLogprobs()
            self.logprobs.add(piece.text, piece.logprobs)

    def finish_reason(self, max_tokens: int) -> str:
        if self.scanner.stopped:
            return "stop"
        produced = self.output_tokens if self.output_tokens is not None else self.responses
        return "length" if produced >= max_tokens else "stop"


def plan_completion(
    core: Core, request: CompletionRequest, tokenizer: Tokenizer | None, fim_template: str | None
) -> Plan:
    prompts = request.prompts
    if request.token_prompts is not None:
        if tokenizer is None:
            raise BadParameter("prompt", f"model '{request.model}' has no tokenizer to decode token ids: give it "
                               "'tokenizer: bytes' or a tokenizer.json, or send text")
        try:
            prompts = [tokenizer.decode(ids) for ids in request.token_prompts]
        except ValueError as exc:
            raise BadParameter("prompt", f"'prompt' holds a token id model '{request.model}' cannot decode: "
                               f"{exc}") from None
    extra = {}
    if request.suffix is not None:
        if not fim_template:
            raise BadParameter("suffix", f"model '{request.model}' does not fill in the middle: its config has no "
                               "'fim_template' parameter")
        prompts = [_fill_in_the_middle(fim_template, p, request.suffix) for p in prompts]
        extra["suffix"] = request.suffix
    return Plan(request.model, request, prompts, chat=False, echo=request.echo, extra=extra, tokenizer=tokenizer,
                **_tensors(core, request.model))


def _fill_in_the_middle(template: str, prompt: str, suffix: str) -> str:
    """One pass over the template: a "{suffix}" the client wrote in its prompt stays text."""
    return FIM_FIELDS.sub(lambda field: prompt if field.group(1) == "prompt" else suffix, template)


def plan_chat(
    core: Core, request: ChatRequest, prompt: str, parser_name: str, tokenizer: Tokenizer | None = None
) -> Plan:
    parser = None
    if request.tools and request.tool_choice != "none":
        parser = tools.tool_call_parser(parser_name)
        if parser is None:
            raise InternalError(f"model '{request.model}' names tool_call_parser '{parser_name}'; this server has "
                                f"{', '.join(sorted(tools.PARSERS))}")
    return Plan(request.model, request, [prompt], chat=True, parser=parser, parser_name=parser_name,
                extra=request.model_parameters(), tokenizer=tokenizer, **_tensors(core, request.model))


def _tensors(core: Core, model: str) -> dict[str, Any]:
    metadata = core.model_metadata(model)
    return {"declared": {t.name: (t.datatype, t.shape) for t in metadata.inputs},
            "outputs": [t.name for t in metadata.outputs]}


def start_choices(core: Core, plan: Plan, request_id: str) -> list[ChoiceState]:
    sampling = plan.sampling
    states: list[ChoiceState] = []
    try:
        for prompt_index, prompt in enumerate(plan.prompts):
            for i in range(sampling.n):
                seed = None if sampling.seed is None else sampling.seed + i
                infer = contract.generation_request(
                    plan.model, plan.declared, plan.outputs, prompt, sampling.stream, sampling.parameters(seed),
                    request_id, plan.extra,
                )
                pending = 0
                if sampling.stream:
                    pending = STREAM_PENDING + (sampling.max_tokens if states else 0)
                call = ModelCall(core, infer, pending)
                states.append(ChoiceState(len(states), prompt_index, call, StopScanner(sampling.stop)))
    except BaseException:
        for state in states:
            state.call.close()
        raise
    return states


def _usage(plan: Plan, states: list[ChoiceState]) -> Usage:
    usage = Usage()
    for prompt_index, prompt in enumerate(plan.prompts):
        counted = [s.input_tokens for s in states if s.prompt_index == prompt_index and s.input_tokens is not None]
        if counted:
            usage.prompt_tokens += counted[0]
        else:
            usage.prompt_tokens += plan.tokenizer.count(prompt) if plan.tokenizer else len(prompt.split())
    for state in states:
        if state.output_tokens is not None:
            usage.completion_tokens += state.output_tokens
        else:
            text = state.text or "".join(state.parts)
            usage.completion_tokens += plan.tokenizer.count(text) if plan.tokenizer else state.responses
    return usage


async def _gather(plan: Plan, state: ChoiceState) -> None:
    """Read one choice to its end (or its stop string)."""
    parts = state.parts
    while True:
        response = await state.call.next()
        if response is None:
            break
        piece = contract.read_piece(plan.model, response)
        state.count(piece)
        parts.append(state.scanner.feed(piece.text))
        if state.scanner.stopped:
            state.call.close()
            break
    parts.append(state.scanner.flush())
    state.text = "".join(parts)


async def complete(plan: Plan, states: list[ChoiceState], envelope: Envelope) -> bytes:
    """The whole (non-streamed) answer."""
    try:
        for state in states:  # the calls run concurrently; reading them in turn waits for the slowest
            await _gather(plan, state)
    finally:
        for state in states:
            state.call.close()
    choices = []
    for state in states:
        finish = state.finish_reason(plan.sampling.max_tokens)
        text, calls = state.text, None
        if plan.parser is not None:
            content, found = plan.parser(text)
            if found:
                text, calls, finish = content or "", found, "tool_calls"
        if plan.echo:
            text = plan.prompts[state.prompt_index] + text
        choices.append(Choice(state.index, text, finish, calls, state.logprobs))
    usage = _usage(plan, states)
    TOKENS.record(plan.model, usage.prompt_tokens, usage.completion_tokens)
    if plan.chat:
        return answers.chat_json(envelope, choices, usage)
    return answers.completion_json(envelope, choices, usage)


async def first_answer(states: list[ChoiceState]) -> None:
    """Wait for the first choice's first response (its error raised: the answer's status is then the error's)."""
    states[0].pending = await states[0].call.next()


async def stream(plan: Plan, states: list[ChoiceState], envelope: Envelope) -> AsyncGenerator[bytes, None]:
    """The SSE body of a streamed answer; closing it cancels every call still running."""
    writer = ChunkWriter(envelope, plan.chat, plan.sampling.include_usage)
    #: The chunks made since the last write: the responses queued at a wake-up go out in one write.
    held: list[bytes] = []
    try:
        last = states[-1]
        for state in states:
            call = state.call
            async for chunk in _stream_choice(plan, state, writer):
                held.append(chunk)
                # the next chunk would wait for the model: send these (the last choice's end waits for nothing)
                if state.pending is None and not call.ready() and not (call.ended and state is last):
                    yield b"".join(held)
                    held.clear()
        usage = _usage(plan, states)
        TOKENS.record(plan.model, usage.prompt_tokens, usage.completion_tokens)
        if plan.sampling.include_usage:
            held.append(writer.usage(usage))
    except InferenceError as exc:
        held.append(answers.sse(orjson.loads(error_of(exc)[1])))
    finally:
        for state in states:
            state.call.close()
    held.append(answers.DONE)
    yield b"".join(held)


async def _stream_choice(plan: Plan, state: ChoiceState, writer: ChunkWriter) -> AsyncGenerator[bytes, None]:
    index = state.index
    if plan.chat:
        yield writer.chunk(index, "", role=True)
    elif plan.echo:
        yield writer.chunk(index, plan.prompts[state.prompt_index])
    parser = tools.tool_call_stream_parser(plan.parser_name) if plan.parser is not None else None
    while True:
        response, state.pending = state.pending, None
        if response is None:
            response = await state.call.next()
        if response is None:
            break
        piece = contract.read_piece(plan.model, response)
        state.count(piece)
        delta = state.scanner.feed(piece.text)
        if plan.tokenizer is not None:  # kept to be counted at the end
            state.parts.append(delta)
        if parser is not None:
            for event in parser.feed(delta):
                yield _tool_chunk(writer, index, event)
        elif delta:
            if piece.logprobs is None:
                yield writer.content(index, delta)
            else:
                lp = TokenLogprobs()
                lp.add(piece.text, piece.logprobs)
                yield writer.chunk(index, delta, logprobs=lp)
        if state.scanner.stopped:
            state.call.close()
            break
    rest = state.scanner.flush()
    if plan.tokenizer is not None:
        state.parts.append(rest)
    finish = state.finish_reason(plan.sampling.max_tokens)
    if parser is not None:
        for event in parser.feed(rest) + parser.finish():
            yield _tool_chunk(writer, index, event)
        if parser.calls:
            finish = "tool_calls"
    elif rest:
        yield writer.chunk(index, rest)
    yield writer.chunk(index, finish_reason=finish)


def _tool_chunk(writer: ChunkWriter, index: int, event: tools.ToolEvent) -> bytes:
    if event.kind == "content":
        return writer.chunk(index, event.text)
    if event.kind == "call":
        return writer.tool_call(index, event.index, name=event.text)
    return writer.tool_call(index, event.index, arguments=event.text)

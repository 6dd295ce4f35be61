"""Completion, chat completion and chunk bodies, usage, and the Server-Sent Events they travel in.

Rules (OpenAI's API reference):
- Non-streamed: ``text_completion`` / ``chat.completion`` with every choice and ``usage`` (prompt, completion
  and total tokens).
- Streamed: ``data: {chunk}`` events, ``data: [DONE]`` last.  A chat choice's first chunk carries
  ``delta.role``; each choice has exactly one chunk with a ``finish_reason`` (its last); with
  ``stream_options.include_usage`` every chunk has ``usage: null`` and one more chunk, with no choices,
  carries the usage before ``[DONE]``.
- ``finish_reason``: ``stop`` (the model ended, or a stop string), ``length`` (``max_tokens`` reached),
  ``tool_calls`` (the answer is tool calls).
- Log probabilities where the model gave them: chat's ``{"content": [{"token", "logprob", "bytes",
  "top_logprobs"}]}`` and the completions' ``tokens`` / ``token_logprobs`` / ``top_logprobs`` /
  ``text_offset``; a token's text is known only when a response carries one token.
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
#: Stands for the text while a chunk template is made (a private-use character: no id or model name holds it).
_MARK = "\ue000text\ue000"


def sse(value: Any) -> bytes:
    return b"data: " + orjson.dumps(value) + b"\n\n"


#: Ids are this process's random half, then a count: unique without asking the kernel for randomness each time
#: (a getrandom call per answer was ~5 % of a streamed chat's CPU here); 32 hex digits, as uuid4's.
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNT = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{_ID_PREFIX}{next(_ID_COUNT):016x}"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class TokenLogprobs:
    """The log probabilities of one choice's tokens, in order."""

    tokens: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, text: str, values: list[float]) -> None:
        self.tokens.extend([text] if len(values) == 1 else [""] * len(values))
        self.values.extend(values)

    def chat_json(self) -> dict[str, Any]:
        return {"content": [{"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, v in zip(self.tokens, self.values, strict=True)]}

    def completion_json(self, offset: int = 0) -> dict[str, Any]:
        offsets = []
        for token in self.tokens:
            offsets.append(offset)
            offset += len(token)
        return {"tokens": self.tokens, "token_logprobs": self.values,
                "top_logprobs": [{} for _ in self.tokens], "text_offset": offsets}


@dataclass
class Choice:
    """One finished choice of a non-streamed answer."""

    index: int
    text: str
    finish_reason: str
    tool_calls: list[dict[str, str]] | None = None
    logprobs: TokenLogprobs | None = None


class Envelope:
    """The id, creation time and model every body and chunk of one answer shares."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = new_id(prefix)
        self.created = int(time.time())
        self.model = model

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}


def tool_calls_json(calls: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"id": new_id("call"), "type": "function",
             "function": {"name": call["name"], "arguments": call["arguments"]}} for call in calls]


def completion_json(envelope: Envelope, choices: list[Choice], usage: Usage, echo_offset: int = 0) -> bytes:
    body = envelope.head("text_completion")
    body["choices"] = [
        {"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
         "logprobs": c.logprobs.completion_json(echo_offset) if c.logprobs else None}
        for c in choices
    ]
    body["usage"] = usage.json()
    return orjson.dumps(body)


def chat_json(envelope: Envelope, choices: list[Choice], usage: Usage) -> bytes:
    body = envelope.head("chat.completion")
    out = []
    for c in choices:
        message: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
        if c.tool_calls:
            message["tool_calls"] = tool_calls_json(c.tool_calls)
        out.append({"index": c.index, "message": message, "finish_reason": c.finish_reason,
                    "logprobs": c.logprobs.chat_json() if c.logprobs else None})
    body["choices"] = out
    body["usage"] = usage.json()
    return orjson.dumps(body)


class ChunkWriter:
    """The chunks of one streamed answer (chat or completions)."""

    def __init__(self, envelope: Envelope, chat: bool, include_usage: bool) -> None:
        self.envelope = envelope
        self.chat = chat
        self.include_usage = include_usage
        self.kind = "chat.completion.chunk" if chat else "text_completion"
        #: A content chunk's bytes before and after its text, by choice index (``content``).
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def chunk(self, index: int, text: str | None = None, *, role: bool = False, finish_reason: str | None = None,
              logprobs: TokenLogprobs | None = None) -> bytes:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            if logprobs is not None:
                choice["logprobs"] = logprobs.chat_json()
        else:
            choice["text"] = text or ""
            if logprobs is not None:
                choice["logprobs"] = logprobs.completion_json()
        body = self.envelope.head(self.kind)
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def tool_call(self, index: int, call: int, name: str | None = None, arguments: str = "") -> bytes:
        """A streamed call's delta: its start (``name`` given: ``index``, ``id``, the whole name) or an
        ``arguments`` fragment."""
        item: dict[str, Any] = {"index": call}
        if name is not None:
            item.update(id=new_id("call"), type="function", function={"name": name, "arguments": arguments})
        else:
            item["function"] = {"arguments": arguments}
        body = self.envelope.head(self.kind)
        body["choices"] = [{"index": index, "delta": {"tool_calls": [item]}, "finish_reason": None, "logprobs": None}]
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def content(self, index: int, text: str) -> bytes:
        """``chunk(index, text)``, byte for byte, from a template made once per choice: a streamed answer's every
        token is one of these, and only the text needs JSON."""
        template = self._templates.get(index)
        if template is None:
            head, _, tail = self.chunk(index, _MARK).partition(orjson.dumps(_MARK))
            template = self._templates[index] = (head, tail)
        return template[0] + orjson.dumps(text) + template[1]

    def usage(self, usage: Usage) -> bytes:
        body = self.envelope.head(self.kind)
        body["choices"] = []
        body["usage"] = usage.json()
        return sse(body)

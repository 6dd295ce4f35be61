"""Tool-call parsers: find the tool calls in a model's text (pluggable, by name).

Rules:
- A parser takes the whole generated text and answers the text left for ``content`` (None: none) and the
  calls found, each ``{"name", "arguments"}`` with ``arguments`` a JSON string (OpenAI's form).
- The model names its parser in config.pbtxt (``parameters { key: "tool_call_parser" value: {
  string_value: "hermes" } }``); more parsers are added with :func:`register_tool_call_parser`.
- ``hermes`` (Hermes / Qwen models): each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  ``json``: the whole text is one call object or a list of them (Llama 3's JSON tool calls, with
  ``parameters`` accepted for ``arguments``).  Text that does not parse is content, never an error; so is
  text over :data:`MAX_PARSED_CHARS` (as Triton's frontend bounds its parse).
- Streamed (:func:`tool_call_stream_parser`, one per choice): OpenAI's deltas, each call's ``index``, ``id`` and
  whole function name first, then its ``arguments`` in fragments as the model writes them (their concatenation
  is the arguments' JSON text, as the model spaced it).  ``hermes`` streams so; ``json`` sends text that opens no
  JSON value as content at once and parses the rest at the end; a parser registered without a streamed form is
  held and parsed whole at the end.  What was sent cannot be taken back: a streamed call that turns out not to
  parse stays as sent (the whole-text parser would have made it content).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

#: A found call: the function's name and its arguments as a JSON string.
ToolCall = dict[str, str]
Parser = Callable[[str], tuple[str | None, list[ToolCall]]]

#: Texts longer than this are not searched for tool calls (they stay content): parsing is bounded work.
MAX_PARSED_CHARS = 1 << 20
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _call_of(value: Any) -> ToolCall | None:
    if type(value) is not dict or type(value.get("name")) is not str:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if type(arguments) is not str:
        arguments = orjson.dumps(arguments).decode()
    return {"name": value["name"], "arguments": arguments}


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    calls = []
    for match in HERMES_CALL.finditer(text):
        try:
            call = _call_of(orjson.loads(match.group(1)))
        except orjson.JSONDecodeError:
            call = None
        if call is None:
            return text, []  # a malformed call: the text stays as the model wrote it
        calls.append(call)
    if not calls:
        return text, []
    rest = HERMES_CALL.sub("", text).strip()
    return rest or None, calls


def parse_json(text: str) -> tuple[str | None, list[ToolCall]]:
    try:
        value = orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return text, []
    found = [_call_of(v) for v in (value if type(value) is list else [value])]
    if not found or any(call is None for call in found):
        return text, []
    return None, [call for call in found if call is not None]


PARSERS: dict[str, Parser] = {"hermes": parse_hermes, "json": parse_json}
DEFAULT_PARSER = "hermes"


def tool_call_parser(name: str) -> Parser | None:
    parser = PARSERS.get(name)
    if parser is None:
        return None

    def bounded(text: str) -> tuple[str | None, list[ToolCall]]:
        return (text, []) if len(text) > MAX_PARSED_CHARS else parser(text)

    return bounded


# -- streamed ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class ToolEvent:
    """What a streamed answer sends next: ``content`` text, the start of a ``call`` (its index and the function's
    name), or a fragment of a call's ``arguments``."""

    kind: str
    text: str
    index: int = 0


class StreamParser(Protocol):
    """Fed a choice's text delta by delta; answers what can be sent now (OpenAI's streamed ``tool_calls``)."""

    calls: int

    def feed(self, delta: str) -> list[ToolEvent]: ...

    def finish(self) -> list[ToolEvent]: ...


def _whole_events(content: str | None, calls: list[ToolCall], first: int = 0) -> list[ToolEvent]:
    events = [ToolEvent("content", content)] if content else []
    for offset, call in enumerate(calls):
        events.append(ToolEvent("call", call["name"], first + offset))
        events.append(ToolEvent("arguments", call["arguments"], first + offset))
    return events


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (held back: the next delta may finish it)."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return keep
    return 0


class WholeTextStream:
    """Any whole-text parser, streamed: the text is held and parsed at the end (a registered parser without a
    streamed form).  With ``json_only``, text whose first visible character opens no JSON value is content at
    once (the ``json`` parser: a call is the whole text)."""

    def __init__(self, parser: Parser, json_only: bool = False) -> None:
        self.parser = parser
        self.undecided = json_only  # (json) the first visible character is still to come
        self.parts: list[str] = []
        self.length = 0
        self.passing = False
        self.calls = 0

    def feed(self, delta: str) -> list[ToolEvent]:
        if self.passing:
            return [ToolEvent("content", delta)] if delta else []
        self.parts.append(delta)
        self.length += len(delta)
        opens = True
        if self.undecided and delta.strip():
            self.undecided = False
            opens = delta.lstrip()[0] in "{["
        if not opens or self.length > MAX_PARSED_CHARS:
            self.passing, text, self.parts = True, "".join(self.parts), []
            return [ToolEvent("content", text)]
        return []

    def finish(self) -> list[ToolEvent]:
        text = "".join(self.parts)
        if self.passing or not text:
            return []
        content, calls = self.parser(text)
        self.calls = len(calls)
        return _whole_events(content, calls)


class _ArgumentsScanner:
    """Where a JSON object or array (a call's ``arguments``) ends, found piece by piece as its text arrives."""

    __slots__ = ("depth", "in_string", "escaped", "ended")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = self.ended = False

    def scan(self, piece: str) -> int:
        """How much of ``piece`` belongs to the value (all of it, unless the value ends inside it)."""
        for index, char in enumerate(piece):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.ended = True
                    return index + 1
        return len(piece)


#: A call whose name comes first, then its arguments object: the name is sent once whole, the arguments as they come.
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=[{\[])')
#: A call's head (up to its arguments' first character) is looked for in this many characters at most: past them
#: the call is held and sent whole when it ends (a name is short; matching a growing text on every delta is not).
MAX_HEAD_CHARS = 4096


class _CallStream:
    """One ``<tool_call>`` body as it arrives: its text kept as pieces (joined once, at its end)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.parts: list[str] = []
        self.length = 0
        self.head = ""  # the text while the head is looked for
        self.sent = False  # anything of this call sent (it cannot be taken back)
        self.scanner = _ArgumentsScanner()

    def feed(self, piece: str) -> list[ToolEvent]:
        if not piece:
            return []
        self.parts.append(piece)
        self.length += len(piece)
        if self.sent:
            return self._arguments(piece)
        if len(self.head) > MAX_HEAD_CHARS:
            return []
        self.head += piece
        match = CALL_HEAD.match(self.head)
        if match is None:
            return []
        try:
            name = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            return []
        self.sent = True
        rest, self.head = self.head[match.end():], ""
        return [ToolEvent("call", name, self.index), *self._arguments(rest)]

    def _arguments(self, piece: str) -> list[ToolEvent]:
        if self.scanner.ended or not piece:
            return []
        fragment = piece[: self.scanner.scan(piece)]
        return [ToolEvent("arguments", fragment, self.index)] if fragment else []

    def end(self) -> list[ToolEvent] | None:
        """The rest of a finished call; None when it is no call (nothing of it was sent: it is content)."""
        if self.sent:
            return []  # all of it was sent (a call that does not parse after all stays as sent)
        try:
            call = _call_of(orjson.loads(self.text))
        except orjson.JSONDecodeError:
            call = None
        return None if call is None else _whole_events(None, [call], self.index)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class HermesStream:
    """``hermes``, streamed: text outside ``<tool_call>`` tags is content as it comes (a possible tag's start
    held back; blank text beside calls dropped, as the whole-text parser strips it); inside, the function's name
    goes once whole, then the arguments' text as it arrives.  A call that does not parse, once closed, is
    content when nothing of it was sent yet."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self.buffer = ""
        self.blank = ""  # whitespace held: it is content only if more content follows
        self.call: _CallStream | None = None
        self.calls = 0
        self.passing = False

    def _content(self, text: str) -> list[ToolEvent]:
        """Content, its trailing whitespace held (sent only if more content follows, as the whole-text parser
        strips the content around calls)."""
        visible = text.rstrip()
        if not visible:
            self.blank += text
            return []
        text, self.blank = self.blank + visible, text[len(visible):]
        return [ToolEvent("content", text)]

    def feed(self, delta: str) -> list[ToolEvent]:
        if self.passing:
            return self._content(delta)
        self.buffer += delta
        events: list[ToolEvent] = []
        while True:
            if self.call is None:
                at = self.buffer.find(self.OPEN)
                if at < 0:
                    keep = _partial_suffix(self.buffer, self.OPEN)
                    events += self._content(self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    return events
                events += self._content(self.buffer[:at])
                self.buffer = self.buffer[at + len(self.OPEN):]
                self.call = _CallStream(self.calls)
                continue
            at = self.buffer.find(self.CLOSE)
            if at < 0:
                keep = _partial_suffix(self.buffer, self.CLOSE)
                events += self.call.feed(self.buffer[: len(self.buffer) - keep])
                self.buffer = self.buffer[len(self.buffer) - keep:]
                if self.call.sent:  # the blank before a call is no content
                    self.blank = ""
                if self.call.length > MAX_PARSED_CHARS:  # bounded work: the rest is content
                    if not self.call.sent:
                        events += self._content(self.OPEN + self.call.text)
                    self.passing, self.call = True, None
                    events += self._content(self.buffer)
                    self.buffer = ""
                return events
            events += self.call.feed(self.buffer[:at])
            ended = self.call.end()
            if ended is None:
                events += self._content(self.OPEN + self.call.text + self.CLOSE)
            else:
                events += ended
                self.calls += 1
                self.blank = ""
            self.buffer = self.buffer[at + len(self.CLOSE):]
            self.call = None

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self.call is not None:  # the model ended inside a call: one not begun is content
            if not self.call.sent:
                events += self._content(self.OPEN + self.call.text + self.buffer)
            else:
                self.calls += 1
        elif self.buffer:
            events += self._content(self.buffer)
        if self.blank and not self.calls:
            events.append(ToolEvent("content", self.blank))
        self.buffer = self.blank = ""
        self.call = None
        return events


#: Each parser's streamed form, by name; a parser without one is held and parsed whole (:class:`WholeTextStream`).
STREAM_PARSERS: dict[str, Callable[[], StreamParser]] = {
    "hermes": HermesStream,
    "json": lambda: WholeTextStream(parse_json, json_only=True),
}


def tool_call_stream_parser(name: str) -> StreamParser | None:
    """A fresh streamed parser of ``name`` (one per choice), None when no parser has that name."""
    factory = STREAM_PARSERS.get(name)
    if factory is not None:
        return factory()
    parser = tool_call_parser(name)
    return None if parser is None else WholeTextStream(parser)


def register_tool_call_parser(name: str, parser: Parser, stream: Callable[[], StreamParser] | None = None) -> None:
    """Make ``parser`` available to models whose config names ``name``; ``stream`` makes a streamed form of it
    (without one, a streamed answer holds the text and parses it whole at the end)."""
    PARSERS[name] = parser
    if stream is None:
        STREAM_PARSERS.pop(name, None)
    else:
        STREAM_PARSERS[name] = stream

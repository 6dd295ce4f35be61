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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

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


def register_tool_call_parser(name: str, parser: Parser) -> None:
    """Make ``parser`` available to models whose config names ``name``."""
    PARSERS[name] = parser


def tool_call_parser(name: str) -> Parser | None:
    parser = PARSERS.get(name)
    if parser is None:
        return None

    def bounded(text: str) -> tuple[str | None, list[ToolCall]]:
        return (text, []) if len(text) > MAX_PARSED_CHARS else parser(text)

    return bounded

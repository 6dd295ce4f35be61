"""The three OpenAI request bodies, read and checked into typed records (400 naming the member otherwise).

Rules (OpenAI's API reference; vLLM's and Triton's frontends where OpenAI leaves room):
- ``model`` is required everywhere.  Unknown members are ignored (vLLM and Triton pass extras to the engine;
  OpenAI's SDK sends ``extra_body`` members this way).
- ``max_completion_tokens`` wins over the deprecated ``max_tokens`` (chat); none: the server's default.
- ``stop``: a string or a list of at most 4 strings of 1 to 1024 characters.  ``n``: 1 to 128, and at most 128
  choices (prompts times ``n``) in a request: each is a model call.  ``temperature`` 0 to 2,
  ``top_p`` 0 to 1, penalties -2 to 2, ``seed`` any integer.
- ``stream_options`` only with ``stream: true`` (OpenAI's rule); ``include_usage`` a boolean.  Where Triton's
  frontend has words for a refusal, they are its words.
- Chat ``messages``: a non-empty list of objects with a ``role`` string; ``content`` a string, null (an
  assistant's tool calls) or a list of text parts (joined; other part types are refused: no model here
  takes images).  ``tools``: a list of ``{"type": "function", "function": {"name", ...}}``; ``tool_choice``:
  ``none`` / ``auto`` / ``required`` or ``{"type": "function", "function": {"name"}}`` naming a given tool.
- Completions ``prompt``: a string, a list of strings (one choice group each), a list of token ids or a list of
  token-id lists (ids are non-negative integers; the model's tokenizer decodes them, or they are refused, later);
  ``suffix`` a string (not with ``echo``); ``echo``; ``logprobs`` an integer 0 to 5.  Chat ``logprobs`` is a
  boolean, ``top_logprobs`` 0 to 20 and needs ``logprobs``.
- Embeddings ``input``: a string, a list of strings, a list of token ids or a list of token-id lists, none
  empty, at most 2048 items; ``encoding_format`` ``float`` or ``base64``; ``dimensions`` at least 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import BadParameter
from .fields import Fields, parse_object

#: Tokens generated when a request names no limit (Triton's frontend defaults to 16 as well).
DEFAULT_MAX_TOKENS = 16
MAX_N = 128
MAX_STOPS = 4
#: A stop string longer than this is refused (each is looked for in every delta).
MAX_STOP_LENGTH = 1024
#: At most this many choices (prompts times ``n``) in one request: each is a model call running at once.
MAX_CHOICES = 128
MAX_EMBEDDING_INPUTS = 2048
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass
class Sampling:
    """What every generation request shares; ``parameters()`` is the model's ``sampling_parameters`` JSON."""

    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    #: How many top alternatives per token to return; None: no log probabilities.
    logprobs: int | None = None
    user: str | None = None

    def parameters(self, seed: int | None) -> dict[str, Any]:
        """vLLM's sampling parameters (the names its Triton model reads), unset ones left out."""
        params: dict[str, Any] = {"max_tokens": self.max_tokens}
        for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        if self.stop:
            params["stop"] = self.stop
        if seed is not None:
            params["seed"] = seed
        if self.logprobs is not None:
            params["logprobs"] = self.logprobs
        return params


@dataclass
class CompletionRequest(Sampling):
    prompts: list[str] = field(default_factory=list)
    #: The prompts as token ids (the token-id forms; ``prompts`` is empty until they are decoded).
    token_prompts: list[list[int]] | None = None
    suffix: str | None = None
    echo: bool = False


@dataclass
class ChatRequest(Sampling):
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    #: "none", "auto" or "required" (also when one function is forced: ``forced_tool`` names it).
    tool_choice: str = "auto"
    forced_tool: str | None = None

    @property
    def tool_choice_name(self) -> str | None:
        """What the model is told of ``tool_choice`` (None without tools): the forced function, else the mode."""
        if not self.tools:
            return None
        return self.forced_tool or self.tool_choice

    def model_parameters(self) -> dict[str, str]:
        """Request parameters beside the sampling ones: ``tool_choice`` when tools were given."""
        choice = self.tool_choice_name
        return {} if choice is None else {"tool_choice": choice}


@dataclass
class EmbeddingRequest:
    model: str
    #: Each input as text, or as token ids (the token-array forms).
    texts: list[str] | None
    tokens: list[list[int]] | None
    base64: bool = False
    dimensions: int | None = None

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.tokens or ())


def _sampling(fields: Fields, record: Sampling) -> None:
    record.stream = fields.boolean("stream", False)
    options = fields.optional_object("stream_options")
    if options is not None:
        if not record.stream:
            raise BadParameter("stream_options", "`stream_options` can only be used when `stream` is True")
        record.include_usage = Fields(options, "stream_options.").boolean("include_usage", False)
    record.temperature = fields.number("temperature", 0.0, 2.0)
    record.top_p = fields.number("top_p", 0.0, 1.0)
    record.presence_penalty = fields.number("presence_penalty", -2.0, 2.0)
    record.frequency_penalty = fields.number("frequency_penalty", -2.0, 2.0)
    record.n = fields.integer("n", 1, MAX_N) or 1
    seed = fields.doc.get("seed")
    if seed is not None and type(seed) is not int:
        raise fields.bad("seed", "an integer")
    record.seed = seed
    record.user = fields.optional_str("user")
    stop = fields.doc.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if type(stop) is not list or len(stop) > MAX_STOPS or any(
            type(s) is not str or not s or len(s) > MAX_STOP_LENGTH for s in stop
        ):
            raise fields.bad("stop", f"a string or a list of at most {MAX_STOPS} strings of 1 to "
                             f"{MAX_STOP_LENGTH} characters")
        record.stop = stop


def parse_completion(body: bytes) -> CompletionRequest:
    fields = Fields(parse_object(body, "completion request"))
    record = CompletionRequest(model=fields.required_str("model"))
    _sampling(fields, record)
    record.max_tokens = fields.integer("max_tokens", 1) or DEFAULT_MAX_TOKENS
    record.echo = fields.boolean("echo", False)
    record.logprobs = fields.integer("logprobs", 0, 5)
    if "prompt" not in fields.doc:
        raise BadParameter("prompt", "'prompt' is required")
    prompt = fields.doc["prompt"]
    if type(prompt) is str:
        record.prompts = [prompt]
    elif type(prompt) is list and prompt and all(type(p) is str for p in prompt):
        record.prompts = prompt
    elif type(prompt) is list and prompt and _token_ids(prompt):
        record.token_prompts = [prompt]
    elif type(prompt) is list and prompt and all(type(p) is list and p and _token_ids(p) for p in prompt):
        record.token_prompts = prompt
    else:
        raise fields.bad("prompt", "a string, a list of strings, a list of token ids or a list of token-id lists, "
                         "none of them empty")
    count = len(record.prompts or record.token_prompts or ())
    if count * record.n > MAX_CHOICES:
        raise BadParameter("prompt", f"{count} prompts times n={record.n} make more than {MAX_CHOICES} choices")
    record.suffix = fields.optional_str("suffix")
    if record.suffix is not None and record.echo:
        raise BadParameter("suffix", "'suffix' and 'echo' cannot be used together")
    return record


def _token_ids(values: list[Any]) -> bool:
    return all(type(v) is int and v >= 0 for v in values)


def parse_chat(body: bytes) -> ChatRequest:
    fields = Fields(parse_object(body, "chat completion request"))
    record = ChatRequest(model=fields.required_str("model"))
    _sampling(fields, record)
    record.max_tokens = (
        fields.integer("max_completion_tokens", 1) or fields.integer("max_tokens", 1) or DEFAULT_MAX_TOKENS
    )
    if fields.boolean("logprobs", False):
        record.logprobs = fields.integer("top_logprobs", 0, 20) or 0
    elif fields.doc.get("top_logprobs") is not None:
        raise BadParameter("top_logprobs", "`top_logprobs` can only be used when `logprobs` is True")
    record.messages = _messages(fields)
    record.tools = _tools(fields)
    record.tool_choice, record.forced_tool = _tool_choice(fields, record.tools)
    return record


def _messages(fields: Fields) -> list[dict[str, Any]]:
    messages = fields.optional_list("messages")
    if not messages:
        raise BadParameter("messages", "'messages' is required: a non-empty list of messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if type(message) is not dict:
            raise BadParameter(where, f"'{where}' must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise BadParameter(f"{where}.role", f"'{where}.role' must be one of {', '.join(sorted(ROLES))}")
        content = message.get("content")
        if type(content) is list:
            texts = []
            for part in content:
                if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) is not str:
                    raise BadParameter(f"{where}.content", f"'{where}.content' parts must be text parts "
                                       "({\"type\": \"text\", \"text\": ...}); this server takes no images or audio")
                texts.append(part["text"])
            message = {**message, "content": "".join(texts)}
        elif content is not None and type(content) is not str:
            raise BadParameter(f"{where}.content", f"'{where}.content' must be a string, a list of text parts or null")
        checked.append(message)
    return checked


def _tools(fields: Fields) -> list[dict[str, Any]] | None:
    tools = fields.optional_list("tools")
    if tools is None:
        return None
    for index, tool in enumerate(tools):
        function = tool.get("function") if type(tool) is dict else None
        if type(tool) is not dict or tool.get("type") != "function" or type(function) is not dict or \
                type(function.get("name")) is not str or not function["name"]:
            raise BadParameter(f"tools[{index}]", f"'tools[{index}]' must be "
                               "{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}")
    return tools


def _tool_choice(fields: Fields, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    choice = fields.doc.get("tool_choice")
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise BadParameter("tool_choice", "'tool_choice' is 'required' but no 'tools' were given")
        return choice, None
    function = choice.get("function") if type(choice) is dict else None
    name = function.get("name") if type(function) is dict else None
    if type(name) is not str:
        raise fields.bad("tool_choice", "'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}")
    if not any(tool["function"]["name"] == name for tool in tools or ()):
        raise BadParameter("tool_choice", f"'tool_choice' names the function '{name}', which is not in 'tools'")
    return "required", name


def parse_embedding(body: bytes) -> EmbeddingRequest:
    fields = Fields(parse_object(body, "embedding request"))
    model = fields.required_str("model")
    encoding = fields.doc.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise fields.bad("encoding_format", "'float' or 'base64'")
    dimensions = fields.integer("dimensions", 1)
    if "input" not in fields.doc:
        raise BadParameter("input", "'input' is required")
    value = fields.doc["input"]
    texts: list[str] | None = None
    tokens: list[list[int]] | None = None
    if type(value) is str:
        texts = [value]
    elif type(value) is list and value and all(type(v) is str for v in value):
        texts = value
    elif type(value) is list and value and all(type(v) is int for v in value):
        tokens = [value]
    elif type(value) is list and value and all(
        type(v) is list and v and all(type(t) is int for t in v) for v in value
    ):
        tokens = value
    else:
        raise fields.bad("input", "a string, a list of strings, a list of token ids or a list of token-id lists, "
                         "none of them empty")
    record = EmbeddingRequest(model, texts, tokens, encoding == "base64", dimensions)
    if record.count > MAX_EMBEDDING_INPUTS:
        raise BadParameter("input", f"'input' has {record.count} items; at most {MAX_EMBEDDING_INPUTS} are allowed")
    if texts is not None and any(not t for t in texts):
        raise BadParameter("input", "'input' must not contain an empty string")
    return record

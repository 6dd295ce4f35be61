"""Chat messages -> one prompt, through a Jinja chat template (Hugging Face's convention).

Rules:
- The template is the model's: ``chat_template.jinja`` in its folder, else ``chat_template`` of its
  ``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` where ``default`` is taken);
  a model with neither gets :data:`DEFAULT_TEMPLATE`.  The frontend reads the files; this module only renders.
- Templates render in Jinja's immutable sandbox (a template is data: it may not reach Python's internals),
  with Hugging Face's variables: ``messages``, ``tools``, ``add_generation_prompt`` (true), ``tool_choice``
  (``none`` / ``auto`` / ``required``, or the name of the function the request forces),
  ``bos_token`` / ``eos_token`` (empty unless the tokenizer config names them) and ``raise_exception``.
- A template that fails to render is the request's fault when it raised on purpose (``raise_exception``: 400)
  and the model's otherwise (500); both name the model.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import InternalError, InvalidArgument

#: For a model that brings no template: each message as ``<|role|>`` and its text, tools as JSON up front.
DEFAULT_TEMPLATE = (
    "{% if tools %}<|tools|>\n{{ tools | tojson }}\n{% endif %}"
    "{% for message in messages %}<|{{ message.role }}|>\n{{ message.content or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class TemplateRaised(Exception):
    """``raise_exception`` in a template: the request broke the template's rules."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


class ChatTemplate:
    """One compiled template and the tokens it is rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.policies["json.dumps_function"] = lambda value, **_: orjson.dumps(value).decode()
        environment.globals["raise_exception"] = _raise_exception
        try:
            self.template = environment.from_string(source)
        except TemplateSyntaxError as exc:
            raise InternalError(f"the chat template does not compile: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
        tool_choice: str | None = None,
    ) -> str:
        from jinja2 import TemplateError

        try:
            return self.template.render(
                messages=messages, tools=tools, tool_choice=tool_choice, add_generation_prompt=True,
                bos_token=self.bos_token, eos_token=self.eos_token,
            )
        except TemplateRaised as exc:
            raise InvalidArgument(f"model '{model}' chat template refused the messages: {exc}") from None
        except (TemplateError, TypeError, ValueError) as exc:
            raise InternalError(f"model '{model}' chat template failed: {type(exc).__name__}: {exc}") from None


def template_from_tokenizer_config(config: dict[str, Any]) -> ChatTemplate | None:
    """The template a Hugging Face ``tokenizer_config.json`` carries, if any."""
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        return None

    def token(key: str) -> str:
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken's form
            value = value.get("content")
        return value if isinstance(value, str) else ""

    return ChatTemplate(source, token("bos_token"), token("eos_token"))

"""The OpenAI handlers, and where they are mounted on a router.

Rules:
- Every handler answers its failures in OpenAI's body (``{"error": {"message", "type", "param", "code"}}``):
  404 for an unknown or unready model, 400 naming the member for a bad parameter, the core error's status
  otherwise.
- ``GET /v1/models`` lists the ready models (``id``, ``object``, ``created``, ``owned_by``); ``GET
  /v1/models/{m}`` retrieves one.  ``POST /v1/models/{m}/load`` and ``/unload`` are Triton's frontend's: 400
  unless ``--model-control-mode=explicit``, 400 to load a loaded model or unload one not loaded, one at a time;
  the Core's model control runs in the executor (a load may take a while, the loop keeps serving).
- Bodies at least ``json_pool.OFF_LOOP_JSON_BYTES`` are parsed in the JSON processes when the server has them (the
  pool's bounded queue: a full pool answers 503 at once).
- Mounted two ways (:func:`mount`): alone, at ``/v1`` on its own port (``--openai-port``, as Triton's frontend
  is), and beside the V2 API on the main port, at ``/openai/v1`` (KServe's path for its OpenAI routes) and at
  ``/v1``, where KServe's V1 protocol has ``GET /v1/models[/{m}]`` already: those two answer both APIs' fields
  in one body (``models`` and ``data``; ``name``/``ready`` and ``id``/``object``...), and keep KServe's error
  bodies (see COMPATIBILITY.md).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

import numpy as np

from ....core import Core
from ....errors import InferenceError, InternalError, InvalidArgument, NotFound
from ....wire.openai import embeddings, requests
from ....wire.openai.answers import Envelope
from ....wire.openai.errors import error_of
from ... import restricted
from ...readiness import asked
from ..bodies import read_body
from ..json_pool import JsonPool
from ..router import PatternRoute, Request, Response, Router, StreamingResponse, json_response
from . import generation
from .templates import ChatTemplates
from .tokenizers import ModelTokenizers

JSON = b"application/json"
EVENT_STREAM = b"text/event-stream; charset=utf-8"
OWNER = "fastoip"
OpenAIHandler = Callable[..., Awaitable[Response | StreamingResponse]]
#: A conversation with fewer characters of content than this renders its chat template on the loop.
RENDER_ON_LOOP_CHARS = 32 << 10


def _conversation_chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(m["content"]) if isinstance(m.get("content"), str) else 0 for m in messages)


def openai_errors(handler: OpenAIHandler) -> OpenAIHandler:
    """``handler`` with its core errors answered in OpenAI's body."""

    @wraps(handler)
    async def answer(*args: Any) -> Response | StreamingResponse:
        try:
            return await handler(*args)
        except InferenceError as exc:
            status, body = error_of(exc)
            return Response(status, [(b"content-type", JSON)], body)

    return answer


def _parameters(core: Core, model: str) -> dict[str, str]:
    config = core.model_config(model)
    return {key: value.string_value for key, value in config.parameters.items()}


class OpenAIEndpoints:
    """The handlers of OpenAI's API over one Core."""

    def __init__(self, core: Core, max_body_size: int, json_pool: JsonPool | None = None) -> None:
        self.core = core
        self.max_body_size = max_body_size
        self.json_pool = json_pool
        self.created = int(time.time())
        self.templates = ChatTemplates()
        self.tokenizers = ModelTokenizers()
        #: One load or unload at a time through this API, each checked against the state it finds (Triton's
        #: frontend: a second load of a loaded model is 400, not a reload).
        self.control_lock = asyncio.Lock()

    # -- bodies and models ------------------------------------------------------------------
    async def _parse(self, request: Request, parse: Callable[[bytes], Any]) -> Any:
        body = await read_body(request, self.max_body_size)
        if self.json_pool is not None:  # (off the loop when large, within the pool's bounds: issue 37)
            return await self.json_pool.run(len(body), parse, bytes(body))
        return parse(bytes(body))

    async def _ready(self, model: str) -> None:
        """404 in OpenAI's words unless ``model`` is ready to serve."""
        if not await asked(self.core, model, "", lambda: self.core.model_ready(model)):
            raise NotFound(f"The model '{model}' does not exist or is not ready")

    def model_json(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": self.created, "owned_by": OWNER}

    def ready_models(self) -> list[str]:
        return sorted({entry.name for entry in self.core.repository_index(ready_only=True)})

    @openai_errors
    async def openai_list_models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [self.model_json(m) for m in self.ready_models()]})

    @openai_errors
    async def openai_retrieve_model(self, request: Request, model: str) -> Response:
        await self._ready(model)
        return json_response(self.model_json(model))

    def _check_explicit(self) -> None:
        if self.core.model_control_mode != "explicit":
            raise InvalidArgument("Model load/unload requires --model-control-mode=explicit")

    @openai_errors
    async def openai_load_model(self, request: Request, model: str) -> Response:
        self._check_explicit()
        async with self.control_lock:
            if await asked(self.core, model, "", lambda: self.core.model_ready(model)):
                raise InvalidArgument(f"Model '{model}' is already loaded")
            await self._control(f"Failed to load model '{model}'", self.core.load_model, model, None)
        return json_response(self.model_json(model))

    @openai_errors
    async def openai_unload_model(self, request: Request, model: str) -> Response:
        self._check_explicit()
        async with self.control_lock:
            if not await asked(self.core, model, "", lambda: self.core.model_ready(model)):
                raise InvalidArgument(f"Unknown model: {model}")
            await self._control(f"Failed to unload model '{model}'", self.core.unload_model, model, False)
        return json_response({"status": "success", "model": model})

    async def _control(self, failure: str, action: Callable[..., None], *args: Any) -> None:
        """``action`` in the executor; its failure 400 (the request's fault) or 500, in Triton's words."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, action, *args)
        except InferenceError as exc:
            if exc.http_status >= 500:
                raise InternalError(f"{failure}: {exc.message}") from None
            raise InvalidArgument(f"{failure}: {exc.message}") from None

    # -- embeddings ---------------------------------------------------------------------------
    @openai_errors
    async def openai_embeddings(self, request: Request) -> Response:
        parsed: requests.EmbeddingRequest = await self._parse(request, requests.parse_embedding)
        await self._ready(parsed.model)
        metadata = self.core.model_metadata(parsed.model)
        spec = embeddings.embedding_model(
            parsed.model,
            {t.name: (t.datatype, t.shape) for t in metadata.inputs},
            {t.name: (t.datatype, t.shape) for t in metadata.outputs},
            _parameters(self.core, parsed.model),
            self.core.model_config(parsed.model).max_batch_size,
        )
        infers, tokens = embeddings.embedding_requests(spec, parsed)
        # Core.infer_async for each part: the dynamic batcher merges them with other requests' parts
        answers = await asyncio.gather(*(self.core.infer_async(infer) for infer in infers))
        parts = [embeddings.vectors(spec, infer, answer) for infer, answer in zip(infers, answers, strict=True)]
        values = embeddings.fit_dimensions(spec, np.concatenate(parts), parsed.dimensions)
        body = embeddings.embeddings_json(parsed.model, values, parsed.base64, tokens)
        return Response(200, [(b"content-type", JSON)], body)

    # -- generation ---------------------------------------------------------------------------
    @openai_errors
    async def openai_completions(self, request: Request) -> Response | StreamingResponse:
        parsed: requests.CompletionRequest = await self._parse(request, requests.parse_completion)
        await self._ready(parsed.model)
        parameters = _parameters(self.core, parsed.model)
        tokenizer = await self.tokenizers.get(self.core.model_directory(parsed.model), parameters.get("tokenizer"))
        plan = generation.plan_completion(self.core, parsed, tokenizer, parameters.get("fim_template"))
        return await self._generate(plan, Envelope("cmpl", parsed.model))

    @openai_errors
    async def openai_chat_completions(self, request: Request) -> Response | StreamingResponse:
        parsed: requests.ChatRequest = await self._parse(request, requests.parse_chat)
        await self._ready(parsed.model)
        directory = self.core.model_directory(parsed.model)
        template = await self.templates.get(directory)
        render = (parsed.model, parsed.messages, parsed.tools, parsed.tool_choice_name)
        if _conversation_chars(parsed.messages) < RENDER_ON_LOOP_CHARS:
            prompt = template.render(*render)
        else:  # about a millisecond per 40 000 characters: a long conversation renders in a thread
            prompt = await asyncio.get_running_loop().run_in_executor(None, template.render, *render)
        parameters = _parameters(self.core, parsed.model)
        parser = parameters.get("tool_call_parser") or generation.tools.DEFAULT_PARSER
        tokenizer = await self.tokenizers.get(directory, parameters.get("tokenizer"))
        plan = generation.plan_chat(self.core, parsed, prompt, parser, tokenizer)
        return await self._generate(plan, Envelope("chatcmpl", parsed.model))

    async def _generate(self, plan: generation.Plan, envelope: Envelope) -> Response | StreamingResponse:
        states = generation.start_choices(self.core, plan, envelope.id)
        if not plan.sampling.stream:
            body = await generation.complete(plan, states, envelope)
            return Response(200, [(b"content-type", JSON)], body)
        try:
            await generation.first_answer(states)
        except BaseException:
            for state in states:
                state.call.close()
            raise
        headers = [(b"content-type", EVENT_STREAM), (b"cache-control", b"no-cache")]
        return StreamingResponse(200, headers, generation.stream(plan, states, envelope))


def mount(
    router: Router, endpoints: OpenAIEndpoints, prefix: str, *, models: bool = True,
    models_group: str = restricted.METADATA,
) -> None:
    """Serve OpenAI's routes under ``prefix`` (``/v1`` or ``/openai/v1``) on ``router``.

    ``models=False`` leaves ``GET {prefix}/models[/{m}]`` to the router's own tables (KServe's V1 on the main
    port answers them, with OpenAI's fields added by the caller).  ``models_group``: the restricted group of
    retrieving a model (Triton's HTTP groups call it metadata, its OpenAI frontend's model-repository).
    """
    router.fixed_paths[f"{prefix}/embeddings"] = {"POST": endpoints.openai_embeddings}
    router.fixed_paths[f"{prefix}/completions"] = {"POST": endpoints.openai_completions}
    router.fixed_paths[f"{prefix}/chat/completions"] = {"POST": endpoints.openai_chat_completions}
    escaped = re.escape(prefix)
    model = r"/models/([^/:]+)"  # a model name holds no '/' (and no ':', KServe's V1 action separator)
    if models:
        router.fixed_paths[f"{prefix}/models"] = {"GET": endpoints.openai_list_models}
        router.pattern_paths.append(PatternRoute(
            re.compile(escaped + model), prefix + "/models/{model_name}", {"GET": endpoints.openai_retrieve_model},
            models_group,
        ))
    for action, handler in (("load", endpoints.openai_load_model), ("unload", endpoints.openai_unload_model)):
        router.pattern_paths.append(PatternRoute(
            re.compile(escaped + model + "/" + action), f"{prefix}/models/{{model_name}}/{action}",
            {"POST": handler}, restricted.MODEL_REPOSITORY,
        ))

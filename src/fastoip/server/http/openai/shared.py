"""``GET /v1/models`` and ``GET /v1/models/{m}`` on the main port, where KServe's V1 protocol and OpenAI's API share
the paths: one body with both APIs' fields, so both clients read what they expect.

- The list: KServe's ``{"models": [every known name]}`` plus OpenAI's ``"object": "list"`` and ``data`` (the
  ready models).
- One model: KServe's ``{"name", "ready": true}`` plus OpenAI's ``id``, ``object``, ``created``, ``owned_by``;
  an unknown model (404) or one not ready (503) keeps KServe's answer (OpenAI's SDK raises on the status alone).
"""

from __future__ import annotations

import orjson

from ..router import Request, Response, json_response
from ..v1 import V1Endpoints
from .endpoints import OpenAIEndpoints


class SharedModelRoutes:
    def __init__(self, kserve: V1Endpoints, openai: OpenAIEndpoints) -> None:
        self.kserve = kserve
        self.openai = openai

    async def v1_and_openai_models(self, request: Request) -> Response:
        answer = await self.kserve.v1_models(request)
        doc = orjson.loads(answer.body)
        doc["object"] = "list"
        doc["data"] = [self.openai.model_json(m) for m in self.openai.ready_models()]
        return json_response(doc)

    async def v1_and_openai_model(self, request: Request, model: str) -> Response:
        answer = await self.kserve.v1_model_ready(request, model)
        if answer.status != 200:
            return answer
        return json_response({**orjson.loads(answer.body), **self.openai.model_json(model)})

"""OpenAI's API alone on a port of its own (``--openai-port``), as Triton's OpenAI frontend serves it.

Paths: OpenAI's under ``/v1`` (:func:`.endpoints.mount`), ``GET /health/ready`` (Triton's frontend has it:
200 when the server is ready, else 503) and ``GET /metrics`` (the Prometheus text, with the endpoint picker's
names: :mod:`fastoip.metrics`).  Every error, the router's own (404 path, 405) included, is in OpenAI's body.

Restrictions (``--openai-restricted-api``, else ``--http-restricted-api``) use the groups of Triton's OpenAI
frontend: ``inference`` (embeddings, completions, chat), ``model-repository`` (listing, retrieving, loading and
unloading models), ``metrics`` and ``health``; a request without the header is 401, as there.
"""

from __future__ import annotations

from ....core import Core
from ....wire.openai.errors import error_body
from ... import restricted
from ...readiness import asked
from ..errors import Forbidden
from ..json_pool import JsonPool
from ..router import Request, Response, Router
from .endpoints import OpenAIEndpoints, mount

TEXT = b"text/plain; version=0.0.4; charset=utf-8"


class OpenAIFrontend(Router):
    """The ASGI application of the OpenAI port."""

    def __init__(self, core: Core, max_body_size: int, json_pool: JsonPool | None = None) -> None:
        super().__init__()
        self.core = core
        self.endpoints = OpenAIEndpoints(core, max_body_size, json_pool)
        mount(self, self.endpoints, "/v1", models_group=restricted.OPENAI_MODEL_REPOSITORY)
        self.fixed_paths["/health/ready"] = {"GET": self.health_ready}
        self.fixed_paths["/metrics"] = {"GET": self.metrics}
        self.fixed_path_categories = {
            **{f"/v1/{path}": restricted.OPENAI_INFERENCE
               for path in ("embeddings", "completions", "chat/completions")},
            "/v1/models": restricted.OPENAI_MODEL_REPOSITORY,
            "/metrics": restricted.OPENAI_METRICS,
            "/health/ready": restricted.HEALTH,
        }

    def error_answer(self, status: int, message: str) -> Response:
        if status == Forbidden.http_status:  # only a restriction answers 403 here; Triton's OpenAI frontend: 401
            status = 401
        return Response(status, [(b"content-type", b"application/json")], error_body(status, message))

    async def health_ready(self, request: Request) -> Response:
        reason = await asked(self.core, None, "", self.core.not_ready_reason)
        return self.error_answer(503, reason) if reason else Response(200, [], b"")

    async def metrics(self, request: Request) -> Response:
        return Response(200, [(b"content-type", TEXT)], self.core.prometheus_metrics().encode())


"""KServe's V1 protocol on the HTTP frontend: ``GET /``, ``GET /v1/models``, ``GET /v1/models/<m>``,
``POST /v1/models/<m>:predict``, ``POST /v1/models/<m>:explain``.

Rules (KServe's ``protocol/rest/v1_endpoints.py`` and ``errors.py``):
- Translate only: the JSON mapping is :mod:`fastoip.wire.v1`; predict runs through the Core's one
  infer path (``infer_async``), so every scheduler, statistic and trace sees it as a V2 request.
- ``GET /`` answers ``{"status": "alive"}`` (what KServe's V1 client reads as liveness);
  ``GET /v1/models`` answers ``{"models": [names]}`` (every model the repository knows).
- A model not ready answers 503 and an unknown model 404, with KServe's messages, before the body is read.
- ``:explain``: fastoip hosts no explainers, so it answers as KServe answers for a model without one
  (no ``explainer_host``): 501 ``{"error": "Could not find explainer_host."}``, after the same readiness
  checks and after the body is read as JSON (a body that is not a JSON object is 400, as in KServe).
"""

from __future__ import annotations

from ...core import CallContext, Core
from ...wire import v1 as wire
from ..readiness import asked
from .intake import BodyIntake
from .json_docs import check_json_object
from .router import Request, Response, error_response, json_response

JSON = b"application/json"
#: KServe's answer to ``:explain`` for a model that has no explainer (``Model.explain`` without ``explainer_host``).
NO_EXPLAINER = "Could not find explainer_host."


class V1Endpoints:
    """The V1 handlers; the router calls the model ones with the model name."""

    def __init__(self, core: Core, intake: BodyIntake) -> None:
        self.core = core
        self.intake = intake

    async def v1_root(self, request: Request) -> Response:
        return json_response({"status": "alive"})

    async def v1_models(self, request: Request) -> Response:
        return json_response({"models": sorted({entry.name for entry in self.core.repository_index()})})

    async def v1_model_ready(self, request: Request, model: str) -> Response:
        refusal = await self._refusal(model)
        return refusal or json_response({"name": model, "ready": True})

    async def v1_predict(self, request: Request, model: str) -> Response:
        refusal = await self._refusal(model)
        if refusal is not None:
            return refusal
        body = await self.intake.body(request)
        inputs = self.core.model_metadata(model).inputs
        infer_request, rows_added = await self.intake.parse(body, wire.decode_predict_request, model, body, inputs)
        response = await self.core.infer_async(infer_request, CallContext(trace_headers=request.headers))
        return Response(200, [(b"content-type", JSON)], wire.encode_predictions(response, rows_added))

    async def v1_explain(self, request: Request, model: str) -> Response:
        refusal = await self._refusal(model)
        if refusal is not None:
            return refusal
        body = await self.intake.body(request)
        await self.intake.parse(body, check_json_object, body, "V1 explain request")
        return error_response(501, NO_EXPLAINER)

    async def _refusal(self, model: str) -> Response | None:
        """KServe's answer for a model that cannot serve (404 unknown, 503 not ready), else None."""
        if await asked(self.core, model, "", lambda: self.core.model_ready(model)):
            return None
        if not self.core.model_known(model):
            return error_response(404, f"Model with name {model} does not exist.")
        return error_response(503, f"Model with name {model} is not ready.")

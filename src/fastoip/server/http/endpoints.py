"""The HTTP/REST endpoints: one handler per KServe V2 / Triton REST endpoint, translating only.

Rules:
- Translate only: HTTP <-> Core calls and the Core's typed answers -> JSON
  (orjson writes the answer dataclasses as they are).  Inference bodies are
  decoded and encoded by the wire codec :mod:`fastoip.wire.http` (sans-I/O).
- The event loop never waits on a model: infer awaits ``core.infer_async``;
  model load and unload, and opening a CUDA IPC handle, run in the loop's
  default executor.  The other Core calls are dictionary lookups and run inline.
- Shared memory, trace and log settings use Triton's paths and JSON forms, so
  tritonclient.http works unchanged: region status is a list of
  ``{"name", "key", "offset", "byte_size"}``; trace settings answer
  ``trace_level`` as a list and every other setting as one string, and take
  a string, a list of strings or null (clear) per setting; log settings are
  plain JSON values (null: left as is).  CUDA shared memory answers 503
  where the server has no GPU (as the gRPC frontend answers UNAVAILABLE).
- Readiness answers carry the Core's not-ready reason, the same one every frontend has.  Server health
  answers ``{"live": true}`` / ``{"ready": true}`` as KServe's server does (its REST client parses them;
  tritonclient reads the status only); a model's V2 readiness keeps the spec's empty body.
- KServe's V1 protocol (``/``, ``/v1/models``, ``/v1/models/<m>[:predict|:explain]``): :mod:`.v1`.
- OpenAI's API (``/v1/embeddings``, ``/v1/completions``, ``/v1/chat/completions``, and all of it under
  ``/openai/v1``): :mod:`.openai`; the two ``/v1/models`` paths answer both APIs (:mod:`.openai.shared`).
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

from ...core import CUDA, SYSTEM, CallContext, Core, config_to_json
from ...errors import InferenceError, InvalidArgument, OneResponseCall
from ...model_config import is_model_settings_config
from ...tracing import FrontendTrace
from ...wire import http as http_codec
from ...wire.http import json_excerpt
from ..forward_headers import HeaderForwarder
from ..readiness import asked
from . import docs_assets, openapi
from .bodies import compress, inference_header_length, off_loop_if_large, response_encoding
from .body_budget import BodyBudget
from .generate import GenerateEndpoints
from .intake import CONTROL_BODY_BYTES, MAX_BINARY_INPUT_BYTES, BodyIntake
from .json_docs import (
    base64_value,
    integer_field,
    load_parameters,
    optional_json_object,
    parameters_of,
    trace_settings_json,
)
from .json_pool import JsonPool
from .openai.endpoints import OpenAIEndpoints, mount
from .openai.shared import SharedModelRoutes
from .router import EMPTY_OK, Request, Response, Router, client_disconnect, error_response, json_response
from .v1 import V1Endpoints

#: KServe's health bodies (its REST client reads them); Triton's clients read only the status.
LIVE = json_response({"live": True})
READY = json_response({"ready": True})

#: Triton's words for a repository index request whose 'ready' is not a boolean.
READY_NOT_BOOLEAN = "Invalid value for 'ready': expected a boolean"
READY_NOT_A_VALUE = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def index_ready(body: bytes | bytearray) -> Any:
    """A repository index request's ``ready`` (False when absent); only it comes back from the JSON pool."""
    try:
        doc = optional_json_object(body, "repository index request")
    except InvalidArgument:
        if READY_NOT_A_VALUE.match(body):  # too deep to parse, but 'ready' is visibly an array or object
            raise InvalidArgument(READY_NOT_BOOLEAN) from None
        raise
    ready = doc.get("ready")
    if ready is None:  # absent, or null
        return False
    return ready if type(ready) is bool else json_excerpt(ready)

class HttpFrontend(Router):
    """The ASGI application: the router's tables filled with one handler per endpoint."""

    def __init__(self, core: Core, max_body_size: int, json_pool: JsonPool | None = None,
                 max_binary_size: int = MAX_BINARY_INPUT_BYTES, body_budget: BodyBudget | None = None) -> None:
        super().__init__()
        self.core = core
        self.max_body_size = max_body_size
        #: Triton's --http-header-forward-pattern (None: no header becomes a parameter).
        self.forward_headers: HeaderForwarder | None = None
        #: issue 27: large JSON requests are decoded in worker processes, off the loop (json_pool.py)
        self.json_pool = json_pool or JsonPool()
        #: issue 37: every body comes in through it (read, inflated, parsed off the loop, bounded)
        self.intake = BodyIntake(max_body_size, self.json_pool, max_binary_size, body_budget)
        self.fixed_paths = {
            "/v2": {"GET": self.server_metadata},
            "/v2/health/live": {"GET": self.server_live},
            "/v2/health/ready": {"GET": self.server_ready},
            "/v2/models/stats": {"GET": self.all_model_stats},
            "/v2/repository/index": {"POST": self.repository_index},
            "/v2/trace/setting": {"GET": self.get_trace_settings, "POST": self.update_trace_settings},
            "/v2/logging": {"GET": self.get_log_settings, "POST": self.update_log_settings},
            "/v2/docs": {"GET": self.docs_page},
            "/v2/docs/openapi.json": {"GET": self.openapi_document},
            "/v2/docs/swagger-ui-bundle.js": {"GET": self.docs_script},
            "/v2/docs/swagger-ui.css": {"GET": self.docs_style},
        }
        v1 = V1Endpoints(core, self.intake)
        self.fixed_paths["/"] = {"GET": v1.v1_root}
        self.fixed_paths["/v1/models"] = {"GET": v1.v1_models}
        self.v1_model_paths = {
            None: {"GET": v1.v1_model_ready},
            "predict": {"POST": v1.v1_predict},
            "explain": {"POST": v1.v1_explain},
        }
        openai = OpenAIEndpoints(core, max_body_size, self.json_pool)
        mount(self, openai, "/openai/v1")
        mount(self, openai, "/v1", models=False)
        shared = SharedModelRoutes(v1, openai)
        self.fixed_paths["/v1/models"] = {"GET": shared.v1_and_openai_models}
        self.v1_model_paths[None] = {"GET": shared.v1_and_openai_model}
        generate = GenerateEndpoints(core, self.intake)
        self.model_paths = {
            None: {"GET": self.model_metadata},
            "ready": {"GET": self.model_ready},
            "infer": {"POST": self.infer},
            "generate": {"POST": generate.generate},
            "generate_stream": {"POST": generate.generate_stream},
            "config": {"GET": self.model_config},
            "stats": {"GET": self.model_stats},
            "trace/setting": {"GET": self.get_trace_settings, "POST": self.update_trace_settings},
        }
        self.repository_paths = {
            "load": {"POST": self.load_model},
            "unload": {"POST": self.unload_model},
        }
        self.shared_memory_paths = {
            ("system", "status"): {"GET": self.system_shared_memory_status},
            ("system", "register"): {"POST": self.register_system_shared_memory},
            ("system", "unregister"): {"POST": self.unregister_system_shared_memory},
            ("cuda", "status"): {"GET": self.cuda_shared_memory_status},
            ("cuda", "register"): {"POST": self.register_cuda_shared_memory},
            ("cuda", "unregister"): {"POST": self.unregister_cuda_shared_memory},
        }
        self._openapi: Response | None = None  # built on first request: the tables above do not change

    # -- health and metadata ---------------------------------------------------------------
    async def server_live(self, request: Request) -> Response:
        if self.core.server_live():
            return LIVE
        return error_response(400, "the server is not live")

    async def server_ready(self, request: Request) -> Response:
        reason = await asked(self.core, None, "", self.core.not_ready_reason)
        return error_response(400, reason) if reason else READY

    async def model_ready(self, request: Request, model: str, version: str) -> Response:
        reason = await asked(self.core, model, version, lambda: self.core.model_not_ready_reason(model, version))
        return error_response(400, reason) if reason else EMPTY_OK

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request, model: str, version: str) -> Response:
        return json_response(self.core.model_metadata(model, version))

    async def model_config(self, request: Request, model: str, version: str) -> Response:
        return json_response(config_to_json(self.core.model_config(model, version)))

    async def model_stats(self, request: Request, model: str, version: str) -> Response:
        return json_response({"model_stats": self.core.statistics(model, version)})

    async def all_model_stats(self, request: Request) -> Response:
        return json_response({"model_stats": self.core.statistics()})

    # -- repository -------------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        # (the body limit, not the control one: Triton's QA sends a 500 KB document nested too deep)
        body = await self.intake.body(request)
        ready = await self.intake.parse(body, index_ready, body)
        if type(ready) is not bool:  # (the value's excerpt)
            raise InvalidArgument(f"{READY_NOT_BOOLEAN}, got {ready}")
        return json_response(self.core.repository_index(ready))

    async def load_model(self, request: Request, model: str) -> Response:
        self.core.check_model_control("load")  # issue 37: a load that will be refused is refused unread
        body = await self.intake.body(request)
        parameters = await self.intake.parse(body, load_parameters, body)
        loop = asyncio.get_running_loop()
        gone = threading.Event()
        load = loop.run_in_executor(None, self.core.load_model, model, parameters, gone)
        disconnected = asyncio.ensure_future(client_disconnect(request))
        try:
            await asyncio.wait((load, disconnected), return_when=asyncio.FIRST_COMPLETED)
            if not load.done():  # issue 37: the client went away: the load stops at its next step
                gone.set()
            await load
        finally:
            disconnected.cancel()
        return EMPTY_OK

    async def unload_model(self, request: Request, model: str) -> Response:
        self.core.check_model_control("unload")
        doc = await self.intake.control_document(request, "unload request")
        dependents = parameters_of(doc, "unload request").get("unload_dependents")
        if dependents is None:  # absent, or null
            dependents = False
        if type(dependents) is not bool:
            raise InvalidArgument(f"'unload_dependents' must be a boolean, got {json_excerpt(dependents)}")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.core.unload_model, model, dependents)
        return EMPTY_OK

    # -- shared memory -------------------------------------------------------------------------
    async def system_shared_memory_status(self, request: Request, region: str) -> Response:
        return json_response(self.core.shared_memory_status(region, SYSTEM))

    async def register_system_shared_memory(self, request: Request, region: str) -> Response:
        if not region:
            raise InvalidArgument(
                "registering system shared memory needs a region name: "
                "POST /v2/systemsharedmemory/region/<name>/register"
            )
        what = f"register request for system shared memory region '{region}'"
        doc = await self.intake.control_document(request, what)
        key = doc.get("key")
        if type(key) is not str or not key:
            raise InvalidArgument(f"the {what} needs 'key', the shared memory key (a string), got {json_excerpt(key)}")
        offset = integer_field(doc, "offset", what, minimum=0, default=0)
        byte_size = integer_field(doc, "byte_size", what, minimum=0)  # 0: the registry's "invalid args", as Triton
        self.core.register_system_shared_memory(region, key, offset, byte_size, request.client)
        return EMPTY_OK

    async def unregister_system_shared_memory(self, request: Request, region: str) -> Response:
        await self.intake.body(request, CONTROL_BODY_BYTES)  # tritonclient sends an empty body; nothing in it is used
        self.core.unregister_shared_memory(region, SYSTEM)
        return EMPTY_OK

    async def cuda_shared_memory_status(self, request: Request, region: str) -> Response:
        return json_response(self.core.shared_memory_status(region, CUDA))

    async def register_cuda_shared_memory(self, request: Request, region: str) -> Response:
        if not region:
            raise InvalidArgument(
                "registering CUDA shared memory needs a region name: POST /v2/cudasharedmemory/region/<name>/register"
            )
        what = f"register request for CUDA shared memory region '{region}'"
        doc = await self.intake.control_document(request, what)
        handle = doc.get("raw_handle")
        encoded = handle.get("b64") if isinstance(handle, dict) else None
        if encoded is None:
            raise InvalidArgument(
                f"the {what} needs 'raw_handle' as {{\"b64\": <base64 of a cudaIpcMemHandle_t>}}, "
                f"got {json_excerpt(handle)}"
            )
        raw_handle = base64_value(encoded, f"'raw_handle' of the {what}")
        device_id = integer_field(doc, "device_id", what, minimum=0, default=0)
        byte_size = integer_field(doc, "byte_size", what, minimum=0)  # 0: the registry's "invalid args", as Triton
        loop = asyncio.get_running_loop()
        # Opening an IPC handle talks to the driver: not on the event loop.
        await loop.run_in_executor(
            None, self.core.register_cuda_shared_memory, region, raw_handle, device_id, byte_size, request.client
        )
        return EMPTY_OK

    async def unregister_cuda_shared_memory(self, request: Request, region: str) -> Response:
        await self.intake.body(request, CONTROL_BODY_BYTES)  # tritonclient sends an empty body; nothing in it is used
        self.core.unregister_shared_memory(region, CUDA)
        return EMPTY_OK

    # -- trace and log settings ---------------------------------------------------------------------
    async def get_trace_settings(self, request: Request, model: str = "", version: str = "") -> Response:
        return json_response(trace_settings_json(self.core.trace_settings(model)))  # 404 for an unknown model

    async def update_trace_settings(self, request: Request, model: str = "", version: str = "") -> Response:
        doc = await self.intake.control_document(request, "trace setting request")
        changes: dict[str, list[str] | None] = {}
        for key, value in doc.items():
            if value is None or type(value) is str:
                changes[key] = value if value is None else [value]
            elif type(value) is list and all(type(item) is str for item in value):
                changes[key] = value
            else:
                raise InvalidArgument(
                    f"trace setting '{key}' must be a string, a list of strings or null, got {json_excerpt(value)}"
                )
        return json_response(trace_settings_json(self.core.update_trace_settings(changes, model)))  # 404: unknown

    async def get_log_settings(self, request: Request) -> Response:
        return json_response(self.core.log_settings())

    async def update_log_settings(self, request: Request) -> Response:
        doc = await self.intake.control_document(request, "log setting request")
        changes = {key: value for key, value in doc.items() if value is not None}  # Triton skips nulls
        return json_response(self.core.update_log_settings(changes))

    # -- documentation -------------------------------------------------------------------------
    async def openapi_document(self, request: Request) -> Response:
        if self._openapi is None:
            self._openapi = json_response(openapi.openapi_document(self))
        return self._openapi

    async def docs_page(self, request: Request) -> Response:
        return Response(200, [(b"content-type", b"text/html; charset=utf-8")], openapi.DOCS_PAGE.encode())

    async def docs_script(self, request: Request) -> Response:
        return docs_assets.response("swagger-ui-bundle.js")

    async def docs_style(self, request: Request) -> Response:
        return docs_assets.response("swagger-ui.css")

    # -- inference -----------------------------------------------------------------------------
    def _mlserver_model(self, model: str, version: str) -> bool:
        try:
            return is_model_settings_config(self.core.model_config(model, version))
        except InferenceError:
            return False

    async def infer(self, request: Request, model: str, version: str) -> Response:
        if not self.core.tracing:
            return await self._infer(request, model, version, None)
        # Triton's HTTP_RECV_* / HTTP_SEND_* timestamps, in the request's trace (if it is sampled)
        frontend = FrontendTrace()
        frontend.stamp("HTTP_RECV_START")
        try:
            return await self._infer(request, model, version, frontend)
        finally:
            frontend.done()

    async def _infer(self, request: Request, model: str, version: str, frontend: FrontendTrace | None) -> Response:
        async with self.intake.infer_body(request) as body:  # held of the body budget until answered
            return await self._infer_body(request, body, model, version, frontend)

    async def _infer_body(self, request: Request, body: bytes | bytearray, model: str, version: str,
                          frontend: FrontendTrace | None) -> Response:
        if frontend is not None:
            frontend.stamp("HTTP_RECV_END")
        header_length = inference_header_length(request.headers, len(body))
        if header_length == 0:
            inputs = self.core.model_metadata(model, version).inputs
            batching = self.core.model_config(model, version).max_batch_size > 0
            # (binary tensors only: views of the body, no parsing)
            infer_request, output_format = http_codec.decode_raw_request(model, version, body, inputs, batching)
        else:
            try:
                infer_request, output_format = await self.json_pool.decode(model, version, body, header_length)
            except InvalidArgument as exc:
                # MLServer's BYTES shapes ([len(s)] for one string) and bare-string BYTES data, for models from
                # model-settings.json only: looked up on this error path, so other requests pay nothing for it.
                if not (http_codec.loose_bytes_may_accept(exc.message) and self._mlserver_model(model, version)):
                    raise
                infer_request, output_format = await self.json_pool.decode(
                    model, version, body, header_length, loose_bytes=True
                )
        if self.forward_headers is not None:
            self.forward_headers.apply(request.headers, infer_request.parameters)
        try:
            response = await self.core.infer_async(
                infer_request, CallContext(trace_headers=request.headers, frontend_trace=frontend)
            )
        except OneResponseCall:
            raise OneResponseCall(OneResponseCall.HTTP) from None  # Triton's words for HTTP
        if frontend is not None:
            frontend.stamp("HTTP_SEND_START")
        content_type, json_length, payload = http_codec.encode_infer_response(response, output_format)
        headers = [(b"content-type", content_type)]
        if json_length is not None:
            headers.append((b"inference-header-content-length", b"%d" % json_length))
        accept = request.headers.get(b"accept-encoding")
        encoding = response_encoding(accept) if accept else None
        if encoding is not None:
            payload = await off_loop_if_large(len(payload), compress, payload, encoding)
            headers.append((b"content-encoding", encoding.encode()))
        if frontend is not None:
            frontend.stamp("HTTP_SEND_END")  # the response's bytes handed to the HTTP server
        return Response(200, headers, payload)

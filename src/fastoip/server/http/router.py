"""A small raw-ASGI router: one dict for the fixed paths, three precompiled regexes for the rest.

Rules:
- A known path with the wrong method is 405 (with ``Allow``); an unknown path is 404.
- Every answer that is not a success has the body ``{"error": message}`` (tritonclient reads it):
  core errors carry their HTTP status; anything else is a bug, logged and answered 500.
- Subclasses fill the five tables with their handlers; this class knows no endpoint.  An API with paths of
  its own shape (OpenAI's, :mod:`.openai`) adds a :class:`PatternRoute` to ``pattern_paths``, tried last, and
  may answer its errors in its own body form (``error_answer``).
- A :class:`StreamingResponse` sends its status and headers at once and its
  body chunk by chunk as they come (Server-Sent Events); when the client goes
  away the chunks stop and the source is closed (which cancels its request).
- Routing reads the decoded path, but an encoded '/' (``%2F``) in the raw path is 404: a model name
  cannot smuggle a separator into a route.
- Triton's ``--http-restricted-api``: a restricted endpoint without its header is 403, checked before
  the method (as Triton does); with no restriction configured the check is one empty-dict test.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, NamedTuple

import orjson

from ...errors import InferenceError, NotFound, ResourceExhausted
from ...settings import SWITCHES
from .. import restricted
from ..restricted import RestrictedFeatures, Restriction
from .errors import Forbidden, MethodNotAllowed

log = logging.getLogger("fastoip.http")


class Response:
    """Status, headers and the whole body of one answer."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, [(b"content-type", b"application/json")], orjson.dumps(value))


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


class StreamingResponse:
    """Status and headers now, then the body as ``chunks`` produces it (no content-length)."""

    __slots__ = ("status", "headers", "chunks")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncGenerator[bytes, None]) -> None:
        self.status = status
        self.headers = headers
        self.chunks = chunks


EMPTY_OK = Response(200, [], b"")


class Request:
    """What a handler needs from one HTTP request."""

    __slots__ = ("method", "path", "headers", "receive", "scope")

    def __init__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        #: Lower-case header names (ASGI guarantees them) -> the last value given.
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.receive = receive
        self.scope = scope

    @property
    def client(self) -> str:
        """The client's host (registrations are bounded per client); "" when the server does not know it."""
        client = self.scope.get("client")
        return str(client[0]) if client else ""


Handler = Callable[..., Awaitable[Response | StreamingResponse]]


class PatternRoute(NamedTuple):
    """Paths of another API's shape: a full-match regex whose groups are the handler's arguments, the same path
    in OpenAPI's template form, its methods and its restricted group."""

    pattern: re.Pattern[str]
    template: str
    methods: dict[str, Handler]
    category: str | None


class Route(NamedTuple):
    """One (method, path) the router serves; ``path`` in OpenAPI's template form (``/v2/models/{model_name}``)."""

    method: str
    path: str
    handler: Handler

MODEL_PATH = re.compile(
    r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
    r"(?:/(?P<action>ready|infer|generate|generate_stream|config|stats|trace/setting))?"
)
#: KServe V1: ``/v1/models/<model>``, ``/v1/models/<model>:predict`` and ``:explain`` (a model name holds no ':').
V1_MODEL_PATH = re.compile(r"/v1/models/(?P<model>[^/:]+)(?::(?P<action>predict|explain))?")
REPOSITORY_PATH = re.compile(r"/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)")
SHARED_MEMORY_PATH = re.compile(
    r"/v2/(?P<kind>system|cuda)sharedmemory(?:/region/(?P<region>[^/]+))?/(?P<action>status|register|unregister)"
)
#: '/' percent-encoded: routing would otherwise see a separator the client did not send as one.
ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


class Router:
    """The ASGI application: finds the handler of a request and sends what it answers."""

    def __init__(self) -> None:
        self.fixed_paths: dict[str, dict[str, Handler]] = {}
        #: Keyed by the MODEL_PATH "action" group (None: the model itself).
        self.model_paths: dict[str | None, dict[str, Handler]] = {}
        self.repository_paths: dict[str, dict[str, Handler]] = {}
        #: Keyed by the SHARED_MEMORY_PATH ("kind", "action") groups.
        self.shared_memory_paths: dict[tuple[str, str], dict[str, Handler]] = {}
        #: KServe V1, keyed by the V1_MODEL_PATH "action" group (None: the model's readiness).
        self.v1_model_paths: dict[str | None, dict[str, Handler]] = {}
        #: Other APIs' paths, tried in order after the tables.
        self.pattern_paths: list[PatternRoute] = []
        #: Fixed path -> its restricted group (Triton's HTTP groups; the OpenAI port has its own).
        self.fixed_path_categories: dict[str, str] = restricted.HTTP_FIXED_PATH_CATEGORIES
        #: Restricted group -> the header it needs (Triton's --http-restricted-api); empty: all open.
        self.restrictions: dict[str, Restriction] = {}

    def restrict(self, features: RestrictedFeatures) -> None:
        self.restrictions = dict(features.by_category)

    # -- ASGI ------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        request = Request(scope, receive)
        if SWITCHES.verbose:  # Triton's --log-verbose=1 line for each HTTP request
            log.debug("HTTP request: %s %s", request.method, request.path)
        try:
            if b"%" in scope.get("raw_path", b"") and ENCODED_SLASH.search(scope["raw_path"]):
                raise NotFound(f"no endpoint at '{scope['raw_path'].decode('latin-1')}' (an encoded '/' is not a "
                               "path separator, and no name contains '/')")
            handler, args = self.route(request.method, request.path, request.headers)
            response = await handler(request, *args)
        except MethodNotAllowed as exc:
            response = self.error_answer(exc.http_status, exc.message)
            response.headers.append((b"allow", exc.allow))
        except InferenceError as exc:
            response = self.error_answer(exc.http_status, exc.message)
            if isinstance(exc, ResourceExhausted) and exc.retry_after is not None:
                # issue 37: a full shared queue or budget answers at once, with when to come back
                response.headers.append((b"retry-after", b"%d" % exc.retry_after))
        except asyncio.CancelledError:  # uvicorn's shutdown gave up waiting (a half-sent request): retryable
            response = self.error_answer(503, "the server is shutting down; send the request again")
        except Exception as exc:  # a bug: answer it, log it, keep serving
            log.exception("%s %s failed", request.method, request.path)
            response = self.error_answer(500, f"internal error: {type(exc).__name__}: {exc}")
        if type(response) is StreamingResponse:
            await _stream(request, response, send)
            return
        assert isinstance(response, Response)
        headers = [*response.headers, (b"content-length", b"%d" % len(response.body))]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    def error_answer(self, status: int, message: str) -> Response:
        """The body of an error the router answers itself (Triton's ``{"error": message}``)."""
        return error_response(status, message)

    def routes(self) -> list[Route]:
        """Every (method, path template) the five tables serve: what the OpenAPI document is made from.

        The templates are the regexes' shapes: each named group becomes a ``{parameter}``; optional parts
        (a model's version, a shared-memory region) give one template with and one without them.
        """
        templates: list[tuple[str, dict[str, Handler]]] = list(self.fixed_paths.items())
        for action, methods in self.model_paths.items():
            suffix = f"/{action}" if action else ""
            templates.append(("/v2/models/{model_name}" + suffix, methods))
            templates.append(("/v2/models/{model_name}/versions/{model_version}" + suffix, methods))
        for action, methods in self.repository_paths.items():
            templates.append((f"/v2/repository/models/{{model_name}}/{action}", methods))
        for (kind, action), methods in self.shared_memory_paths.items():
            templates.append((f"/v2/{kind}sharedmemory/{action}", methods))
            templates.append((f"/v2/{kind}sharedmemory/region/{{region_name}}/{action}", methods))
        for action, methods in self.v1_model_paths.items():
            templates.append(("/v1/models/{model_name}" + (f":{action}" if action else ""), methods))
        templates += [(pattern.template, pattern.methods) for pattern in self.pattern_paths]
        return [Route(method, path, handler) for path, methods in templates for method, handler in methods.items()]

    def route(
        self, method: str, path: str, headers: dict[bytes, bytes] | None = None
    ) -> tuple[Handler, tuple[str, ...]]:
        """The handler and its path arguments; NotFound / Forbidden / MethodNotAllowed otherwise."""
        args: tuple[str, ...] = ()
        methods = self.fixed_paths.get(path)
        category = self.fixed_path_categories.get(path)
        if methods is None:
            match = MODEL_PATH.fullmatch(path)
            if match is not None:
                methods = self.model_paths[match["action"]]
                args = (match["model"], match["version"] or "")
                category = restricted.HTTP_MODEL_ACTION_CATEGORIES.get(match["action"])
            elif (match := REPOSITORY_PATH.fullmatch(path)) is not None:
                methods = self.repository_paths[match["action"]]
                args = (match["model"],)
                category = restricted.MODEL_REPOSITORY
            elif (match := SHARED_MEMORY_PATH.fullmatch(path)) is not None:
                methods = self.shared_memory_paths[match["kind"], match["action"]]
                args = (match["region"] or "",)
                category = restricted.SHARED_MEMORY
            elif self.v1_model_paths and (match := V1_MODEL_PATH.fullmatch(path)) is not None:
                methods = self.v1_model_paths[match["action"]]
                args = (match["model"],)
                category = restricted.HTTP_V1_MODEL_ACTION_CATEGORIES.get(match["action"])
            else:
                for pattern in self.pattern_paths:
                    if (match := pattern.pattern.fullmatch(path)) is not None:
                        methods, args, category = pattern.methods, match.groups(), pattern.category
                        break
                else:
                    raise NotFound(f"no endpoint at '{path}' (the V2 API lives under /v2, KServe's V1 under /v1)")
        if self.restrictions and category in self.restrictions:
            restriction = self.restrictions[category]
            if not restriction.allows((headers or {}).get(restriction.lookup_key)):
                raise Forbidden(restriction.http_refusal())
        handler = methods.get(method)
        if handler is None:
            allowed = list(methods)
            message = f"method {method} is not allowed on '{path}'; allowed: {', '.join(allowed)}"
            raise MethodNotAllowed(message, allowed)
        return handler, args


async def _stream(request: Request, response: StreamingResponse, send: Callable[..., Any]) -> None:
    """Send each chunk as it comes; stop (closing the source) as soon as the client disconnects.

    One loop reads the source and writes (no task per chunk); a watcher of the client cancels that loop when the
    client goes away, wherever it waits (on the model or on the socket)."""
    await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
    chunks = response.chunks
    task = asyncio.current_task()
    assert task is not None
    streaming = True
    gone = False

    def client_left(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        if streaming and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            task.cancel()

    disconnected = asyncio.ensure_future(client_disconnect(request))
    disconnected.add_done_callback(client_left)
    try:
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        streaming = False  # (the last send completes the response, which ends the watcher too)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not gone:
            raise
        # our own cancel, to stop where it waited: the client is gone, nothing more to do (3.11+ counts cancels)
        uncancel = getattr(task, "uncancel", None)
        if uncancel is not None:
            uncancel()
    finally:
        streaming = False
        disconnected.cancel()
        await chunks.aclose()


async def client_disconnect(request: Request) -> None:
    """Returns when the client has gone away (the request body was read before the response started)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass

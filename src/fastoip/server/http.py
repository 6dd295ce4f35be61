"""The HTTP/REST frontend: the KServe V2 / Triton REST API on uvicorn (httptools + uvloop).

Rules:
- Translate only: HTTP <-> core calls, core errors -> status + ``{"error": message}``.
  Every answer that is not a success has that JSON body (tritonclient reads it).
  Inference bodies are decoded and encoded in ``http_infer.py`` (sans-I/O).
- One raw ASGI app, no framework: a dict for the fixed paths and three
  precompiled regexes for model, repository and shared-memory paths.  A known
  path with the wrong method is 405; an unknown path is 404.
- The event loop never waits on a model: infer awaits ``core.infer_async``;
  model load and unload run in the loop's default executor.  The other Core
  calls are dictionary lookups and run inline.
- Request bodies are read incrementally and never beyond ``max_body_size``
  (413, also when Content-Length says so up front); a compressed body
  (Content-Encoding gzip/deflate) is never inflated beyond it either.  After a
  413 uvicorn discards the rest of the body and keeps the connection, so the
  client reads the answer instead of a reset.
- Infer responses are compressed when Accept-Encoding asks for gzip or deflate
  (Triton does the same; note that aiohttp, and so tritonclient.http.aio, asks
  for "gzip, deflate" by default).  Large bodies are (de)compressed in the
  executor: zlib releases the GIL, the loop keeps serving.
- Server metadata lists ``binary_tensor_data`` once this frontend exists
  (Triton's name for the binary extension it implements).
- Shared memory, trace and log settings use Triton's paths and JSON forms, so
  tritonclient.http works unchanged: region status is a list of
  ``{"name", "key", "offset", "byte_size"}``; trace settings answer
  ``trace_level`` as a list and every other setting as one string, and take
  a string, a list of strings or null (clear) per setting; log settings are
  plain JSON values (null: left as is).  CUDA shared memory answers 503
  where the server has no GPU (as the gRPC frontend answers UNAVAILABLE).
- The server runs in its own thread with its own uvloop: ``start()`` returns
  once the socket listens; ``stop()`` closes the listener, lets requests in
  flight finish within the timeout, then joins the thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import socket
import threading
import zlib
from typing import Any, Awaitable, Callable, Optional

import orjson
import uvicorn
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import json_format

from .._proto import model_config_pb2
from ..core import Core
from ..errors import InferenceError, InvalidArgument, NotFound
from ..shared_memory import CUDA
from . import http_infer
from .http_infer import _short as _short_json
from .http_infer import parse_json_object

log = logging.getLogger("fastoip.http")

#: Bodies at least this large are (de)compressed in the executor, not on the loop.
OFF_LOOP_ZLIB_BYTES = 256 * 1024
#: zlib level for responses: the point is bandwidth, so the fastest level.
RESPONSE_ZLIB_LEVEL = 1
#: Idle keep-alive connections are closed after this many seconds.
KEEP_ALIVE_SECONDS = 75
#: The server-metadata extension name of Triton's binary tensor data extension.
BINARY_EXTENSION = "binary_tensor_data"


class PayloadTooLarge(InvalidArgument):
    """The request body (or its decompressed form) exceeds max_body_size."""

    http_status = 413


class MethodNotAllowed(InvalidArgument):
    """A known path asked with a method it does not serve."""

    http_status = 405

    def __init__(self, message: str, allow: list[str]) -> None:
        super().__init__(message)
        self.allow = ", ".join(allow).encode()


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


EMPTY_OK = Response(200, [], b"")


class Request:
    """What a handler needs from one HTTP request."""

    __slots__ = ("method", "path", "headers", "receive")

    def __init__(self, scope: dict, receive: Callable[[], Awaitable[dict]]) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        #: Lower-case header names (ASGI guarantees them) -> the last value given.
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.receive = receive


Handler = Callable[..., Awaitable[Response]]

MODEL_PATH = re.compile(
    r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
    r"(?:/(?P<action>ready|infer|config|stats|trace/setting))?"
)
REPOSITORY_PATH = re.compile(r"/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)")
SHARED_MEMORY_PATH = re.compile(
    r"/v2/(?P<kind>system|cuda)sharedmemory(?:/region/(?P<region>[^/]+))?/(?P<action>status|register|unregister)"
)


class HttpFrontend:
    """The ASGI application: routing, bodies, and one handler per endpoint."""

    def __init__(self, core: Core, max_body_size: int) -> None:
        self.core = core
        self.max_body_size = max_body_size
        self.fixed_paths: dict[str, dict[str, Handler]] = {
            "/v2": {"GET": self.server_metadata},
            "/v2/health/live": {"GET": self.server_live},
            "/v2/health/ready": {"GET": self.server_ready},
            "/v2/models/stats": {"GET": self.all_model_stats},
            "/v2/repository/index": {"POST": self.repository_index},
            "/v2/trace/setting": {"GET": self.get_trace_settings, "POST": self.update_trace_settings},
            "/v2/logging": {"GET": self.get_log_settings, "POST": self.update_log_settings},
        }
        # Keyed by the MODEL_PATH "action" group (None: the model itself).
        self.model_paths: dict[Optional[str], dict[str, Handler]] = {
            None: {"GET": self.model_metadata},
            "ready": {"GET": self.model_ready},
            "infer": {"POST": self.infer},
            "config": {"GET": self.model_config},
            "stats": {"GET": self.model_stats},
            "trace/setting": {"GET": self.get_trace_settings, "POST": self.update_trace_settings},
        }
        self.repository_paths: dict[str, dict[str, Handler]] = {
            "load": {"POST": self.load_model},
            "unload": {"POST": self.unload_model},
        }
        # Keyed by the SHARED_MEMORY_PATH ("kind", "action") groups.
        self.shared_memory_paths: dict[tuple[str, str], dict[str, Handler]] = {
            ("system", "status"): {"GET": self.system_shared_memory_status},
            ("system", "register"): {"POST": self.register_system_shared_memory},
            ("system", "unregister"): {"POST": self.unregister_system_shared_memory},
            ("cuda", "status"): {"GET": self.cuda_shared_memory_status},
            ("cuda", "register"): {"POST": self.register_cuda_shared_memory},
            ("cuda", "unregister"): {"POST": self.unregister_cuda_shared_memory},
        }

    # -- ASGI ------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        request = Request(scope, receive)
        try:
            handler, args = self.route(request.method, request.path)
            response = await handler(request, *args)
        except MethodNotAllowed as exc:
            response = error_response(exc.http_status, exc.message)
            response.headers.append((b"allow", exc.allow))
        except InferenceError as exc:
            response = error_response(exc.http_status, exc.message)
        except asyncio.CancelledError:  # uvicorn's shutdown gave up waiting (a half-sent request): retryable
            response = error_response(503, "the server is shutting down; send the request again")
        except Exception as exc:  # a bug: answer it, log it, keep serving
            log.exception("%s %s failed", request.method, request.path)
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        headers = [*response.headers, (b"content-length", b"%d" % len(response.body))]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    def route(self, method: str, path: str) -> tuple[Handler, tuple]:
        """The handler and its path arguments; NotFound / MethodNotAllowed otherwise."""
        args: tuple = ()
        methods = self.fixed_paths.get(path)
        if methods is None:
            match = MODEL_PATH.fullmatch(path)
            if match is not None:
                methods = self.model_paths[match["action"]]
                args = (match["model"], match["version"] or "")
            elif (match := REPOSITORY_PATH.fullmatch(path)) is not None:
                methods = self.repository_paths[match["action"]]
                args = (match["model"],)
            elif (match := SHARED_MEMORY_PATH.fullmatch(path)) is not None:
                methods = self.shared_memory_paths[match["kind"], match["action"]]
                args = (match["region"] or "",)
            else:
                raise NotFound(f"no endpoint at '{path}' (the V2 API lives under /v2)")
        handler = methods.get(method)
        if handler is None:
            allowed = list(methods)
            message = f"method {method} is not allowed on '{path}'; allowed: {', '.join(allowed)}"
            raise MethodNotAllowed(message, allowed)
        return handler, args

    # -- health and metadata ---------------------------------------------------------------
    async def server_live(self, request: Request) -> Response:
        if self.core.server_live():
            return EMPTY_OK
        return error_response(400, "the server is not live")

    async def server_ready(self, request: Request) -> Response:
        if self.core.server_ready():
            return EMPTY_OK
        return error_response(400, self._not_ready_reason())

    def _not_ready_reason(self) -> str:
        if self.core.draining:
            return "the server is not ready: it is shutting down"
        failed = [
            f"'{entry['name']}' is {entry['state'] or 'not loaded'}"
            + (f" ({entry['reason']})" if entry["reason"] else "")
            for entry in self.core.repository_index()
            if entry["state"] != "READY"
        ]
        return "the server is not ready: " + ("; ".join(failed) if failed else "not every model is ready")

    async def model_ready(self, request: Request, model: str, version: str) -> Response:
        if self.core.model_ready(model, version):
            return EMPTY_OK
        try:
            self.core.model_metadata(model, version)  # raises with the reason the model is not ready
        except InferenceError as exc:
            return error_response(400, exc.message)
        return error_response(400, f"model '{model}' is not ready: the server is shutting down")

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request, model: str, version: str) -> Response:
        return json_response(self.core.model_metadata(model, version))

    async def model_config(self, request: Request, model: str, version: str) -> Response:
        return json_response(model_config_json(self.core.model_config(model, version)))

    async def model_stats(self, request: Request, model: str, version: str) -> Response:
        return json_response({"model_stats": self.core.statistics(model, version)})

    async def all_model_stats(self, request: Request) -> Response:
        return json_response({"model_stats": self.core.statistics()})

    # -- repository -------------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        doc = _optional_json_object(await self.read_body(request), "repository index request")
        ready = doc.get("ready", False)
        if type(ready) is not bool:
            raise InvalidArgument(f"'ready' must be true or false, got {ready!r}")
        return json_response(self.core.repository_index(ready))

    async def load_model(self, request: Request, model: str) -> Response:
        doc = _optional_json_object(await self.read_body(request), "load request")
        parameters = _parameters_of(doc, "load request")
        for key, value in parameters.items():
            if key.startswith("file:"):  # file contents travel base64-encoded in JSON
                parameters[key] = _base64_value(value, f"load request parameter '{key}'")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.core.load_model, model, parameters)
        return EMPTY_OK

    async def unload_model(self, request: Request, model: str) -> Response:
        doc = _optional_json_object(await self.read_body(request), "unload request")
        _parameters_of(doc, "unload request")  # unload_dependents: no ensembles, nothing depends on a model
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.core.unload_model, model)
        return EMPTY_OK

    # -- shared memory -------------------------------------------------------------------------
    async def system_shared_memory_status(self, request: Request, region: str) -> Response:
        return json_response(self.core.shared_memory.status(region))

    async def register_system_shared_memory(self, request: Request, region: str) -> Response:
        if not region:
            raise InvalidArgument(
                "registering system shared memory needs a region name: "
                "POST /v2/systemsharedmemory/region/<name>/register"
            )
        what = f"register request for system shared memory region '{region}'"
        doc = _optional_json_object(await self.read_body(request), what)
        key = doc.get("key")
        if type(key) is not str or not key:
            raise InvalidArgument(f"the {what} needs 'key', the shared memory key (a string), got {_short_json(key)}")
        offset = _integer_field(doc, "offset", what, minimum=0, default=0)
        byte_size = _integer_field(doc, "byte_size", what, minimum=1)
        self.core.shared_memory.register(region, key, offset, byte_size)
        return EMPTY_OK

    async def unregister_system_shared_memory(self, request: Request, region: str) -> Response:
        await self.read_body(request)  # tritonclient sends an empty body; nothing in it is used
        self.core.shared_memory.unregister(region)
        return EMPTY_OK

    async def cuda_shared_memory_status(self, request: Request, region: str) -> Response:
        return json_response(self.core.shared_memory.status(region, CUDA))

    async def register_cuda_shared_memory(self, request: Request, region: str) -> Response:
        if not region:
            raise InvalidArgument(
                "registering CUDA shared memory needs a region name: POST /v2/cudasharedmemory/region/<name>/register"
            )
        what = f"register request for CUDA shared memory region '{region}'"
        doc = _optional_json_object(await self.read_body(request), what)
        handle = doc.get("raw_handle")
        encoded = handle.get("b64") if isinstance(handle, dict) else None
        if encoded is None:
            raise InvalidArgument(
                f"the {what} needs 'raw_handle' as {{\"b64\": <base64 of a cudaIpcMemHandle_t>}}, "
                f"got {_short_json(handle)}"
            )
        raw_handle = _base64_value(encoded, f"'raw_handle' of the {what}")
        device_id = _integer_field(doc, "device_id", what, minimum=0, default=0)
        byte_size = _integer_field(doc, "byte_size", what, minimum=1)
        loop = asyncio.get_running_loop()
        # Opening an IPC handle talks to the driver: not on the event loop.
        await loop.run_in_executor(
            None, self.core.shared_memory.register_cuda, region, raw_handle, device_id, byte_size
        )
        return EMPTY_OK

    async def unregister_cuda_shared_memory(self, request: Request, region: str) -> Response:
        await self.read_body(request)  # tritonclient sends an empty body; nothing in it is used
        self.core.shared_memory.unregister(region, CUDA)
        return EMPTY_OK

    # -- trace and log settings ---------------------------------------------------------------------
    async def get_trace_settings(self, request: Request, model: str = "", version: str = "") -> Response:
        if model:
            self.core.repository.get(model)  # 404 for an unknown model
        return json_response(_trace_settings_json(self.core.trace_settings.get(model)))

    async def update_trace_settings(self, request: Request, model: str = "", version: str = "") -> Response:
        doc = _optional_json_object(await self.read_body(request), "trace setting request")
        if model:
            self.core.repository.get(model)  # 404 for an unknown model
        changes: dict[str, Optional[list[str]]] = {}
        for key, value in doc.items():
            if value is None or type(value) is str:
                changes[key] = value if value is None else [value]
            elif type(value) is list and all(type(item) is str for item in value):
                changes[key] = value
            else:
                raise InvalidArgument(
                    f"trace setting '{key}' must be a string, a list of strings or null, got {_short_json(value)}"
                )
        return json_response(_trace_settings_json(self.core.trace_settings.update(changes, model)))

    async def get_log_settings(self, request: Request) -> Response:
        return json_response(self.core.log_settings.update({}))

    async def update_log_settings(self, request: Request) -> Response:
        doc = _optional_json_object(await self.read_body(request), "log setting request")
        changes = {key: value for key, value in doc.items() if value is not None}  # Triton skips nulls
        return json_response(self.core.log_settings.update(changes))

    # -- inference -----------------------------------------------------------------------------
    async def infer(self, request: Request, model: str, version: str) -> Response:
        body = await self.read_body(request)
        header_length = _inference_header_length(request.headers, len(body))
        if header_length == 0:
            metadata = self.core.model_metadata(model, version)
            batching = self.core.model_config(model, version).max_batch_size > 0
            infer_request, output_format = http_infer.decode_raw_request(model, version, body, metadata, batching)
        else:
            infer_request, output_format = http_infer.decode_infer_request(model, version, body, header_length)
        response = await self.core.infer_async(infer_request)
        content_type, json_length, payload = http_infer.encode_infer_response(response, output_format)
        headers = [(b"content-type", content_type)]
        if json_length is not None:
            headers.append((b"inference-header-content-length", b"%d" % json_length))
        accept = request.headers.get(b"accept-encoding")
        encoding = _response_encoding(accept) if accept else None
        if encoding is not None:
            payload = await _off_loop_if_large(len(payload), _compress, payload, encoding)
            headers.append((b"content-encoding", encoding.encode()))
        return Response(200, headers, payload)

    # -- bodies ------------------------------------------------------------------------------------
    async def read_body(self, request: Request) -> bytes:
        """The whole request body, decompressed; 413 as soon as it is over the limit."""
        limit = self.max_body_size
        declared = request.headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(f"the request body is {int(declared)} bytes")
        chunks = []
        size = 0
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise InvalidArgument("the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise _too_large(f"the request body is more than {limit} bytes")
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = request.headers.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            body = await _off_loop_if_large(len(body), _decompress, body, encoding, limit)
        return body


# --------------------------------------------------------------------------- #
# Helpers: headers, compression, JSON documents                               #
# --------------------------------------------------------------------------- #


def _too_large(what: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"{what}, over the server's limit (--http-max-input-size)")


def _inference_header_length(headers: dict[bytes, bytes], body_length: int) -> Optional[int]:
    """The parsed Inference-Header-Content-Length (None when absent); 400 when it is not usable."""
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    if not text.isdigit():
        raise InvalidArgument(f"Inference-Header-Content-Length must be a non-negative integer, got '{text}'")
    length = int(text)
    if length > body_length:
        raise InvalidArgument(
            f"Inference-Header-Content-Length is {length}, but the request body has only {body_length} bytes"
        )
    return length


def _response_encoding(accept: bytes) -> Optional[str]:
    """gzip or deflate when Accept-Encoding prefers one of them (highest q, first on ties), else None."""
    best, best_q = None, 0.0
    for part in accept.decode("latin-1").split(","):
        name, _, params = part.partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                continue
        if q > best_q:
            best, best_q = name, q
    return best if best in ("gzip", "deflate") else None


def _compress(data: bytes, encoding: str) -> bytes:
    # gzip: a gzip wrapper (wbits 31); HTTP "deflate": a zlib stream (wbits 15), which tritonclient inflates.
    compressor = zlib.compressobj(RESPONSE_ZLIB_LEVEL, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    return compressor.compress(data) + compressor.flush()


def _decompress(data: bytes, encoding: bytes, limit: int) -> bytes:
    name = encoding.strip().lower()
    if name not in (b"gzip", b"deflate"):
        raise InvalidArgument(
            f"unsupported Content-Encoding '{encoding.decode('latin-1')}'; supported: gzip, deflate, identity"
        )
    # wbits 47 reads a gzip or a zlib stream; some clients send "deflate" as a raw stream (wbits -15).
    for wbits in (47, -15) if name == b"deflate" else (47,):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(data, limit + 1)  # never inflate more than the limit allows
        except zlib.error as exc:
            error = exc
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise _too_large("the decompressed request body is more than %d bytes" % limit)
        if not inflater.eof:
            raise InvalidArgument(f"the {name.decode()} request body is truncated")
        return out
    raise InvalidArgument(f"the request body is not valid {name.decode()} data: {error}")


async def _off_loop_if_large(size: int, function: Callable, *args: Any) -> Any:
    if size < OFF_LOOP_ZLIB_BYTES:
        return function(*args)
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


def _optional_json_object(body: bytes, what: str) -> dict:
    """An optional JSON object body ({} when empty)."""
    return parse_json_object(body, what) if body.strip() else {}


def _base64_value(value: Any, what: str) -> bytes:
    """Bytes sent as a base64 JSON string, or a 400 saying which value was not."""
    try:
        if type(value) is str:
            return base64.b64decode(value, validate=True)
    except binascii.Error:
        pass
    raise InvalidArgument(f"{what} must be a base64 string, got {_short_json(value)}")


def _integer_field(doc: dict, field: str, what: str, minimum: int, default: Optional[int] = None) -> int:
    """``doc[field]`` as an int >= ``minimum`` (0 or 1; absent: ``default``), or a 400 naming the field."""
    value = doc.get(field, default)
    if type(value) is not int or value < minimum:
        expected = "a non-negative integer" if minimum == 0 else "a positive integer"
        raise InvalidArgument(f"the {what} needs '{field}' as {expected}, got {_short_json(value)}")
    return value


def _trace_settings_json(values: dict[str, list[str]]) -> dict[str, Any]:
    """Triton's HTTP form: ``trace_level`` is a list, every other setting one string."""
    return {
        key: value if key == "trace_level" else (value[0] if len(value) == 1 else value)
        for key, value in values.items()
    }


def _parameters_of(doc: dict, what: str) -> dict:
    parameters = doc.get("parameters", {})
    if type(parameters) is not dict:
        raise InvalidArgument(f"'parameters' of the {what} must be an object")
    return parameters


_INT64_TYPES = frozenset(
    (
        pb_descriptor.FieldDescriptor.TYPE_INT64,
        pb_descriptor.FieldDescriptor.TYPE_UINT64,
        pb_descriptor.FieldDescriptor.TYPE_SINT64,
        pb_descriptor.FieldDescriptor.TYPE_FIXED64,
        pb_descriptor.FieldDescriptor.TYPE_SFIXED64,
    )
)


def model_config_json(config: model_config_pb2.ModelConfig) -> dict:
    """Triton's JSON form of a ModelConfig: proto field names, defaults printed, 64-bit ints as numbers."""
    doc = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(config.DESCRIPTOR, doc)
    return doc


def _int64_as_numbers(descriptor: pb_descriptor.Descriptor, doc: dict) -> None:
    # Proto3 JSON writes 64-bit integers as strings; Triton (and perf_analyzer) expect numbers.
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            value_field = message.fields_by_name["value"]
            if value_field.message_type is not None:
                for item in value.values():
                    _int64_as_numbers(value_field.message_type, item)
            elif value_field.type in _INT64_TYPES:
                doc[field.name] = {key: int(item) for key, item in value.items()}
        elif message is not None:
            for item in value if field.is_repeated else (value,):
                _int64_as_numbers(message, item)
        elif field.type in _INT64_TYPES:
            doc[field.name] = [int(item) for item in value] if field.is_repeated else int(value)


# --------------------------------------------------------------------------- #
# The server thread                                                           #
# --------------------------------------------------------------------------- #


class _Uvicorn(uvicorn.Server):
    """uvicorn.Server that says when its listener is up."""

    def __init__(self, config: uvicorn.Config, listening: threading.Event) -> None:
        super().__init__(config)
        self.listening = listening

    async def startup(self, sockets: Optional[list] = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class HttpServer:
    """The HTTP frontend in a background thread with its own uvloop event loop."""

    def __init__(self, core: Core, host: str, port: int, *, max_body_size: int = 64 * 1024 * 1024) -> None:
        self.core = core
        self.host = host
        self.port = port
        self.max_body_size = max_body_size
        if BINARY_EXTENSION not in core.extensions:
            core.extensions.append(BINARY_EXTENSION)
        self._server: Optional[_Uvicorn] = None
        self._thread: Optional[threading.Thread] = None
        self._failure: Optional[BaseException] = None

    def start(self) -> int:
        """Bind, start serving in a thread, and return the bound port once listening."""
        sock = _bind(self.host, self.port)
        bound_port = sock.getsockname()[1]
        config = uvicorn.Config(
            HttpFrontend(self.core, self.max_body_size),
            http="httptools",
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # keep the process's logging as app.py set it up
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        listening = threading.Event()
        self._server = _Uvicorn(config, listening)
        self._thread = threading.Thread(target=self._run, args=(sock, listening), name="fastoip-http", daemon=True)
        self._thread.start()
        listening.wait()
        if self._failure is not None:
            raise OSError(f"the HTTP server failed to start on {self.host}:{bound_port}: {self._failure}")
        self.port = bound_port
        return bound_port

    def _run(self, sock: socket.socket, listening: threading.Event) -> None:
        import uvloop

        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            assert self._server is not None
            loop.run_until_complete(self._server.serve(sockets=[sock]))
        except BaseException as exc:  # startup failures must reach start(), not vanish with the thread
            self._failure = exc
            log.exception("HTTP server stopped with an error")
        finally:
            try:
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                listening.set()

    def stop(self, timeout: float) -> None:
        """Stop accepting; requests in flight get up to ``timeout`` seconds; join the thread."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.config.timeout_graceful_shutdown = max(timeout, 0.0)
        server.should_exit = True
        # uvicorn notices should_exit within 0.1 s; its shutdown waits at most timeout.
        thread.join(timeout + 5.0)
        if thread.is_alive():
            log.warning("the HTTP server thread did not stop within %.1f s", timeout + 5.0)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

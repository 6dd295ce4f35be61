"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and ``/generate_stream``.

Rules (Triton's ``docs/protocol/extension_generate.md`` and ``http_server.cc``):
- Translate only: the JSON mapping is :mod:`fastoip.wire.generate`; the
  request runs through ``Core.start`` with a response sink, so decoupled and
  ordinary models both serve it and the event loop never waits on a model.
- A request that fails before it runs (bad JSON, an input that does not fit,
  unknown model) answers a JSON error with its status, as every endpoint does.
- ``/generate`` answers one JSON object; a model that gave more or fewer than
  one response answers Triton's error for that (500 here: see COMPATIBILITY.md).
- ``/generate_stream`` answers ``text/event-stream``: one ``data:`` event per
  response as it is produced; the status is that of the first answer (an error
  first: the error's status), so an error after the first response is an
  ``{"error": ...}`` event under 200, as in Triton.  The client going away
  cancels the request (a decoupled model stops producing).
- MLServer's form, for models from model-settings.json: a body whose ``inputs`` is a list is a V2 inference
  request (MLServer's ``generate`` / ``generate_stream`` take an ``InferenceRequest``), read as ``/infer``
  reads it (MLServer's BYTES rules included), and each answer is a V2 inference response in JSON (all
  outputs as JSON data), as MLServer sends them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from functools import partial

import orjson

from ...core import Core
from ...errors import InferenceError, InternalError
from ...model_config import is_model_settings_config
from ...types import InferResponse
from ...wire import generate as codec
from ...wire import http as http_codec
from .intake import BodyIntake
from .model_call import Answer, ModelCall
from .router import Request, Response, StreamingResponse, error_response

EVENT_STREAM = b"text/event-stream; charset=utf-8"
JSON = b"application/json"

#: How one call's responses are written: Triton's generate JSON, or MLServer's V2 response JSON.
Encode = Callable[[InferResponse], bytes]
#: MLServer's V2 responses carry every output as JSON data (an event stream has no binary part).
_ALL_JSON = http_codec.OutputFormat()


def _v2_response_json(response: InferResponse) -> bytes:
    return http_codec.encode_infer_response(response, _ALL_JSON)[2]


class GenerateEndpoints:
    """The two generate handlers; the router calls them with the model name and version."""

    def __init__(self, core: Core, intake: BodyIntake) -> None:
        self.core = core
        self.intake = intake

    async def generate(self, request: Request, model: str, version: str) -> Response:
        answers, encode = await self._start(request, model, version)
        first = await answers.get()
        if isinstance(first, InferenceError):
            return error_response(first.http_status, first.message)
        # Triton counts an error after the first response as one more answer: "exactly 1 response" then
        if first is None:
            count = 0
        else:
            count = 1
            while await answers.get() is not None:
                count += 1
        if first is None or count != 1:
            error = InternalError(codec.NOT_ONE_RESPONSE)
            return error_response(error.http_status, error.message)
        return Response(200, [(b"content-type", JSON)], encode(first))

    async def generate_stream(self, request: Request, model: str, version: str) -> StreamingResponse:
        answers, encode = await self._start(request, model, version)
        first = await answers.get()
        status = first.http_status if isinstance(first, InferenceError) else 200
        return StreamingResponse(status, [(b"content-type", EVENT_STREAM)], _events(first, answers, encode))

    async def _start(self, request: Request, model: str, version: str) -> tuple[ModelCall, Encode]:
        body = await self.intake.body(request)
        if await self._v2_body(model, version, body):
            infer_request, _ = await self.intake.parse(
                body, partial(http_codec.decode_infer_request, loose_bytes=True), model, version, body, None)
            return ModelCall(self.core, infer_request), _v2_response_json
        inputs = self.core.model_metadata(model, version).inputs
        infer_request = await self.intake.parse(body, codec.decode_generate_request, model, version, body, inputs)
        return ModelCall(self.core, infer_request), codec.generate_response_json

    async def _v2_body(self, model: str, version: str, body: bytes | bytearray) -> bool:
        """Whether ``body`` is MLServer's form (a V2 request, ``inputs`` a list) sent to a model-settings model."""
        if b'"inputs"' not in body or not is_model_settings_config(self.core.model_config(model, version)):
            return False
        return await self.intake.parse(body, is_v2_form, body)


def is_v2_form(body: bytes | bytearray) -> bool:
    """Whether a JSON body is a V2 request (``inputs`` a list); parsed off the loop when large."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False  # the generate decoder says what is wrong with it
    return type(doc) is dict and type(doc.get("inputs")) is list


async def _events(first: Answer, answers: ModelCall, encode: Encode) -> AsyncGenerator[bytes, None]:
    """The SSE body: an event per response, an error event, until the end; cancels the call if closed early.
    The answers queued at a wake-up go out together, in one write."""
    answer = first
    held: list[bytes] = []
    try:
        while answer is not None:
            if isinstance(answer, InferenceError):
                held.append(codec.sse_event(codec.error_json(answer.message)))
                break
            try:
                data = encode(answer)
            except InferenceError as exc:  # an output with no JSON form: the client hears why
                data = codec.error_json(exc.message)
            held.append(codec.sse_event(data))
            if not answers.ready():  # the next answer is not here yet: send what is
                yield b"".join(held)
                held.clear()
            answer = await answers.get()
        if held:
            yield b"".join(held)
    finally:
        if not answers.ticket.finished:
            answers.ticket.cancel()

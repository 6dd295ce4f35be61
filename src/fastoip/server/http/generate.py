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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from ...core import Core, FinishedCall, on_loop
from ...errors import InferenceError, InternalError
from ...types import InferRequest, InferResponse
from ...wire import generate as codec
from .bodies import read_body
from .router import Request, Response, StreamingResponse, error_response

EVENT_STREAM = b"text/event-stream; charset=utf-8"
JSON = b"application/json"

#: What an answer queue holds: a response, the call's error, or None (no more answers).
Answer = InferResponse | InferenceError | None


class GenerateEndpoints:
    """The two generate handlers; the router calls them with the model name and version."""

    def __init__(self, core: Core, max_body_size: int) -> None:
        self.core = core
        self.max_body_size = max_body_size

    async def generate(self, request: Request, model: str, version: str) -> Response:
        answers = await self._start(request, model, version)
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
        return Response(200, [(b"content-type", JSON)], codec.generate_response_json(first))

    async def generate_stream(self, request: Request, model: str, version: str) -> StreamingResponse:
        answers = await self._start(request, model, version)
        first = await answers.get()
        status = first.http_status if isinstance(first, InferenceError) else 200
        return StreamingResponse(status, [(b"content-type", EVENT_STREAM)], _events(first, answers))

    async def _start(self, request: Request, model: str, version: str) -> _Answers:
        body = await read_body(request, self.max_body_size)
        inputs = self.core.model_metadata(model, version).inputs
        infer_request = codec.decode_generate_request(model, version, body, inputs)
        return _Answers(self.core, infer_request)


class _Answers:
    """One generate call's answers on the event loop, in order: responses, then an error or the end."""

    def __init__(self, core: Core, request: InferRequest) -> None:
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Answer] = asyncio.Queue()
        hop = on_loop(loop, self.queue.put_nowait)  # called on the thread that produced the answer

        def on_response(job: FinishedCall, response: InferResponse) -> None:
            hop(response)

        def on_done(job: FinishedCall) -> None:
            if job.error is not None:
                hop(job.error)
            elif job.response is not None:
                hop(job.response)
            hop(None)

        self.job = core.start(request, None, on_done, on_response)

    async def get(self) -> Answer:
        return await self.queue.get()


async def _events(first: Answer, answers: _Answers) -> AsyncGenerator[bytes, None]:
    """The SSE body: an event per response, an error event, until the end; cancels the call if closed early."""
    answer = first
    try:
        while answer is not None:
            if isinstance(answer, InferenceError):
                yield codec.sse_event(codec.error_json(answer.message))
                break
            try:
                data = codec.generate_response_json(answer)
            except InferenceError as exc:  # an output with no JSON form: the client hears why
                data = codec.error_json(exc.message)
            yield codec.sse_event(data)
            answer = await answers.get()
    finally:
        if not answers.job.finished:
            answers.job.cancel()

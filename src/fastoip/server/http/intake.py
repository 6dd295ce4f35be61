"""Every HTTP request body's one way in (issue 37): read within its limit, inflated within the server's budget,
parsed off the loop when large, through bounded queues.

Rules:
- A body is read up to its endpoint's limit (413 before more is read when Content-Length says so, or as soon as
  it passes), then inflated when compressed by the server's inflation pool (``server.inflate``: the loop does
  at most 64 KiB, the rest takes turns in the pool against one server-wide budget).
- An infer body with the binary extension (Inference-Header-Content-Length) has its JSON part bounded by
  --http-max-input-size and its binary tensor data by --http-max-binary-input-size, as Triton; what it holds
  past --http-max-input-size comes from one server-wide budget (``body_budget``), 503 with Retry-After past it.
- Control documents (trace and log settings, repository index, unload, shared-memory registration) are small:
  their bodies are limited to ``CONTROL_BODY_BYTES``, compressed or inflated, so one cannot cost more than a
  fraction of a millisecond of parsing on the loop.
- Every other JSON body (infer, V1 predict and explain, generate, a model load with its files) is parsed by
  the server's :class:`.json_pool.JsonPool`: on the loop when small, in a worker process when large, past a
  bounded queue (503 with Retry-After when it is full).
- An endpoint that will refuse whatever the body says checks that first and never reads the body (a load or
  unload in model control mode ``none``).

New routes (the OpenAI bridge, ...) take a JSON object with ``await intake.json_object(request, what)`` or run
their own module-level decoder with ``await intake.parse(request_body, decoder, *args)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from .bodies import inference_header_length, read_body, read_infer_body
from .body_budget import BodyBudget, BodyHold
from .json_docs import optional_json_object
from .json_pool import JsonPool
from .router import Request

#: Default of --http-max-binary-input-size: the binary tensor data of one infer body (gRPC's message limit).
MAX_BINARY_INPUT_BYTES = 2**31 - 1
#: Default of --http-max-body-bytes-in-flight when none is given: 2 GiB (cli.py picks a share of the machine's memory).
BODY_BYTES_IN_FLIGHT = 2 * 1024**3

#: A body parsed in a JSON worker is there three times: pickled for the worker, in it, and its tensors sent back.
WORKER_COPIES = 3

#: Bytes a control document may have, compressed or inflated (Triton's are a few hundred bytes).
CONTROL_BODY_BYTES = 64 * 1024

T = TypeVar("T")


class BodyIntake:
    """One HTTP server's way in for request bodies: its body limits, its large-body budget and its JSON pool."""

    def __init__(self, max_body_size: int, json_pool: JsonPool, max_binary_size: int = MAX_BINARY_INPUT_BYTES,
                 budget: BodyBudget | None = None) -> None:
        self.max_body_size = max_body_size
        self.json_pool = json_pool
        self.max_binary_size = max_binary_size
        self.budget = budget or BodyBudget(BODY_BYTES_IN_FLIGHT)

    @asynccontextmanager
    async def infer_body(self, request: Request) -> AsyncIterator[bytes | bytearray]:
        """An infer body (binary tensor data past --http-max-input-size allowed, drawn from the server's
        budget), held of the budget until the request is answered (the tensors are views of it)."""
        hold = BodyHold(self.budget)
        try:
            body = await read_infer_body(request, self.max_body_size, self.max_binary_size, hold)
            if hold.size and self.json_pool.off_loop(inference_header_length(request.headers, len(body)) or 0):
                # its JSON part is parsed in a worker process: the whole body is copied there and its tensors
                # back, so it holds its copies of the budget too (413 / 503 as for the body itself)
                hold.grow_to(WORKER_COPIES * len(body))
            yield body
        finally:
            hold.release()

    async def body(self, request: Request, limit: int | None = None) -> bytes | bytearray:
        """The whole body, inflated when compressed; 413 past ``limit`` (default: --http-max-input-size)."""
        return await read_body(request, self.max_body_size if limit is None else limit)

    async def control_document(self, request: Request, what: str) -> dict[str, Any]:
        """A small optional JSON object ({} when the body is empty), at most ``CONTROL_BODY_BYTES``."""
        body = await read_body(request, min(CONTROL_BODY_BYTES, self.max_body_size),
                               f"{CONTROL_BODY_BYTES} bytes for a control request")
        return optional_json_object(body, what)

    async def json_object(self, request: Request, what: str) -> dict[str, Any]:
        """An optional JSON object of any size up to the body limit, parsed off the loop when large."""
        body = await self.body(request)
        return await self.json_pool.run(len(body), optional_json_object, body, what)

    async def parse(self, body: bytes | bytearray, decoder: Callable[..., T], *args: Any) -> T:
        """``decoder(*args)`` for a body already read (a module-level function of it), off the loop when large."""
        return await self.json_pool.run(len(body), decoder, *args)

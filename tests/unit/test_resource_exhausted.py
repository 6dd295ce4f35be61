"""One error for every bound (issue 37): RESOURCE_EXHAUSTED on gRPC; on HTTP 429 when the caller's own share is
used up, 503 with Retry-After when a queue or budget the server shares is full, a given status for a bound on one
request's own size; the HTTP router adds Retry-After from the error, whatever raised it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from fastoip.errors import InferenceError, ResourceExhausted
from fastoip.server.http.router import Router
from fastoip.shared_memory import SharedMemoryRegistry


def answer(error: InferenceError) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
    async def handler(request: object) -> None:
        raise error

    router = Router()
    router.fixed_paths["/bound"] = {"GET": handler}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/bound", "raw_path": b"/bound", "headers": [],
             "query_string": b""}
    asyncio.run(router(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), orjson.loads(sent[1]["body"])


def test_a_callers_share_is_429_without_retry_after() -> None:
    status, headers, body = answer(ResourceExhausted("this client holds 256 regions"))
    assert (status, body) == (429, {"error": "this client holds 256 regions"})
    assert b"retry-after" not in headers


def test_a_full_shared_queue_is_503_with_retry_after() -> None:
    error = ResourceExhausted("the pool is full", retry_after=1)
    assert error.grpc_code == "RESOURCE_EXHAUSTED"
    status, headers, body = answer(error)
    assert (status, headers[b"retry-after"], body["error"]) == (503, b"1", "the pool is full")


def test_a_bound_on_one_answer_keeps_its_own_status() -> None:
    status, headers, _ = answer(ResourceExhausted("output 'y' is too large", http_status=500))
    assert status == 500 and b"retry-after" not in headers


def test_the_shared_memory_table_says_who_must_act() -> None:
    import os

    key = f"/exhausted_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        registry = SharedMemoryRegistry(limit=2, limit_per_client=1)
        registry.register("a", key, 0, 64, client="10.0.0.1")
        with pytest.raises(ResourceExhausted) as own:
            registry.register("b", key, 0, 64, client="10.0.0.1")
        assert own.value.http_status == 429 and own.value.retry_after is None
        registry.register("c", key, 0, 64, client="10.0.0.2")
        with pytest.raises(ResourceExhausted) as shared:
            registry.register("d", key, 0, 64, client="10.0.0.3")
        assert shared.value.http_status == 503 and shared.value.retry_after == 1
        registry.unregister()
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")

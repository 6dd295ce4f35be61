"""Request and response bodies: reading within the size limit, gzip / deflate both ways.

Rules:
- Request bodies are read incrementally and never beyond ``max_body_size``
  (an infer body's binary tensor data has its own, larger bound and the server's budget: ``read_infer_body``)
  (413, also when Content-Length says so up front); a compressed body
  (Content-Encoding gzip/deflate) is never inflated beyond it either, the loop
  inflates at most 64 KiB of it and data after the compressed stream is a 400
  (``server.inflate``).  After a
  413 uvicorn discards the rest of the body and keeps the connection, so the
  client reads the answer instead of a reset.
- Infer responses are compressed when Accept-Encoding asks for gzip or deflate
  (Triton does the same; note that aiohttp, and so tritonclient.http.aio, asks
  for "gzip, deflate" by default).  Large responses are compressed in the
  executor: zlib releases the GIL, the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any

from ...errors import InvalidArgument, ResourceExhausted
from ..inflate import InflateError, inflate
from .body_budget import BodyHold
from .errors import PayloadTooLarge, too_large
from .router import Request

#: Bodies at least this large are (de)compressed in the executor, not on the loop.
OFF_LOOP_ZLIB_BYTES = 256 * 1024
#: zlib level for responses: the point is bandwidth, so the fastest level.
RESPONSE_ZLIB_LEVEL = 1


async def read_body(request: Request, limit: int, limit_name: str = "--http-max-input-size") -> bytes | bytearray:
    """The whole request body, decompressed; 413 as soon as it is over ``limit`` (named ``limit_name``)."""
    declared = request.headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"the request body is {int(declared)} bytes", limit_name)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgument("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise too_large(f"the request body is more than {limit} bytes", limit_name)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    encoding = request.headers.get(b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
        return await _inflate_body(body, encoding, limit, limit_name)
    return body


async def read_infer_body(
    request: Request, json_limit: int, binary_limit: int, hold: BodyHold
) -> bytes | bytearray:
    """An infer body: with the binary extension (Inference-Header-Content-Length > 0, not compressed) its JSON
    part within ``json_limit`` and its binary part within ``binary_limit``, every byte past ``json_limit`` held
    in ``hold`` (the server's budget); any other body as :func:`read_body` reads it (Triton bounds a raw body,
    header length 0, and an inflated one by --http-max-input-size too)."""
    headers = request.headers
    encoding = headers.get(b"content-encoding")
    compressed = encoding is not None and encoding.strip().lower() not in (b"", b"identity")
    value = headers.get(b"inference-header-content-length")
    json_length = _header_length(value) if value is not None else 0
    if compressed or json_length == 0:
        return await read_body(request, json_limit)
    if json_length > json_limit:
        raise too_large(f"the request's JSON part (Inference-Header-Content-Length) is {json_length} bytes")
    limit = json_length + binary_limit
    declared_text = headers.get(b"content-length")
    declared = int(declared_text) if declared_text is not None and declared_text.isdigit() else None
    if declared is not None:
        if declared > limit:
            raise too_large(f"the request's binary data is {declared - json_length} bytes",
                            "--http-max-binary-input-size")
        if declared > json_limit:
            hold.grow_to(declared)  # before a byte is read: 503 at once when the budget cannot hold it
    # A declared size is read into one buffer (a list of chunks joined would hold the body twice).
    buffer = bytearray(declared) if declared is not None and declared > json_limit else None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgument("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        if chunk:
            end = size + len(chunk)
            if end > limit:
                raise too_large(f"the request's binary data is more than {binary_limit} bytes",
                                "--http-max-binary-input-size")
            if end > json_limit:
                hold.grow_to(end)  # a chunked body (or one longer than it said) draws as it grows
            if buffer is not None and end <= len(buffer):
                buffer[size:end] = chunk
            else:
                if buffer is not None:  # more than Content-Length said (the HTTP parser refuses it first)
                    chunks.append(bytes(buffer[:size]))
                    buffer = None
                chunks.append(chunk)
            size = end
        if not message.get("more_body", False):
            break
    if buffer is not None:
        return buffer if size == len(buffer) else buffer[:size]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _header_length(value: bytes) -> int:
    text = value.decode("latin-1").strip()
    if not text.isdigit():
        raise InvalidArgument(f"Inference-Header-Content-Length must be a non-negative integer, got '{text}'")
    return int(text)


def inference_header_length(headers: dict[bytes, bytes], body_length: int) -> int | None:
    """The parsed Inference-Header-Content-Length (None when absent); 400 when it is not usable."""
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    length = _header_length(value)
    if length > body_length:
        raise InvalidArgument(
            f"Inference-Header-Content-Length is {length}, but the request body has only {body_length} bytes"
        )
    return length


def response_encoding(accept: bytes) -> str | None:
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


def compress(data: bytes, encoding: str) -> bytes:
    # gzip: a gzip wrapper (wbits 31); HTTP "deflate": a zlib stream (wbits 15), which tritonclient inflates.
    compressor = zlib.compressobj(RESPONSE_ZLIB_LEVEL, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    return compressor.compress(data) + compressor.flush()


async def _inflate_body(data: bytes, encoding: bytes, limit: int, limit_name: str) -> bytes | bytearray:
    """The body inflated within ``limit``, mostly off the loop (``server.inflate``); 413 / 400 otherwise."""
    name = encoding.strip().lower()
    if name not in (b"gzip", b"deflate"):
        raise InvalidArgument(
            f"unsupported Content-Encoding '{encoding.decode('latin-1')}'; supported: gzip, deflate, identity"
        )
    # wbits 47 reads a gzip or a zlib stream; some clients send "deflate" as a raw stream (wbits -15).
    for wbits in (47, -15) if name == b"deflate" else (47,):
        try:
            return await inflate(data, wbits, limit, name.decode())
        except InflateError as exc:
            if exc.kind == "too_large":
                raise too_large(f"the decompressed request body is more than {limit} bytes", limit_name) from None
            if exc.kind == "over_budget":
                raise PayloadTooLarge(exc.message) from None
            if exc.kind == "busy":
                raise ResourceExhausted(exc.message, retry_after=1) from None
            if exc.kind == "truncated":
                raise InvalidArgument(f"the {name.decode()} request body is truncated") from None
            if exc.kind == "trailing":
                raise InvalidArgument(f"the request body is not valid {name.decode()} data: {exc.message}") from None
            error = exc.message
    raise InvalidArgument(f"the request body is not valid {name.decode()} data: {error}")


async def off_loop_if_large(size: int, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, in the executor when ``size`` is large (zlib releases the GIL there)."""
    if size < OFF_LOOP_ZLIB_BYTES:
        return function(*args)
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)

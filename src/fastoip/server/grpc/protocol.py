"""gRPC over HTTP/2 details the native frontend needs: header blocks, statuses, timeouts, compression.

Rules:
- Pure functions on bytes and strings, no I/O, so each rule of gRPC's
  PROTOCOL-HTTP2 spec is testable on its own.
- Status codes are grpc.StatusCode's numbers, looked up by the name the core
  errors carry (``InferenceError.grpc_code``).
"""

from __future__ import annotations

import zlib
from urllib.parse import quote

import grpc

from ..inflate import InflateError, inflate_now

Headers = list[tuple[bytes, bytes]]
#: A received message: bytes, or the bytearray a large message was gathered in (no copy out of it).
Payload = bytes | bytearray

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
INTERNAL = 13
UNAVAILABLE = 14
UNIMPLEMENTED = 12

#: What this server decompresses (and says so in grpc-accept-encoding).
ACCEPT_ENCODING = b"identity,deflate,gzip"

RESPONSE_HEADERS: Headers = [
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", ACCEPT_ENCODING),
]

# grpc-timeout units -> nanoseconds per unit.
_TIMEOUT_UNITS = {b"H": 3600 * 10**9, b"M": 60 * 10**9, b"S": 10**9, b"m": 10**6, b"u": 10**3, b"n": 1}


def status_code(name: str) -> int:
    """The numeric gRPC status for a grpc.StatusCode name (UNKNOWN for names that are not one)."""
    try:
        return int(grpc.StatusCode[name].value[0])
    except KeyError:
        return UNKNOWN


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for bytes outside printable ASCII and for '%'."""
    return quote(message, safe=" !\"#$&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"
                                "abcdefghijklmnopqrstuvwxyz{|}~").encode("ascii")


def trailers(code: int, message: str = "") -> Headers:
    """The trailers that end a response."""
    block = [(b"grpc-status", str(code).encode())]
    if message:
        block.append((b"grpc-message", percent_encode(message)))
    return block


#: The trailers of a call answered OK (``trailers(OK)``, built once; nghttp2 copies what it sends).
OK_TRAILERS: Headers = [(b"grpc-status", b"0")]


def trailers_only(code: int, message: str = "") -> Headers:
    """gRPC's Trailers-Only response (an error before any message): one HEADERS frame."""
    return RESPONSE_HEADERS + trailers(code, message)


def parse_timeout(value: bytes) -> int | None:
    """grpc-timeout ("100m", "5S", at most 8 digits) in nanoseconds; None when malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    return None if unit is None else int(value[:-1]) * unit


class DecompressError(Exception):
    """A compressed message this server cannot read (unknown encoding, corrupt, or over the limit)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: gRPC core's ranking of the algorithms it compresses with, least compression first.
_RANKED_ENCODINGS = (b"gzip", b"deflate")


def response_encoding(level: str, accept: bytes | None) -> bytes | None:
    """The algorithm a response is compressed with for Triton's compression ``level``, None for none.

    As gRPC core's algorithm-for-level: of the algorithms the client accepts (its
    grpc-accept-encoding), ranked gzip then deflate, low takes the first, medium
    the middle one, high the last.  A client that accepts neither gets identity.
    """
    if level == "none" or not accept:
        return None
    accepted = {item.strip() for item in accept.split(b",")}
    ranked = [name for name in _RANKED_ENCODINGS if name in accepted]
    if not ranked:
        return None
    index = {"low": 0, "medium": len(ranked) // 2, "high": len(ranked) - 1}[level]
    return ranked[index]


def compress(data: bytes, encoding: bytes) -> bytes:
    """A response message compressed with ``encoding`` (gzip or deflate, zlib's default level)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS
    deflater = zlib.compressobj(wbits=wbits)
    return deflater.compress(data) + deflater.flush()


def wbits_for(encoding: bytes) -> int:
    """zlib's wbits for a grpc-encoding this server reads; DecompressError(UNIMPLEMENTED) for any other."""
    if encoding == b"gzip":
        return 16 + zlib.MAX_WBITS
    if encoding == b"deflate":
        return zlib.MAX_WBITS
    name = encoding.decode("latin-1") or "identity"
    raise DecompressError(UNIMPLEMENTED, f"compressed message with grpc-encoding {name!r}; "
                                         f"this server reads {ACCEPT_ENCODING.decode()}")


def inflate_error(exc: InflateError) -> DecompressError:
    """A gRPC status for an inflation that failed: over a limit or budget (or the pool full) is RESOURCE_EXHAUSTED,
    the rest INTERNAL."""
    exhausted = exc.kind in ("too_large", "over_budget", "busy")
    return DecompressError(RESOURCE_EXHAUSTED if exhausted else INTERNAL, exc.message)


def decompress(data: Payload, encoding: bytes, limit: int) -> bytearray:
    """A message sent with the compressed flag, decoded in this thread; never more than ``limit`` bytes out."""
    try:
        return inflate_now(data, wbits_for(encoding), limit, encoding.decode())
    except InflateError as exc:
        raise inflate_error(exc) from None

"""The checks on a request's head (its HEADERS) before a native gRPC call starts: one pure function.

Rules:
- No I/O and no connection state: header fields in, a verdict out, so each rule
  is testable on its own and a new one (a header limit, an authority check) is
  one more line here.
- The order is the order of the answers a client sees: HTTP method (405),
  content-type (415), grpc-timeout (INVALID_ARGUMENT), Triton's restricted
  protocols (UNAVAILABLE).  Which RPC the path names is the dispatcher's job.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..restricted import Restriction
from . import protocol as wire  # gRPC over HTTP/2 rules (fastoip.wire is the codecs)

#: The header block of a 405 answer (gRPC is POST only).
NOT_POST: wire.Headers = [(b":status", b"405"), (b"allow", b"POST")]
#: The header block of a 415 answer (gRPC over HTTP/2: a content-type that is not gRPC's).
NOT_GRPC: wire.Headers = [(b":status", b"415"), (b"content-type", b"text/plain")]


class AcceptedHead:
    """A request head that may start a call (a plain class: a NamedTuple's ``__new__`` is interpreted Python)."""

    __slots__ = ("fields", "path", "timeout_ns", "encoding")

    def __init__(self, fields: dict[bytes, bytes], path: bytes, timeout_ns: int | None, encoding: bytes) -> None:
        self.fields = fields
        self.path = path
        #: grpc-timeout in nanoseconds; None: no deadline.
        self.timeout_ns = timeout_ns
        #: grpc-encoding of the request's compressed messages (identity: none).
        self.encoding = encoding

    def _key(self) -> tuple[dict[bytes, bytes], bytes, int | None, bytes]:
        return self.fields, self.path, self.timeout_ns, self.encoding

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AcceptedHead) and self._key() == other._key()

    def __repr__(self) -> str:
        return f"AcceptedHead(path={self.path!r}, timeout_ns={self.timeout_ns}, encoding={self.encoding!r})"


def read_head(
    headers: wire.Headers, restricted: Mapping[bytes, Restriction]
) -> AcceptedHead | wire.Headers:
    """The head of a call, or the header block (END_STREAM) that answers the stream instead.

    ``restricted``: :path of a restricted RPC -> what it needs (--grpc-restricted-protocol); empty: none.
    """
    fields = dict(headers)
    if fields.get(b":method") != b"POST":
        return NOT_POST
    content_type = fields.get(b"content-type", b"")
    if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+",
                                                                              b"application/grpc;"))):
        return NOT_GRPC
    timeout = fields.get(b"grpc-timeout")
    timeout_ns = None
    if timeout is not None:
        timeout_ns = wire.parse_timeout(timeout)
        if timeout_ns is None:
            return wire.trailers_only(wire.INVALID_ARGUMENT, f"malformed grpc-timeout {timeout!r}")
    path = fields.get(b":path", b"")
    if restricted:
        restriction = restricted.get(path)
        if restriction is not None:
            # a header sent more than once is read by its first value, as the grpcio frontend reads it (issue 27)
            given = next((value for key, value in headers if key == restriction.lookup_key), None)
            if not restriction.allows(given):
                return wire.trailers_only(wire.UNAVAILABLE, restriction.grpc_refusal())  # Triton's words
    return AcceptedHead(fields, path, timeout_ns, fields.get(b"grpc-encoding", b"identity"))

"""Types of the libnghttp2 session binding (see _http2.pyx)."""


Headers = list[tuple[bytes, bytes]]
#: (kind, stream_id, payload, number); payload is Headers for REQUEST, bytes for MESSAGE, else None.
Event = tuple[int, int, Headers | bytes | None, int]

REQUEST: int
MESSAGE: int
END_STREAM: int
CLOSED: int
TOO_LARGE: int
PING_ACK: int

NO_ERROR: int
PROTOCOL_ERROR: int
INTERNAL_ERROR: int
CANCEL: int
REFUSED_STREAM: int

class Http2Error(Exception):
    """The peer broke the HTTP/2 protocol (or nghttp2 failed): close the connection."""

class Http2Session:
    """One HTTP/2 server connection's protocol state."""

    def __init__(
        self,
        max_message_size: int,
        max_concurrent_streams: int = ...,
        stream_window: int = ...,
        connection_window: int = ...,
        max_frame_size: int = ...,
        max_header_list_size: int = ...,
    ) -> None: ...
    def receive(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed received bytes; the events they completed, in order."""
    def data_to_send(self) -> list[bytes | memoryview]:
        """Everything nghttp2 has ready to write, as buffers for one writelines ([] when nothing)."""
    def want_read(self) -> bool: ...
    def want_write(self) -> bool: ...
    def open_streams(self) -> int: ...
    def queued_bytes(self) -> int:
        """Response bytes not yet handed to nghttp2 (a peer that does not read makes this grow)."""
    def progress(self, stream_id: int) -> tuple[int, int]:
        """(DATA bytes received, bytes of an incomplete message held) on a stream; (-1, 0) when it is gone."""
    def is_open(self, stream_id: int) -> bool: ...
    def send_headers(self, stream_id: int, headers: Headers) -> bool:
        """Response HEADERS; the body follows with send_message and ends with send_trailers."""
    def send_headers_only(self, stream_id: int, headers: Headers) -> bool:
        """One HEADERS frame with END_STREAM (gRPC's Trailers-Only, or a plain HTTP error)."""
    def send_message(self, stream_id: int, message: bytes, compressed: bool = ...) -> bool:
        """One gRPC message (prefix + bytes) as DATA on a stream whose HEADERS went out."""
    def send_message_parts(self, stream_id: int, parts: list[bytes | memoryview]) -> bool:
        """``send_message`` of a message given as parts (bytes or byte memoryviews), sent where they are."""
    def send_trailers(self, stream_id: int, trailers: Headers) -> bool:
        """End the response: trailers go out after the DATA already queued."""
    def reset(self, stream_id: int, error_code: int) -> None:
        """RST_STREAM."""
    def shutdown_notice(self) -> None:
        """The first GOAWAY of a graceful shutdown."""
    def goaway(self, error_code: int = ...) -> None:
        """The final GOAWAY: streams above the last one processed are refused."""
    def ping(self) -> None: ...

"""Types of the libnghttp2 session binding (see _http2.pyx)."""


Headers = list[tuple[bytes, bytes]]

class RequestReceived:
    """A request's HEADERS (and CONTINUATIONs) arrived: its header fields, in order, as bytes pairs."""

    @property
    def stream_id(self) -> int: ...
    @property
    def headers(self) -> Headers: ...

class MessageReceived:
    """One whole gRPC message: bytes, or the bytearray it was gathered in (nobody else holds it); ``flag``: its
    compressed-flag byte as sent (0 or 1 in valid gRPC; the connection refuses any other value)."""

    @property
    def stream_id(self) -> int: ...
    @property
    def data(self) -> bytes | bytearray: ...
    @property
    def flag(self) -> int: ...

class RequestEnded:
    """The client half-closed the stream; ``leftover``: bytes of an incomplete message it left (0: clean)."""

    @property
    def stream_id(self) -> int: ...
    @property
    def leftover(self) -> int: ...

class StreamClosed:
    """The stream is gone before its trailers went out whole (reset by either side, or after a Trailers-Only
    answer); ``error_code``: HTTP/2's (0: closed normally).  A stream closed normally after its trailers is not
    reported."""

    @property
    def stream_id(self) -> int: ...
    @property
    def error_code(self) -> int: ...

class MessageTooLarge:
    """A message prefix declared more than the limit: the rest of the stream's request is ignored."""

    @property
    def stream_id(self) -> int: ...
    @property
    def declared(self) -> int: ...

class PingAcknowledged:
    """The peer acknowledged a PING this side sent."""

Event = RequestReceived | MessageReceived | RequestEnded | StreamClosed | MessageTooLarge | PingAcknowledged

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
    def send_headers_only(self, stream_id: int, headers: Headers, reset: bool = ...) -> bool:
        """One HEADERS frame with END_STREAM (gRPC's Trailers-Only, or a plain HTTP error).

        ``reset``: RST_STREAM(NO_ERROR) follows it in the same ``data_to_send`` (an answer before the
        request ended).
        """
    def send_message(self, stream_id: int, message: bytes, compressed: bool = ...) -> bool:
        """One gRPC message (prefix + bytes) as DATA on a stream whose HEADERS went out."""
    def send_message_parts(self, stream_id: int, parts: list[bytes | memoryview]) -> bool:
        """``send_message`` of a message given as parts (bytes or byte memoryviews), sent where they are."""
    def answer(self, stream_id: int, headers: Headers, message: bytes | list[bytes | memoryview],
               trailers: Headers) -> bool:
        """A unary call's whole answer: headers, its one message, trailers."""
    def send_trailers(self, stream_id: int, trailers: Headers, reset: bool = ...) -> bool:
        """End the response: trailers go out after the DATA already queued (``reset``: then RST_STREAM)."""
    def reset(self, stream_id: int, error_code: int) -> None:
        """RST_STREAM now."""
    def shutdown_notice(self) -> None:
        """The first GOAWAY of a graceful shutdown."""
    def goaway(self, error_code: int = ...) -> None:
        """The final GOAWAY: streams above the last one processed are refused."""
    def ping(self) -> None: ...

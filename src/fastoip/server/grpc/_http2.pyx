# cython: language_level=3
"""A server-side HTTP/2 session on libnghttp2, shaped for gRPC.

Rules:
- nghttp2 does all of HTTP/2: framing, HPACK, flow control, SETTINGS/PING
  acknowledgements, stream state and protocol-error handling.  This module only
  moves bytes in and out of it and turns its callbacks into events.
- gRPC's 5-byte message prefix is parsed here, bounds-checked against the
  maximum message size before any buffering, so Python sees whole messages.
- Nothing here touches sockets or the event loop: ``receive`` takes bytes and
  returns events (typed values, one class per kind: RequestReceived,
  MessageReceived, RequestEnded, StreamClosed, MessageTooLarge,
  PingAcknowledged), ``data_to_send`` returns the bytes to write.
- An answer before the request ended is sent and reset here
  (``send_headers_only(..., reset=True)``): the RST_STREAM(NO_ERROR) follows
  the answer in the same ``data_to_send``.
- Declarations live beside this file: ``_nghttp2.pxd`` (the C library) and
  ``_http2.pxd`` (the fields of a stream and of the session).
"""

cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy


from ._nghttp2 cimport *


# -- events: what receive() returns, one typed value per thing that happened, in order --------------

@cython.final
@cython.freelist(64)
cdef class RequestReceived:
    """A request's HEADERS (and CONTINUATIONs) arrived: its header fields, in order, as bytes pairs."""

    cdef readonly int32_t stream_id
    cdef readonly list headers

    def __repr__(self):
        return f"RequestReceived(stream_id={self.stream_id}, headers={self.headers!r})"


@cython.final
@cython.freelist(64)
cdef class MessageReceived:
    """One whole gRPC message: bytes, or the bytearray it was gathered in (nobody else holds it); ``flag``: its
    compressed-flag byte as sent (0 or 1 in valid gRPC; the connection refuses any other value)."""

    cdef readonly int32_t stream_id
    cdef readonly object data
    cdef readonly uint8_t flag

    def __repr__(self):
        return f"MessageReceived(stream_id={self.stream_id}, {len(self.data)} bytes, flag={self.flag})"


@cython.final
@cython.freelist(64)
cdef class RequestEnded:
    """The client half-closed the stream; ``leftover``: bytes of an incomplete message it left (0: clean)."""

    cdef readonly int32_t stream_id
    cdef readonly Py_ssize_t leftover

    def __repr__(self):
        return f"RequestEnded(stream_id={self.stream_id}, leftover={self.leftover})"


@cython.final
@cython.freelist(64)
cdef class StreamClosed:
    """The stream is gone before its answer (trailers) went out whole: reset by either side, or closed after a
    Trailers-Only answer; ``error_code``: HTTP/2's (0: closed normally).  A stream that closes normally once its
    trailers went out is not reported."""

    cdef readonly int32_t stream_id
    cdef readonly uint32_t error_code

    def __repr__(self):
        return f"StreamClosed(stream_id={self.stream_id}, error_code={self.error_code})"


@cython.final
cdef class MessageTooLarge:
    """A message prefix declared more than the limit: the rest of the stream's request is ignored."""

    cdef readonly int32_t stream_id
    cdef readonly Py_ssize_t declared

    def __repr__(self):
        return f"MessageTooLarge(stream_id={self.stream_id}, declared={self.declared})"


@cython.final
cdef class PingAcknowledged:
    """The peer acknowledged a PING this side sent."""

    def __repr__(self):
        return "PingAcknowledged()"


cdef inline RequestReceived _request_received(int32_t stream_id, list headers):
    cdef RequestReceived event = RequestReceived.__new__(RequestReceived)
    event.stream_id = stream_id
    event.headers = headers
    return event


cdef inline MessageReceived _message_received(int32_t stream_id, object data, uint8_t flag):
    cdef MessageReceived event = MessageReceived.__new__(MessageReceived)
    event.stream_id = stream_id
    event.data = data
    event.flag = flag
    return event


cdef inline RequestEnded _request_ended(int32_t stream_id, Py_ssize_t leftover):
    cdef RequestEnded event = RequestEnded.__new__(RequestEnded)
    event.stream_id = stream_id
    event.leftover = leftover
    return event


cdef inline StreamClosed _stream_closed(int32_t stream_id, uint32_t error_code):
    cdef StreamClosed event = StreamClosed.__new__(StreamClosed)
    event.stream_id = stream_id
    event.error_code = error_code
    return event


cdef inline MessageTooLarge _message_too_large(int32_t stream_id, Py_ssize_t declared):
    cdef MessageTooLarge event = MessageTooLarge.__new__(MessageTooLarge)
    event.stream_id = stream_id
    event.declared = declared
    return event


NO_ERROR = NGHTTP2_NO_ERROR
PROTOCOL_ERROR = NGHTTP2_PROTOCOL_ERROR
INTERNAL_ERROR = NGHTTP2_INTERNAL_ERROR
CANCEL = NGHTTP2_CANCEL
REFUSED_STREAM = NGHTTP2_REFUSED_STREAM


class Http2Error(Exception):
    """The peer broke the HTTP/2 protocol (or nghttp2 failed): close the connection."""


cdef inline bytes _prefix(bint compressed, Py_ssize_t size):
    """gRPC's 5-byte message prefix: the compressed flag, then the length (big-endian)."""
    cdef uint8_t head[PREFIX]
    head[0] = 1 if compressed else 0
    head[1] = (size >> 24) & 0xFF
    head[2] = (size >> 16) & 0xFF
    head[3] = (size >> 8) & 0xFF
    head[4] = size & 0xFF
    return PyBytes_FromStringAndSize(<const char *>head, PREFIX)


@cython.freelist(64)
cdef class _Stream:
    """What the binding keeps about one request stream (its fields: _http2.pxd)."""

    def __cinit__(self, int32_t stream_id):
        self.stream_id = stream_id
        self.headers = []
        self.out = []

    cdef Py_ssize_t partial(self):
        """Bytes of an incomplete message received so far (prefix included)."""
        return self.head_len + (PREFIX + self.filled if self.message is not None else 0)


cdef class Http2Session:
    """One HTTP/2 server connection's protocol state (see the module rules; its fields: _http2.pxd)."""

    def __cinit__(self):
        self._session = NULL
        self._outbuf = NULL
        self._outcap = 0

    def __init__(self, Py_ssize_t max_message_size, uint32_t max_concurrent_streams=1024,
                 int32_t stream_window=8 * 1024 * 1024, int32_t connection_window=64 * 1024 * 1024,
                 uint32_t max_frame_size=256 * 1024, uint32_t max_header_list_size=64 * 1024):
        cdef nghttp2_session_callbacks *callbacks
        cdef nghttp2_option *option
        cdef nghttp2_settings_entry settings[4]
        cdef int rv
        self._streams = {}
        self._queued = 0
        self._events = []
        self._resets = []
        self._max_message = max_message_size
        self._max_header_list = max_header_list_size
        self._failure = None
        if nghttp2_session_callbacks_new(&callbacks) != 0:
            raise MemoryError()
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, _on_frame_recv)
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, _on_begin_headers)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, _on_header)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, _on_data_chunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, _on_stream_close)
        nghttp2_session_callbacks_set_send_data_callback(callbacks, _send_data)
        nghttp2_session_callbacks_set_data_source_read_length_callback(callbacks, _read_length)
        if nghttp2_option_new(&option) != 0:
            nghttp2_session_callbacks_del(callbacks)
            raise MemoryError()
        # A flood of PINGs / SETTINGS whose ACKs pile up unsent ends the connection (nghttp2's guard).
        nghttp2_option_set_max_outbound_ack(option, 1000)
        # metadata values with surrounding spaces ("-H 'key: value'") are accepted, as grpcio's server does
        nghttp2_option_set_no_rfc9113_leading_and_trailing_ws_validation(option, 1)
        rv = nghttp2_session_server_new2(&self._session, callbacks, <void *>self, option)
        nghttp2_option_del(option)
        nghttp2_session_callbacks_del(callbacks)
        if rv != 0:
            raise MemoryError(nghttp2_strerror(rv).decode())
        settings[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        settings[0].value = max_concurrent_streams
        settings[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        settings[1].value = <uint32_t>stream_window
        settings[2].settings_id = NGHTTP2_SETTINGS_MAX_FRAME_SIZE
        settings[2].value = max_frame_size
        settings[3].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        settings[3].value = max_header_list_size
        rv = nghttp2_submit_settings(self._session, NGHTTP2_FLAG_NONE, settings, 4)
        if rv == 0:
            # The connection window is not a SETTING: it grows by a WINDOW_UPDATE on stream 0.
            rv = nghttp2_session_set_local_window_size(self._session, NGHTTP2_FLAG_NONE, 0, connection_window)
        if rv != 0:
            raise ValueError(nghttp2_strerror(rv).decode())

    def __dealloc__(self):
        if self._session != NULL:
            nghttp2_session_del(self._session)
            self._session = NULL
        if self._outbuf != NULL:
            free(self._outbuf)
            self._outbuf = NULL

    # -- input -------------------------------------------------------------------------------
    def receive(self, const uint8_t[::1] data not None):
        """Feed received bytes; the events they completed, in order."""
        cdef ssize_t rv
        cdef list events
        if data.shape[0] > 0:
            rv = nghttp2_session_mem_recv(self._session, &data[0], data.shape[0])
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if rv < 0:
                raise Http2Error(nghttp2_strerror(<int>rv).decode())
        events, self._events = self._events, []
        return events

    cdef int _data_chunk(self, int32_t stream_id, const uint8_t *data, size_t length) except -1:
        """Cut DATA into gRPC messages, copying each message byte once, from nghttp2's input into the message.

        A message that arrived whole becomes bytes; one that comes in pieces gets a bytearray allocated from
        its length prefix (all of it up to EAGER_RESERVE, growing by doubling above) that the pieces are
        copied into and that is handed over as it is: no buffer is joined or grown by copying.
        """
        cdef _Stream stream = self._streams.get(stream_id)
        cdef const uint8_t *head
        cdef size_t take, declared
        cdef Py_ssize_t size
        cdef uint8_t compressed
        if stream is None:
            return 0
        stream.received += length
        if stream.broken:
            return 0
        while length > 0:
            if stream.message is None:
                if stream.head_len == 0 and length >= PREFIX:
                    head = data
                    data += PREFIX
                    length -= PREFIX
                else:
                    take = min(<size_t>(PREFIX - stream.head_len), length)
                    memcpy(stream.head + stream.head_len, data, take)
                    stream.head_len += take
                    data += take
                    length -= take
                    if stream.head_len < PREFIX:
                        return 0
                    stream.head_len = 0
                    head = stream.head
                compressed = head[0]
                declared = (<size_t>head[1] << 24) | (<size_t>head[2] << 16) | (<size_t>head[3] << 8) | head[4]
                if <Py_ssize_t>declared > self._max_message:
                    return self._too_large(stream, declared)
                if length >= declared:
                    self._events.append(_message_received(
                        stream_id, PyBytes_FromStringAndSize(<const char *>data, declared), compressed))
                    data += declared
                    length -= declared
                    continue
                stream.message = PyByteArray_FromStringAndSize(NULL, min(<Py_ssize_t>declared, EAGER_RESERVE))
                stream.declared = declared
                stream.filled = 0
                stream.head[0] = compressed
            take = min(length, <size_t>(stream.declared - stream.filled))
            size = PyByteArray_GET_SIZE(stream.message)
            if stream.filled + <Py_ssize_t>take > size:
                # large messages are mmap-ed by malloc, so growing one remaps pages instead of copying them
                PyByteArray_Resize(stream.message, min(stream.declared, max(2 * size, stream.filled + <Py_ssize_t>take)))
            memcpy(PyByteArray_AS_STRING(stream.message) + stream.filled, data, take)
            stream.filled += take
            data += take
            length -= take
            if stream.filled == stream.declared:
                self._events.append(_message_received(stream_id, stream.message, stream.head[0]))
                stream.message = None
        return 0

    cdef int _refuse_headers(self, _Stream stream) except -1:
        """Request headers over the advertised list size: Trailers-Only RESOURCE_EXHAUSTED (grpc-core's status
        for metadata over its limit; HTTP's 431), then RST_STREAM(NO_ERROR) so the request body stops."""
        message = (f"request headers of more than {self._max_header_list} bytes "
                   f"(SETTINGS_MAX_HEADER_LIST_SIZE)").encode()
        stream.responded = True
        self._submit(stream.stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                        (b"grpc-status", b"8"), (b"grpc-message", message)], NULL, False)
        self._reset_after_send(stream)  # after the answer is serialized: a RST_STREAM queued now would drop it
        return 0

    cdef int _too_large(self, _Stream stream, size_t declared) except -1:
        stream.broken = True
        stream.message = None
        stream.head_len = 0
        self._events.append(_message_too_large(stream.stream_id, declared))
        return 0

    # -- output ------------------------------------------------------------------------------
    def data_to_send(self):
        """Everything nghttp2 has ready to write, as a list of buffers for one ``writelines`` ([] when nothing).

        Frames nghttp2 serializes (control frames, HEADERS, DATA from short chunks, which the data provider
        copies into its frame buffer) are gathered into one bytes object per run; DATA from long response
        chunks leaves as its 9-byte header plus a memoryview of the message (NGHTTP2_DATA_FLAG_NO_COPY), so
        a large response is not copied on its way to the socket.
        """
        cdef list chunks
        cdef int32_t stream_id
        self._outlen = 0
        self._outchunks = []
        self._send_all()
        if self._resets:
            # early answers went out above: now their RST_STREAM(NO_ERROR), which stops the client's upload
            for stream_id in self._resets:
                if stream_id in self._streams:
                    nghttp2_submit_rst_stream(self._session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_NO_ERROR)
            self._resets.clear()
            self._send_all()
        self._cut()
        chunks, self._outchunks = self._outchunks, []
        return chunks

    cdef int _send_all(self) except -1:
        """Every frame nghttp2 has ready, into the output buffer (or the chunk list: NO_COPY DATA)."""
        cdef const uint8_t *chunk
        cdef ssize_t n
        while True:
            n = nghttp2_session_mem_send(self._session, &chunk)
            if n < 0:
                raise Http2Error(nghttp2_strerror(<int>n).decode())
            if n == 0:
                break
            self._append(chunk, n)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return 0

    cdef int _append(self, const uint8_t *data, size_t n) except -1:
        """Copy serialized frame bytes into the scratch buffer (one write per flush instead of one per frame)."""
        cdef uint8_t *grown
        cdef size_t cap
        if self._outlen + n > self._outcap:
            cap = max(self._outcap * 2, self._outlen + n, 65536)
            grown = <uint8_t *>realloc(self._outbuf, cap)
            if grown == NULL:
                raise MemoryError()
            self._outbuf = grown
            self._outcap = cap
        memcpy(self._outbuf + self._outlen, data, n)
        self._outlen += n
        return 0

    cdef int _cut(self) except -1:
        """The scratch buffer's bytes so far become one output chunk."""
        if self._outlen:
            self._outchunks.append(PyBytes_FromStringAndSize(<const char *>self._outbuf, self._outlen))
            self._outlen = 0
        return 0

    cdef int _send_data(self, int32_t stream_id, const uint8_t *framehd, size_t length) except -1:
        """A NO_COPY DATA frame: its header, then the slice of the message the data provider set aside."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.pending is None or len(stream.pending) != <Py_ssize_t>length:
            raise Http2Error(f"DATA frame of {length} bytes on stream {stream_id} has no payload set aside")
        self._append(framehd, FRAME_HEADER)
        self._cut()
        self._outchunks.append(stream.pending)
        stream.pending = None
        return 0

    def want_read(self) -> bool:
        return nghttp2_session_want_read(self._session) != 0

    def want_write(self) -> bool:
        return nghttp2_session_want_write(self._session) != 0

    def open_streams(self) -> int:
        return len(self._streams)

    def queued_bytes(self) -> int:
        """Response bytes not yet handed to nghttp2 (a peer that does not read makes this grow)."""
        return self._queued

    def progress(self, int32_t stream_id):
        """(DATA bytes received, bytes of an incomplete message held) on a stream; (-1, 0) when it is gone."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None:
            return -1, 0
        return stream.received, stream.partial()

    def is_open(self, int32_t stream_id) -> bool:
        return stream_id in self._streams

    def send_headers(self, int32_t stream_id, list headers):
        """Response HEADERS; the body follows with send_message and ends with send_trailers."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.responded:
            return False
        self._respond(stream, headers)
        return True

    cdef int _respond(self, _Stream stream, list headers) except -1:
        """Submit the response HEADERS of ``stream``, its DATA to come from the stream's queued chunks."""
        cdef nghttp2_data_provider provider
        provider.source.ptr = NULL
        provider.read_callback = _read_data
        stream.responded = True
        self._submit(stream.stream_id, headers, &provider, False)
        return 0

    def send_headers_only(self, int32_t stream_id, list headers, bint reset=False):
        """One HEADERS frame with END_STREAM (gRPC's Trailers-Only, or a plain HTTP error).

        ``reset``: the answer comes before the request ended, so RST_STREAM(NO_ERROR) follows it in the
        same ``data_to_send`` and the client stops sending (RFC 9113 8.1); also when the stream had
        already answered (the reset then ends what it was doing).
        """
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None:
            return False
        if reset:
            self._reset_after_send(stream)
        if stream.responded:
            return False
        stream.responded = True
        self._submit(stream_id, headers, NULL, False)
        return True

    def send_message(self, int32_t stream_id, bytes message not None, bint compressed=False):
        """One gRPC message (prefix + bytes) as DATA on a stream whose HEADERS went out."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return False
        self._queue_message(stream, message, compressed)
        self._resume(stream)
        return True

    def send_message_parts(self, int32_t stream_id, list parts):
        """``send_message`` of a message given as parts: bytes, or C-contiguous byte memoryviews (format "B"),
        such as the codec's ``encode_infer_response_parts``; they are sent from where they are, not joined."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return False
        self._queue_parts(stream, parts)
        self._resume(stream)
        return True

    def answer(self, int32_t stream_id, list headers, object message, list trailers):
        """A unary call's whole answer in one call: ``send_headers``, then ``send_message`` (``message``: bytes)
        or ``send_message_parts`` (a list of parts), then ``send_trailers``; False (nothing queued) when the
        stream is gone or has answered already."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.responded or stream.trailers is not None:
            return False
        if type(message) is list:
            self._queue_parts(stream, <list>message)  # (checked before anything is submitted)
        elif type(message) is bytes:
            self._queue_message(stream, <bytes>message, False)
        else:
            raise TypeError("a message is bytes or a list of parts")
        self._respond(stream, headers)
        stream.trailers = trailers
        return True

    cdef int _queue_message(self, _Stream stream, bytes message, bint compressed) except -1:
        cdef Py_ssize_t size = PyBytes_GET_SIZE(message)
        if size > 0xFFFFFFFF:
            raise ValueError("gRPC message over 4 GiB")
        stream.out.append(_prefix(compressed, size))
        if size:
            stream.out.append(message)
        stream.out_bytes += PREFIX + size
        self._queued += PREFIX + size
        return 0

    cdef int _queue_parts(self, _Stream stream, list parts) except -1:
        cdef Py_ssize_t size = 0
        for part in parts:
            if type(part) is not bytes and (type(part) is not memoryview or part.format != "B"
                                            or not part.c_contiguous):
                raise TypeError("message parts must be bytes or C-contiguous byte memoryviews")
            size += len(part)
        if size > 0xFFFFFFFF:
            raise ValueError("gRPC message over 4 GiB")
        stream.out.append(_prefix(False, size))
        for part in parts:
            if len(part):
                stream.out.append(part)
        stream.out_bytes += PREFIX + size
        self._queued += PREFIX + size
        return 0

    def send_trailers(self, int32_t stream_id, list trailers, bint reset=False):
        """End the response: trailers go out after the DATA already queued.

        ``reset``: RST_STREAM(NO_ERROR) follows in the same ``data_to_send`` (see send_headers_only).
        """
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None:
            return False
        if reset:
            self._reset_after_send(stream)
        if stream.trailers is not None:
            return False
        stream.trailers = trailers
        self._resume(stream)
        return True

    cdef int _reset_after_send(self, _Stream stream) except -1:
        if not stream.reset_when_sent:
            stream.reset_when_sent = True
            self._resets.append(stream.stream_id)
        return 0

    def reset(self, int32_t stream_id, uint32_t error_code):
        """RST_STREAM now (an early answer resets with ``reset=True`` instead, after the answer went out)."""
        if stream_id in self._streams:
            nghttp2_submit_rst_stream(self._session, NGHTTP2_FLAG_NONE, stream_id, error_code)

    def shutdown_notice(self):
        """The first GOAWAY of a graceful shutdown (last stream id 2^31-1): stop opening streams."""
        nghttp2_submit_shutdown_notice(self._session)

    def goaway(self, uint32_t error_code=NGHTTP2_NO_ERROR):
        """The final GOAWAY: streams above the last one processed are refused."""
        nghttp2_submit_goaway(self._session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(self._session),
                              error_code, NULL, 0)

    def ping(self):
        nghttp2_submit_ping(self._session, NGHTTP2_FLAG_NONE, NULL)

    cdef void _resume(self, _Stream stream):
        if stream.deferred:
            stream.deferred = False
            nghttp2_session_resume_data(self._session, stream.stream_id)

    cdef int _submit(self, int32_t stream_id, list headers, const nghttp2_data_provider *provider,
                     bint trailer) except -1:
        cdef Py_ssize_t count = len(headers)
        cdef nghttp2_nv short[SHORT_HEADERS]  # a gRPC answer's few fields: no allocation
        cdef nghttp2_nv *nva = short
        cdef Py_ssize_t i
        cdef bytes name, value
        cdef int rv
        if count > SHORT_HEADERS:
            nva = <nghttp2_nv *>malloc(count * sizeof(nghttp2_nv))
            if nva == NULL:
                raise MemoryError()
        try:
            for i in range(count):
                name, value = headers[i]
                nva[i].name = <uint8_t *>PyBytes_AS_STRING(name)
                nva[i].namelen = PyBytes_GET_SIZE(name)
                nva[i].value = <uint8_t *>PyBytes_AS_STRING(value)
                nva[i].valuelen = PyBytes_GET_SIZE(value)
                nva[i].flags = NGHTTP2_NV_FLAG_NONE
            # nghttp2 copies the header block: the bytes objects need not outlive the call.
            if trailer:
                rv = nghttp2_submit_trailer(self._session, stream_id, nva, count)
            else:
                rv = nghttp2_submit_response(self._session, stream_id, nva, count, provider)
        finally:
            if nva != short:
                free(nva)
        if rv != 0:
            raise Http2Error(nghttp2_strerror(rv).decode())
        return 0

    cdef ssize_t _read(self, int32_t stream_id, uint8_t *buf, size_t length, uint32_t *data_flags) except? -999:
        """Fill one DATA frame from the stream's queued chunks (nghttp2's data provider).

        A frame that starts on a long chunk is not copied: it carries a slice of that chunk, set aside for
        ``_send_data`` (NO_COPY); short chunks (the 5-byte prefix, small messages) are copied into ``buf``.
        """
        cdef _Stream stream = self._streams.get(stream_id)
        cdef size_t written = 0, take
        cdef object chunk             # bytes, or a byte memoryview (send_message_parts)
        cdef const char *data
        cdef Py_ssize_t left
        if stream is None:
            return NGHTTP2_ERR_CALLBACK_FAILURE
        while written < length and stream.out:
            chunk = stream.out[0]
            if type(chunk) is bytes:
                data = PyBytes_AS_STRING(chunk)
                left = PyBytes_GET_SIZE(chunk) - stream.out_offset
            else:
                data = <const char *>PyMemoryView_GET_BUFFER(chunk).buf
                left = PyMemoryView_GET_BUFFER(chunk).len - stream.out_offset
            if written == 0 and left >= NO_COPY_MIN:
                take = min(<size_t>left, length)
                stream.pending = memoryview(chunk)[stream.out_offset:stream.out_offset + <Py_ssize_t>take]
                data_flags[0] |= NGHTTP2_DATA_FLAG_NO_COPY
            else:
                # a long chunk behind a short one (a message behind its prefix) lends this frame only a
                # little, so the frames after it start on it and go without a copy
                take = min(<size_t>left, length - written, <size_t>NO_COPY_MIN)
                memcpy(buf + written, data + stream.out_offset, take)
            written += take
            stream.out_bytes -= take
            self._queued -= take
            if take == <size_t>left:
                del stream.out[0]
                stream.out_offset = 0
            else:
                stream.out_offset += take
            if left >= NO_COPY_MIN:
                break  # the rest of a long chunk goes in frames of its own
        if not stream.out and stream.trailers is not None:
            data_flags[0] |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM
            self._submit(stream_id, stream.trailers, NULL, True)
            return written
        if written == 0:
            stream.deferred = True
            return NGHTTP2_ERR_DEFERRED
        return written


# -- nghttp2 callbacks: C entry points that hand over to the session object -------------------------

cdef int _on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    try:
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            self._heading = self._streams[frame.hd.stream_id] = _Stream(frame.hd.stream_id)
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef inline tuple _header_pair(list last, Py_ssize_t index, const uint8_t *name, size_t namelen,
                               const uint8_t *value, size_t valuelen):
    """The ``(name, value)`` pair of a request head's ``index``-th field: the previous head's pair at the same
    place when it is the same bytes (a client's heads repeat: 3 allocations saved per field), else new."""
    cdef tuple pair
    cdef bytes seen
    if last is not None and index < len(last):
        pair = <tuple>last[index]
        seen = <bytes>pair[0]
        if <size_t>PyBytes_GET_SIZE(seen) == namelen and memcmp(PyBytes_AS_STRING(seen), name, namelen) == 0:
            seen = <bytes>pair[1]
            if (<size_t>PyBytes_GET_SIZE(seen) == valuelen
                    and memcmp(PyBytes_AS_STRING(seen), value, valuelen) == 0):
                return pair
    return (PyBytes_FromStringAndSize(<const char *>name, namelen),
            PyBytes_FromStringAndSize(<const char *>value, valuelen))


cdef int _on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                    const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    cdef _Stream stream
    try:
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            stream = self._heading  # (a header block is never interleaved with another stream's)
            if stream is None or stream.stream_id != frame.hd.stream_id:
                stream = self._streams.get(frame.hd.stream_id)
            if stream is not None and stream.headers is not None:
                # issue 27 (HPACK bomb): the advertised header list limit holds however small the frame was;
                # past it nothing more is kept (nghttp2 still decodes, to keep the HPACK state in step)
                stream.header_bytes += <Py_ssize_t>(namelen + valuelen + 32)
                if stream.header_bytes > self._max_header_list:
                    stream.headers = None
                    stream.broken = True  # its DATA is ignored
                    return 0
                stream.headers.append(_header_pair(self._last_headers, len(stream.headers), name, namelen, value,
                                                   valuelen))
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    cdef _Stream stream
    cdef int32_t stream_id = frame.hd.stream_id
    try:
        if frame.hd.type == NGHTTP2_PING:
            if frame.hd.flags & NGHTTP2_FLAG_ACK:
                self._events.append(PingAcknowledged.__new__(PingAcknowledged))
            return 0
        if frame.hd.type != NGHTTP2_HEADERS and frame.hd.type != NGHTTP2_DATA:
            return 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            if stream.headers is None:  # over the header list limit (issue 27): answered here, never a call
                self._refuse_headers(stream)
                return 0
            self._events.append(_request_received(stream_id, stream.headers))
            self._last_headers = stream.headers  # (a client sends the same head again and again: see _header_pair)
            stream.headers = None
            self._heading = None
        if frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
            self._events.append(_request_ended(stream_id, 0 if stream.broken else stream.partial()))
            stream.message = None
            stream.head_len = 0
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t length,
                        void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    try:
        self._data_chunk(stream_id, data, length)
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    cdef _Stream stream
    try:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._queued -= stream.out_bytes  # a reset stream's unsent response is dropped with it
            # a stream that closed normally once its whole answer went out is no news: its call ended when it
            # answered (one event less a request)
            if error_code != NGHTTP2_NO_ERROR or stream.trailers is None or stream.out_bytes:
                self._events.append(_stream_closed(stream_id, error_code))
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef ssize_t _read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                        uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    try:
        return self._read(stream_id, buf, length, data_flags)
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                    nghttp2_data_source *source, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    try:
        self._send_data(frame.hd.stream_id, framehd, length)
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef ssize_t _read_length(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                          int32_t session_remote_window_size, int32_t stream_remote_window_size,
                          uint32_t remote_max_frame_size, void *user_data) noexcept:
    # DATA frames as large as the peer accepts (nghttp2's default is 16 KiB whatever the peer allows):
    # fewer frames and callbacks for a large response.  nghttp2 clamps this to the flow-control windows.
    return remote_max_frame_size

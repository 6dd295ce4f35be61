# cython: language_level=3
"""A server-side HTTP/2 session on libnghttp2, shaped for gRPC.

Rules:
- nghttp2 does all of HTTP/2: framing, HPACK, flow control, SETTINGS/PING
  acknowledgements, stream state and protocol-error handling.  This module only
  moves bytes in and out of it and turns its callbacks into events.
- gRPC's 5-byte message prefix is parsed here, bounds-checked against the
  maximum message size before any buffering, so Python sees whole messages.
- Nothing here touches sockets or the event loop: ``receive`` takes bytes and
  returns events, ``data_to_send`` returns the bytes to write.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy


cdef extern from "nghttp2/nghttp2.h":
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass

    ctypedef struct nghttp2_nv:
        uint8_t *name
        uint8_t *value
        size_t namelen
        size_t valuelen
        uint8_t flags

    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags

    ctypedef enum nghttp2_headers_category:
        NGHTTP2_HCAT_REQUEST
        NGHTTP2_HCAT_RESPONSE
        NGHTTP2_HCAT_PUSH_RESPONSE
        NGHTTP2_HCAT_HEADERS

    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        nghttp2_headers_category cat

    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_headers headers

    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    ctypedef union nghttp2_data_source:
        int fd
        void *ptr

    ctypedef ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
        uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept

    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback

    ctypedef int (*nghttp2_on_frame_recv_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept
    ctypedef int (*nghttp2_on_begin_headers_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept
    ctypedef int (*nghttp2_on_header_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
        const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept
    ctypedef int (*nghttp2_on_data_chunk_recv_callback)(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
        void *user_data) noexcept
    ctypedef int (*nghttp2_on_stream_close_callback)(
        nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) noexcept
    ctypedef int (*nghttp2_send_data_callback)(
        nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
        nghttp2_data_source *source, void *user_data) noexcept
    ctypedef ssize_t (*nghttp2_data_source_read_length_callback)(
        nghttp2_session *session, uint8_t frame_type, int32_t stream_id, int32_t session_remote_window_size,
        int32_t stream_remote_window_size, uint32_t remote_max_frame_size, void *user_data) noexcept

    enum:
        NGHTTP2_FLAG_NONE
        NGHTTP2_FLAG_END_STREAM
        NGHTTP2_FLAG_ACK
        NGHTTP2_DATA
        NGHTTP2_HEADERS
        NGHTTP2_PING
        NGHTTP2_NV_FLAG_NONE
        NGHTTP2_DATA_FLAG_NONE
        NGHTTP2_DATA_FLAG_EOF
        NGHTTP2_DATA_FLAG_NO_END_STREAM
        NGHTTP2_DATA_FLAG_NO_COPY
        NGHTTP2_ERR_DEFERRED
        NGHTTP2_ERR_CALLBACK_FAILURE
        NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
        NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        NGHTTP2_SETTINGS_MAX_FRAME_SIZE
        NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        NGHTTP2_NO_ERROR
        NGHTTP2_PROTOCOL_ERROR
        NGHTTP2_INTERNAL_ERROR
        NGHTTP2_CANCEL
        NGHTTP2_REFUSED_STREAM

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr)
    void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_recv_callback cb)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_headers_callback cb)
    void nghttp2_session_callbacks_set_on_header_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_header_callback cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_data_chunk_recv_callback cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_stream_close_callback cb)
    void nghttp2_session_callbacks_set_send_data_callback(
        nghttp2_session_callbacks *cbs, nghttp2_send_data_callback cb)
    void nghttp2_session_callbacks_set_data_source_read_length_callback(
        nghttp2_session_callbacks *cbs, nghttp2_data_source_read_length_callback cb)

    int nghttp2_option_new(nghttp2_option **option_ptr)
    void nghttp2_option_del(nghttp2_option *option)
    void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val)
    void nghttp2_option_set_no_rfc9113_leading_and_trailing_ws_validation(nghttp2_option *option, int val)

    int nghttp2_session_server_new2(
        nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks, void *user_data,
        const nghttp2_option *option)
    void nghttp2_session_del(nghttp2_session *session)
    ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *data, size_t inlen)
    ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr)
    int nghttp2_session_want_read(nghttp2_session *session)
    int nghttp2_session_want_write(nghttp2_session *session)
    int nghttp2_session_set_local_window_size(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, int32_t window_size)
    int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session)
    int nghttp2_submit_settings(nghttp2_session *session, uint8_t flags, const nghttp2_settings_entry *iv,
                                size_t niv)
    int nghttp2_submit_response(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva, size_t nvlen,
                                const nghttp2_data_provider *data_prd)
    int nghttp2_submit_trailer(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva, size_t nvlen)
    int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id)
    int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id, uint32_t error_code)
    int nghttp2_submit_shutdown_notice(nghttp2_session *session)
    int nghttp2_submit_goaway(nghttp2_session *session, uint8_t flags, int32_t last_stream_id, uint32_t error_code,
                              const uint8_t *opaque_data, size_t opaque_data_len)
    int nghttp2_submit_ping(nghttp2_session *session, uint8_t flags, const uint8_t *opaque_data)
    const char *nghttp2_strerror(int lib_error_code)


# Event kinds: each event is a tuple (kind, stream_id, payload, number).
REQUEST = 1        # payload: list of (name, value) bytes pairs; number: 0
MESSAGE = 2        # payload: the message (bytes, or a bytearray nobody else holds); number: the compressed flag
END_STREAM = 3     # payload: None; number: bytes of an incomplete message left over (0 when clean)
CLOSED = 4         # payload: None; number: the HTTP/2 error code (0: closed normally)
TOO_LARGE = 5      # payload: None; number: the declared message length (over the limit)
PING_ACK = 6       # payload: None; number: 0

NO_ERROR = NGHTTP2_NO_ERROR
PROTOCOL_ERROR = NGHTTP2_PROTOCOL_ERROR
INTERNAL_ERROR = NGHTTP2_INTERNAL_ERROR
CANCEL = NGHTTP2_CANCEL
REFUSED_STREAM = NGHTTP2_REFUSED_STREAM

cdef enum:
    PREFIX = 5  # gRPC's length prefix: 1 byte compressed flag + 4 bytes big-endian length
    FRAME_HEADER = 9  # an HTTP/2 frame header
    # Response chunks at least this long leave as DATA frames written straight from the message
    # (NGHTTP2_DATA_FLAG_NO_COPY); shorter ones are copied into nghttp2's frame buffer.
    NO_COPY_MIN = 16 * 1024
    # A message in pieces gets its whole declared size up front up to this much; above it the buffer
    # grows (doubling) with what arrives, so a length prefix alone reserves little.  Issue 27: 1 MiB, not
    # 64 MiB (1,000 stalled streams reserved 64 GiB of address space); buffers this large are mmap-ed by
    # malloc (fastoip serve pins the threshold at 1 MiB), so growing one remaps pages instead of copying.
    EAGER_RESERVE = 1024 * 1024


class Http2Error(Exception):
    """The peer broke the HTTP/2 protocol (or nghttp2 failed): close the connection."""


cdef class _Stream:
    """What this side keeps about one request stream."""

    cdef int32_t stream_id
    cdef list headers
    cdef bint headers_done
    cdef uint8_t head[PREFIX]     # the length prefix of the next message, while it arrives in pieces
    cdef int head_len
    cdef bytearray message        # the message being received (allocated from its prefix), or None
    cdef Py_ssize_t declared      # its length
    cdef Py_ssize_t filled        # its bytes received so far
    cdef bint broken              # a message over the limit arrived: ignore the rest
    cdef Py_ssize_t received      # DATA bytes received on the stream (its idle check reads them)
    cdef list out                 # bytes chunks waiting to go out as DATA
    cdef Py_ssize_t out_offset    # bytes of out[0] already sent
    cdef Py_ssize_t out_bytes     # bytes in out not sent yet
    cdef object pending           # the slice of out a NO_COPY DATA frame is about to carry
    cdef list trailers            # set once the response is complete
    cdef bint deferred            # the data provider said DEFERRED: resume on new data
    cdef bint responded           # response HEADERS submitted
    cdef Py_ssize_t header_bytes  # issue 27: the request's header list size so far (RFC 9113: name + value + 32)

    def __cinit__(self, int32_t stream_id):
        self.stream_id = stream_id
        self.headers = []
        self.out = []

    cdef Py_ssize_t partial(self):
        """Bytes of an incomplete message received so far (prefix included)."""
        return self.head_len + (PREFIX + self.filled if self.message is not None else 0)


cdef class Http2Session:
    """One HTTP/2 server connection's protocol state (see the module rules)."""

    cdef nghttp2_session *_session
    cdef dict _streams
    cdef list _events
    cdef Py_ssize_t _max_message
    cdef object _failure
    cdef uint8_t *_outbuf
    cdef size_t _outcap
    cdef size_t _outlen           # bytes in _outbuf not yet moved to _outchunks
    cdef list _outchunks          # what data_to_send returns: frame bytes and NO_COPY payload views
    cdef Py_ssize_t _queued       # response bytes waiting for the peer's flow-control window, all streams
    cdef Py_ssize_t _max_header_list  # issue 27: the SETTINGS_MAX_HEADER_LIST_SIZE advertised, enforced
    cdef list _reset_after_send   # issue 27: streams answered here, reset once the answer is serialized

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
        self._max_message = max_message_size
        self._max_header_list = max_header_list_size
        self._reset_after_send = []
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
                    self._events.append((MESSAGE, stream_id, PyBytes_FromStringAndSize(<const char *>data, declared),
                                         compressed))
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
                self._events.append((MESSAGE, stream_id, stream.message, stream.head[0]))
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
        self._reset_after_send.append(stream.stream_id)  # a RST_STREAM queued now would drop the answer
        return 0

    cdef int _too_large(self, _Stream stream, size_t declared) except -1:
        stream.broken = True
        stream.message = None
        stream.head_len = 0
        self._events.append((TOO_LARGE, stream.stream_id, None, declared))
        return 0

    # -- output ------------------------------------------------------------------------------
    def data_to_send(self):
        """Everything nghttp2 has ready to write, as a list of buffers for one ``writelines`` ([] when nothing).

        Frames nghttp2 serializes (control frames, HEADERS, DATA from short chunks, which the data provider
        copies into its frame buffer) are gathered into one bytes object per run; DATA from long response
        chunks leaves as its 9-byte header plus a memoryview of the message (NGHTTP2_DATA_FLAG_NO_COPY), so
        a large response is not copied on its way to the socket.
        """
        cdef const uint8_t *chunk
        cdef ssize_t n
        cdef list chunks
        self._outlen = 0
        self._outchunks = []
        while True:
            n = nghttp2_session_mem_send(self._session, &chunk)
            if n < 0:
                raise Http2Error(nghttp2_strerror(<int>n).decode())
            if n == 0:
                if not self._reset_after_send:
                    break
                for stream_id in self._reset_after_send:  # their answers are serialized: stop their uploads
                    nghttp2_submit_rst_stream(self._session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_NO_ERROR)
                self._reset_after_send = []
                continue
            self._append(chunk, n)
        self._cut()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        chunks, self._outchunks = self._outchunks, []
        return chunks

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
        cdef nghttp2_data_provider provider
        if stream is None or stream.responded:
            return False
        provider.source.ptr = NULL
        provider.read_callback = _read_data
        stream.responded = True
        self._submit(stream_id, headers, &provider, False)
        return True

    def send_headers_only(self, int32_t stream_id, list headers):
        """One HEADERS frame with END_STREAM (gRPC's Trailers-Only, or a plain HTTP error)."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.responded:
            return False
        stream.responded = True
        self._submit(stream_id, headers, NULL, False)
        return True

    def send_message(self, int32_t stream_id, bytes message not None, bint compressed=False):
        """One gRPC message (prefix + bytes) as DATA on a stream whose HEADERS went out."""
        cdef _Stream stream = self._streams.get(stream_id)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(message)
        cdef bytes prefix
        if stream is None or stream.trailers is not None:
            return False
        if size > 0xFFFFFFFF:
            raise ValueError("gRPC message over 4 GiB")
        prefix = bytes((1 if compressed else 0, (size >> 24) & 0xFF, (size >> 16) & 0xFF, (size >> 8) & 0xFF,
                        size & 0xFF))
        stream.out.append(prefix)
        if size:
            stream.out.append(message)
        stream.out_bytes += PREFIX + size
        self._queued += PREFIX + size
        self._resume(stream)
        return True

    def send_trailers(self, int32_t stream_id, list trailers):
        """End the response: trailers go out after the DATA already queued."""
        cdef _Stream stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return False
        stream.trailers = trailers
        self._resume(stream)
        return True

    def reset(self, int32_t stream_id, uint32_t error_code):
        """RST_STREAM (e.g. NO_ERROR after an early answer, CANCEL on a deadline)."""
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
        cdef nghttp2_nv *nva = <nghttp2_nv *>malloc(max(count, 1) * sizeof(nghttp2_nv))
        cdef Py_ssize_t i
        cdef bytes name, value
        cdef int rv
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
        cdef bytes chunk
        cdef Py_ssize_t left
        if stream is None:
            return NGHTTP2_ERR_CALLBACK_FAILURE
        while written < length and stream.out:
            chunk = stream.out[0]
            left = PyBytes_GET_SIZE(chunk) - stream.out_offset
            if written == 0 and left >= NO_COPY_MIN:
                take = min(<size_t>left, length)
                stream.pending = memoryview(chunk)[stream.out_offset:stream.out_offset + <Py_ssize_t>take]
                data_flags[0] |= NGHTTP2_DATA_FLAG_NO_COPY
            else:
                # a long chunk behind a short one (a message behind its prefix) lends this frame only a
                # little, so the frames after it start on it and go without a copy
                take = min(<size_t>left, length - written, <size_t>NO_COPY_MIN)
                memcpy(buf + written, PyBytes_AS_STRING(chunk) + stream.out_offset, take)
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
            self._streams[frame.hd.stream_id] = _Stream(frame.hd.stream_id)
        return 0
    except BaseException as exc:
        self._failure = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                    const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept:
    cdef Http2Session self = <Http2Session>user_data
    cdef _Stream stream
    try:
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            stream = self._streams.get(frame.hd.stream_id)
            if stream is not None and stream.headers is not None:
                # issue 27 (HPACK bomb): the advertised header list limit holds however small the frame was;
                # past it nothing more is kept (nghttp2 still decodes, to keep the HPACK state in step)
                stream.header_bytes += <Py_ssize_t>(namelen + valuelen + 32)
                if stream.header_bytes > self._max_header_list:
                    stream.headers = None
                    stream.broken = True  # its DATA is ignored
                    return 0
                stream.headers.append((PyBytes_FromStringAndSize(<const char *>name, namelen),
                                       PyBytes_FromStringAndSize(<const char *>value, valuelen)))
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
                self._events.append((PING_ACK, 0, None, 0))
            return 0
        if frame.hd.type != NGHTTP2_HEADERS and frame.hd.type != NGHTTP2_DATA:
            return 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            stream.headers_done = True
            if stream.headers is None:  # over the header list limit (issue 27): answered here, never a call
                self._refuse_headers(stream)
                return 0
            self._events.append((REQUEST, stream_id, stream.headers, 0))
            stream.headers = None
        if frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
            self._events.append((END_STREAM, stream_id, None, 0 if stream.broken else stream.partial()))
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
            self._events.append((CLOSED, stream_id, None, error_code))
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

# The state of the HTTP/2 session binding (_http2.pyx), declared as asyncpg's pgproto declares its buffers:
# what one stream and one connection hold, in one place, so a new field (a per-stream limit, a counter) is
# added here and used in the .pyx.

from libc.stdint cimport int32_t, uint8_t, uint32_t

from ._nghttp2 cimport nghttp2_data_provider, nghttp2_session


cdef extern from "Python.h":
    # the buffer of a memoryview response part (send_message_parts), read without a new buffer request
    Py_buffer* PyMemoryView_GET_BUFFER(object mview)


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
    # Header lists up to this many fields are submitted from the stack (a gRPC answer has 2-4)
    SHORT_HEADERS = 8


cdef class _Stream:
    """What the binding keeps about one request stream: its framing on the way in and out."""

    cdef int32_t stream_id
    # -- request side
    cdef list headers             # the request's header fields while its HEADERS arrive, then None
    cdef Py_ssize_t header_bytes  # issue 27: the request's header list size so far (RFC 9113: name + value + 32)
    cdef uint8_t head[PREFIX]     # the length prefix of the next message, while it arrives in pieces
    cdef int head_len
    cdef bytearray message        # the message being received (allocated from its prefix), or None
    cdef Py_ssize_t declared      # its length
    cdef Py_ssize_t filled        # its bytes received so far
    cdef bint broken              # a message over the limit arrived: ignore the rest
    cdef Py_ssize_t received      # DATA bytes received on the stream (its idle check reads them)
    # -- response side
    cdef list out                 # bytes chunks waiting to go out as DATA
    cdef Py_ssize_t out_offset    # bytes of out[0] already sent
    cdef Py_ssize_t out_bytes     # bytes in out not sent yet
    cdef object pending           # the slice of out a NO_COPY DATA frame is about to carry
    cdef list trailers            # set once the response is complete
    cdef bint deferred            # the data provider said DEFERRED: resume on new data
    cdef bint responded           # response HEADERS submitted
    cdef bint reset_when_sent     # RST_STREAM(NO_ERROR) once what is queued now went out (an early answer)

    cdef Py_ssize_t partial(self)


cdef class Http2Session:
    """One HTTP/2 server connection's protocol state."""

    cdef nghttp2_session *_session
    cdef dict _streams            # stream id -> _Stream, while nghttp2 has the stream open
    cdef list _last_headers       # the last request head's (name, value) pairs: a repeated pair is reused
    cdef _Stream _heading         # the stream whose request HEADERS are being received (its fields arrive one by one)
    cdef list _events             # what the current receive() produced, in order
    cdef list _resets             # streams to reset with NO_ERROR after the next send (see reset_when_sent)
    cdef Py_ssize_t _max_message
    cdef object _failure          # an exception raised inside a callback, re-raised by receive / data_to_send
    cdef uint8_t *_outbuf
    cdef size_t _outcap
    cdef size_t _outlen           # bytes in _outbuf not yet moved to _outchunks
    cdef list _outchunks          # what data_to_send returns: frame bytes and NO_COPY payload views
    cdef Py_ssize_t _queued       # response bytes waiting for the peer's flow-control window, all streams
    cdef Py_ssize_t _max_header_list  # issue 27: the SETTINGS_MAX_HEADER_LIST_SIZE advertised, enforced

    cdef int _data_chunk(self, int32_t stream_id, const uint8_t *data, size_t length) except -1
    cdef int _too_large(self, _Stream stream, size_t declared) except -1
    cdef int _refuse_headers(self, _Stream stream) except -1
    cdef int _send_all(self) except -1
    cdef int _append(self, const uint8_t *data, size_t n) except -1
    cdef int _cut(self) except -1
    cdef int _send_data(self, int32_t stream_id, const uint8_t *framehd, size_t length) except -1
    cdef int _reset_after_send(self, _Stream stream) except -1
    cdef int _respond(self, _Stream stream, list headers) except -1
    cdef int _queue_message(self, _Stream stream, bytes message, bint compressed) except -1
    cdef int _queue_parts(self, _Stream stream, list parts) except -1
    cdef void _resume(self, _Stream stream)
    cdef int _submit(self, int32_t stream_id, list headers, const nghttp2_data_provider *provider,
                     bint trailer) except -1
    cdef ssize_t _read(self, int32_t stream_id, uint8_t *buf, size_t length, uint32_t *data_flags) except? -999

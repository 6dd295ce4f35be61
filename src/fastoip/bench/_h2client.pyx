"""A gRPC load core in C: nghttp2 in client mode over non-blocking sockets, no GIL in the loop.

``Engine(...).run(concurrency)`` (called on a thread of its own) keeps ``concurrency`` unary calls in flight
over ``connections`` HTTP/2 connections, each call sending one pre-encoded ModelInferRequest (gRPC-framed
here once).  Each completion is written into preallocated C arrays (end time, latency; or end time, error
code) under a mutex; ``drain()`` hands them to Python as numpy arrays.  A response is checked by its
message length against the known-good lengths; a length never seen is decoded by the Python check once
(the only place the loop takes the GIL), as the grpcio clients do.  Times are CLOCK_MONOTONIC ns, the
clock of ``time.perf_counter_ns``.
"""

from libc.errno cimport EAGAIN, EINPROGRESS, EINTR, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cimport numpy as cnp
import numpy as np

from fastoip.server.grpc._nghttp2 cimport (
    NGHTTP2_ERR_DEFERRED,
    NGHTTP2_DATA_FLAG_EOF, NGHTTP2_FLAG_NONE, NGHTTP2_HEADERS, NGHTTP2_NV_FLAG_NONE,
    NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, nghttp2_data_provider, nghttp2_data_source, nghttp2_frame, nghttp2_nv,
    nghttp2_session, nghttp2_session_callbacks, nghttp2_session_callbacks_del, nghttp2_session_callbacks_new,
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback, nghttp2_session_callbacks_set_on_header_callback,
    nghttp2_session_callbacks_set_on_stream_close_callback, nghttp2_session_del,
    nghttp2_session_set_local_window_size, nghttp2_settings_entry, nghttp2_submit_settings,
)

cnp.import_array()


# What the server binding's declarations lack (client mode), and the I/O calls made without the GIL.
cdef extern from "nghttp2/nghttp2.h":
    ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *data, size_t inlen) nogil
    ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr) nogil
    int nghttp2_session_client_new(
        nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks, void *user_data) nogil
    int32_t nghttp2_submit_request(
        nghttp2_session *session, const void *pri_spec, const nghttp2_nv *nva, size_t nvlen,
        const nghttp2_data_provider *data_prd, void *stream_user_data) nogil
    void *nghttp2_session_get_stream_user_data(nghttp2_session *session, int32_t stream_id) nogil
    int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id) nogil
    int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                                  uint32_t error_code) nogil
    int nghttp2_session_get_remote_settings(nghttp2_session *session, int id) nogil
    enum:
        NGHTTP2_SETTINGS_ENABLE_PUSH


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *mutex, void *attr)
    int pthread_mutex_lock(pthread_mutex_t *mutex)
    int pthread_mutex_unlock(pthread_mutex_t *mutex)
    int pthread_mutex_destroy(pthread_mutex_t *mutex)


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN
        POLLOUT
        POLLERR
        POLLHUP


cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    enum:
        MSG_NOSIGNAL


cdef extern from "<unistd.h>" nogil:
    int close(int fd)


# Error codes that are not gRPC statuses (gRPC's are 0-16).
cdef enum:
    ERR_BAD_RESPONSE = 100
    ERR_NO_STATUS = 101
    ERR_RESET = 102
    ERR_CONNECTION = 103
    ERR_HTTP_STATUS = 104
    ERR_STREAM_ERROR = 105
    ERR_STREAM_EOF = 106
    OUT_CAP = 262144
    IN_CAP = 262144

ERROR_NAMES = {
    ERR_BAD_RESPONSE: "BAD_RESPONSE",
    ERR_NO_STATUS: "UNKNOWN",
    ERR_RESET: "INTERNAL",
    ERR_CONNECTION: "UNAVAILABLE",
    ERR_HTTP_STATUS: "UNAVAILABLE",
    ERR_STREAM_ERROR: "STREAM_ERROR",
    ERR_STREAM_EOF: "STREAM_EOF",
}


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef struct Body:
    uint8_t *data
    size_t size


cdef struct Call:
    int64_t t0
    int status          # grpc-status, -1 until seen
    int http_status
    size_t received     # DATA bytes so far (gRPC framing included)
    int64_t message_len # from the 5-byte prefix, -1 until known
    uint8_t prefix[5]
    int checked         # 1: the length is a known-good one
    uint8_t *keep       # the whole body, kept only for a length never seen
    size_t keep_cap
    size_t body         # index into the request bodies
    size_t sent_off     # bytes of the body handed to nghttp2
    int conn
    int32_t stream_id   # 0: the slot is free
    int timed_out
    int pending         # streaming: a message to send (or being sent)
    int awaiting        # streaming: a response outstanding
    uint8_t first       # streaming: the response message's first byte


cdef struct Pairs:
    # two parallel columns: a call's end time and its latency (ok) or its error code (err)
    int64_t *end
    int64_t *value
    size_t n
    size_t cap


cdef struct Results:
    pthread_mutex_t lock
    Pairs ok
    Pairs err
    int64_t sent


cdef struct State:
    Conn *conns
    int nconns
    Body *bodies
    size_t nbodies
    size_t next_body
    Call *calls
    int ncalls
    int *free_calls
    int nfree
    nghttp2_nv *nva
    size_t nvlen
    int64_t *lengths
    size_t nlengths
    size_t lengths_cap
    void *check
    Results res
    int running
    int stopping
    int64_t timeout_ns
    int streaming


cdef struct Conn:
    int fd
    nghttp2_session *session
    uint8_t *out
    size_t out_len
    size_t out_off
    int dead
    int inflight
    int want        # calls to start on this connection
    State *st


cdef int64_t *grow64(int64_t *array, size_t *cap) noexcept nogil:
    cdef size_t new_cap = cap[0] * 2 if cap[0] else 65536
    cdef int64_t *p = <int64_t *>realloc(array, new_cap * sizeof(int64_t))
    if p != NULL:
        cap[0] = new_cap
    return p



cdef int known(State *st, int64_t length) noexcept nogil:
    cdef size_t i
    for i in range(st.nlengths):
        if st.lengths[i] == length:
            return 1
    return 0


cdef void add_length(State *st, int64_t length) noexcept nogil:
    if known(st, length) or st.nlengths == st.lengths_cap:
        return
    st.lengths[st.nlengths] = length
    st.nlengths += 1


# ---------------------------------------------------------------------- results
cdef void record(State *st, Pairs *pairs, int64_t end, int64_t value) noexcept nogil:
    """Append (end, value) under the results lock; a sample that finds no memory is dropped."""
    cdef size_t cap
    cdef int64_t *ends
    cdef int64_t *values
    pthread_mutex_lock(&st.res.lock)
    if pairs.n == pairs.cap:
        cap = pairs.cap
        ends = grow64(pairs.end, &cap)
        if ends != NULL:
            pairs.end = ends
            cap = pairs.cap
            values = grow64(pairs.value, &cap)
            if values != NULL:
                pairs.value = values
                pairs.cap = cap
    if pairs.n < pairs.cap:
        pairs.end[pairs.n] = end
        pairs.value[pairs.n] = value
        pairs.n += 1
    pthread_mutex_unlock(&st.res.lock)


cdef inline void record_ok(State *st, int64_t end, int64_t lat) noexcept nogil:
    record(st, &st.res.ok, end, lat)


cdef inline void record_error(State *st, int64_t end, int64_t code) noexcept nogil:
    record(st, &st.res.err, end, code)


cdef tuple take(Pairs *pairs):
    """The recorded columns as numpy arrays, and the record emptied (the caller holds the results lock)."""
    cdef cnp.ndarray ends = np.empty(pairs.n, np.int64)
    cdef cnp.ndarray values = np.empty(pairs.n, np.int64)
    if pairs.n:
        memcpy(cnp.PyArray_DATA(ends), pairs.end, pairs.n * sizeof(int64_t))
        memcpy(cnp.PyArray_DATA(values), pairs.value, pairs.n * sizeof(int64_t))
    pairs.n = 0
    return ends, values


# ---------------------------------------------------------------------- calls
cdef int start_call(State *st, Conn *conn) noexcept nogil:
    cdef int slot
    cdef Call *call
    cdef nghttp2_data_provider provider
    if st.nfree == 0:
        return -1
    st.nfree -= 1
    slot = st.free_calls[st.nfree]
    call = &st.calls[slot]
    call.status = -1
    call.http_status = 0
    call.received = 0
    call.message_len = -1
    call.checked = 0
    call.body = st.next_body
    call.sent_off = 0
    call.conn = <int>(conn - st.conns)
    st.next_body += 1
    if st.next_body == st.nbodies:
        st.next_body = 0
    provider.source.ptr = call
    provider.read_callback = read_body
    call.timed_out = 0
    call.pending = 1
    call.awaiting = 1
    call.t0 = now_ns()
    call.stream_id = nghttp2_submit_request(conn.session, NULL, st.nva, st.nvlen, &provider, call)
    pthread_mutex_lock(&st.res.lock)
    st.res.sent += 1
    pthread_mutex_unlock(&st.res.lock)
    if call.stream_id < 0:  # the session takes no more streams (GOAWAY received)
        call.stream_id = 0
        st.free_calls[st.nfree] = slot
        st.nfree += 1
        record_error(st, now_ns(), ERR_CONNECTION)
        return -1
    conn.inflight += 1
    return 0


cdef int slow_check(State *st, Call *call) noexcept with gil:
    """A response of a length never seen: the Python check decodes it (and learns its length when good)."""
    if call.keep == NULL or call.message_len < 0 or call.received != <size_t>call.message_len + 5:
        return 0
    try:
        data = (<char *>call.keep)[:call.message_len]
        ok = bool((<object>st.check).slow_ok(data))
    except Exception:
        return 0
    if ok:
        add_length(st, call.message_len)
    return 1 if ok else 0


cdef void finish_call(State *st, Conn *conn, Call *call, uint32_t error_code) noexcept nogil:
    cdef int64_t end = now_ns()
    if st.streaming and not call.awaiting:  # a stream that ended after its last answer
        call.stream_id = 0
        free(call.keep)
        call.keep = NULL
        st.free_calls[st.nfree] = <int>(call - st.calls)
        st.nfree += 1
        if st.running and not st.stopping:
            conn.want += 1
        return
    conn.inflight -= 1
    call.stream_id = 0
    if call.timed_out:
        record_error(st, end, 4)  # DEADLINE_EXCEEDED, as grpcio reports a call past its timeout
    elif call.http_status != 200 and call.status < 0:
        record_error(st, end, ERR_HTTP_STATUS if call.http_status else ERR_RESET)
    elif call.status > 0:
        record_error(st, end, call.status)
    elif call.status < 0:
        record_error(st, end, ERR_RESET if error_code else ERR_NO_STATUS)
    elif st.streaming:  # the server ended the stream, OK, with an answer outstanding
        record_error(st, end, ERR_STREAM_EOF)
    elif call.checked and call.received == <size_t>call.message_len + 5:
        record_ok(st, end, end - call.t0)
    elif slow_check(st, call):
        record_ok(st, end, end - call.t0)
    else:
        record_error(st, end, ERR_BAD_RESPONSE)
    if call.keep != NULL:
        free(call.keep)
        call.keep = NULL
        call.keep_cap = 0
    st.free_calls[st.nfree] = <int>(call - st.calls)
    st.nfree += 1
    if st.running and not st.stopping:
        conn.want += 1


cdef void expire(State *st, int64_t now) noexcept nogil:
    """Cancel (RST_STREAM CANCEL) the calls older than the request timeout; they count DEADLINE_EXCEEDED."""
    cdef int i
    cdef Call *call
    for i in range(st.ncalls):
        call = &st.calls[i]
        if call.stream_id > 0 and call.awaiting and not call.timed_out and now - call.t0 > st.timeout_ns:
            call.timed_out = 1
            nghttp2_submit_rst_stream(st.conns[call.conn].session, NGHTTP2_FLAG_NONE, call.stream_id, 8)


# ---------------------------------------------------------------------- connections
cdef void kill(State *st, Conn *conn) noexcept nogil:
    """A connection failed: its calls in flight count as UNAVAILABLE."""
    cdef int i
    cdef int64_t end = now_ns()
    if conn.dead:
        return
    conn.dead = 1
    for i in range(st.ncalls):
        if st.calls[i].stream_id > 0 and st.calls[i].awaiting and &st.conns[st.calls[i].conn] == conn:
            st.calls[i].stream_id = 0
            record_error(st, end, ERR_CONNECTION)
    conn.inflight = 0


cdef void append(Conn *conn, const uint8_t *data, size_t n) noexcept nogil:
    cdef size_t live = conn.out_len - conn.out_off
    cdef uint8_t *bigger
    if conn.out_off:
        memmove(conn.out, conn.out + conn.out_off, live)
        conn.out_off = 0
        conn.out_len = live
    if conn.out_len + n > OUT_CAP:
        bigger = <uint8_t *>malloc(conn.out_len + n)
        memcpy(bigger, conn.out, conn.out_len)
        memcpy(bigger + conn.out_len, data, n)
        free(conn.out)
        conn.out = bigger
        conn.out_len += n
        return
    memcpy(conn.out + conn.out_len, data, n)
    conn.out_len += n


cdef void flush(State *st, Conn *conn) noexcept nogil:
    cdef ssize_t n
    while conn.out_off < conn.out_len:
        n = send(conn.fd, conn.out + conn.out_off, conn.out_len - conn.out_off, MSG_NOSIGNAL)
        if n < 0:
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                return
            kill(st, conn)
            return
        conn.out_off += n
    if conn.out_len > OUT_CAP:  # a grown buffer goes back to the usual size
        free(conn.out)
        conn.out = <uint8_t *>malloc(OUT_CAP)
    conn.out_off = 0
    conn.out_len = 0


cdef void pump(State *st, Conn *conn) noexcept nogil:
    """Start the calls this connection owes, then move nghttp2's output to the socket."""
    cdef const uint8_t *data
    cdef ssize_t n
    if conn.dead:
        return
    while conn.want > 0 and not st.stopping:
        conn.want -= 1
        start_call(st, conn)
    conn.want = 0
    if conn.out_off < conn.out_len:
        flush(st, conn)
        if conn.dead or conn.out_off < conn.out_len:
            return
    while True:
        n = nghttp2_session_mem_send(conn.session, &data)
        if n < 0:
            kill(st, conn)
            return
        if n == 0:
            break
        if conn.out_len + <size_t>n > OUT_CAP:
            flush(st, conn)
            if conn.dead:
                return
            if conn.out_off < conn.out_len:
                append(conn, data, n)  # the socket is full: keep this chunk, send on POLLOUT
                return
        append(conn, data, n)
    flush(st, conn)


cdef void read_conn(State *st, Conn *conn, uint8_t *buf) noexcept nogil:
    cdef ssize_t n, used
    while not conn.dead:
        n = recv(conn.fd, buf, IN_CAP, 0)
        if n < 0:
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                return
            kill(st, conn)
            return
        if n == 0:
            kill(st, conn)
            return
        used = nghttp2_session_mem_recv(conn.session, buf, n)
        if used < 0:
            kill(st, conn)
            return
        if n < IN_CAP:
            return


# ---------------------------------------------------------------------- nghttp2 callbacks
cdef ssize_t read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                       uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept nogil:
    cdef Call *call = <Call *>source.ptr
    cdef Conn *conn = <Conn *>user_data
    cdef Body *body = &conn.st.bodies[call.body]
    cdef size_t left
    if not call.pending:  # streaming, between messages: wait for the answer, or end the stream when stopping
        if conn.st.stopping:
            data_flags[0] |= NGHTTP2_DATA_FLAG_EOF
            return 0
        return NGHTTP2_ERR_DEFERRED
    left = body.size - call.sent_off
    if length > left:
        length = left
    memcpy(buf, body.data + call.sent_off, length)
    call.sent_off += length
    if call.sent_off == body.size:
        if conn.st.streaming:
            call.pending = 0
        else:
            data_flags[0] |= NGHTTP2_DATA_FLAG_EOF
    return length


cdef int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                   const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept nogil:
    cdef Call *call
    cdef int v = 0
    cdef size_t i
    if frame.hd.type != NGHTTP2_HEADERS:
        return 0
    call = <Call *>nghttp2_session_get_stream_user_data(session, frame.hd.stream_id)
    if call == NULL:
        return 0
    for i in range(valuelen):
        if value[i] < 48 or value[i] > 57:
            v = -1
            break
        v = v * 10 + (value[i] - 48)
    if namelen == 7 and memcmp(name, b":status", 7) == 0:
        call.http_status = v
    elif namelen == 11 and memcmp(name, b"grpc-status", 11) == 0:
        call.status = 2 if v < 0 else v  # unparseable: UNKNOWN
    return 0


cdef int on_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t length,
                 void *user_data) noexcept nogil:
    cdef Conn *conn = <Conn *>user_data
    cdef State *st = conn.st
    cdef Call *call = <Call *>nghttp2_session_get_stream_user_data(session, stream_id)
    cdef size_t i, need
    cdef uint8_t *grown
    if call == NULL:
        return 0
    if st.streaming:
        stream_data(st, conn, call, stream_id, data, length)
        return 0
    i = 0
    while call.received < 5 and i < length:  # the gRPC message prefix: flag + 4-byte length
        call.prefix[call.received] = data[i]
        call.received += 1
        i += 1
        if call.received == 5:
            call.message_len = (<int64_t>call.prefix[1] << 24) | (<int64_t>call.prefix[2] << 16) | (
                <int64_t>call.prefix[3] << 8) | <int64_t>call.prefix[4]
            call.checked = call.prefix[0] == 0 and known(st, call.message_len)
            if not call.checked:
                call.keep_cap = <size_t>call.message_len
                call.keep = <uint8_t *>malloc(call.keep_cap if call.keep_cap else 1)
    if i < length:
        if call.keep != NULL:
            need = call.received - 5 + (length - i)
            if need <= call.keep_cap:
                memcpy(call.keep + call.received - 5, data + i, length - i)
        call.received += length - i
    return 0


cdef void stream_data(State *st, Conn *conn, Call *call, int32_t stream_id, const uint8_t *data,
                      size_t length) noexcept nogil:
    """ModelStreamInfer: answers arrive as gRPC messages on the call's stream, one per request sent."""
    cdef size_t i = 0, take
    cdef int64_t end
    cdef int ok
    while i < length:
        if call.received < 5:
            call.prefix[call.received] = data[i]
            call.received += 1
            i += 1
            if call.received == 5:
                call.message_len = (<int64_t>call.prefix[1] << 24) | (<int64_t>call.prefix[2] << 16) | (
                    <int64_t>call.prefix[3] << 8) | <int64_t>call.prefix[4]
                call.checked = call.prefix[0] == 0 and known(st, call.message_len)
                if not call.checked:
                    call.keep_cap = <size_t>call.message_len
                    call.keep = <uint8_t *>malloc(call.keep_cap if call.keep_cap else 1)
            else:
                continue
        else:
            take = <size_t>call.message_len + 5 - call.received
            if take > length - i:
                take = length - i
            if call.received == 5 and take:
                call.first = data[i]
            if call.keep != NULL:
                memcpy(call.keep + call.received - 5, data + i, take)
            call.received += take
            i += take
        if call.received < <size_t>call.message_len + 5 or call.message_len < 0:
            continue
        # one whole answer
        end = now_ns()
        if not call.awaiting:
            record_error(st, end, ERR_BAD_RESPONSE)  # an answer nobody asked for
        else:
            conn.inflight -= 1
            call.awaiting = 0
            if call.message_len > 0 and call.first == 0x0a:  # field 1, error_message, set: an in-band error
                record_error(st, end, ERR_STREAM_ERROR)
            elif call.checked:
                record_ok(st, end, end - call.t0)
            else:
                ok = slow_check(st, call)
                if ok:
                    record_ok(st, end, end - call.t0)
                else:
                    record_error(st, end, ERR_BAD_RESPONSE)
        free(call.keep)
        call.keep = NULL
        call.received = 0
        call.message_len = -1
        if st.running and not st.stopping:  # the next request on the same stream
            call.body = st.next_body
            st.next_body += 1
            if st.next_body == st.nbodies:
                st.next_body = 0
            call.sent_off = 0
            call.pending = 1
            call.awaiting = 1
            call.t0 = now_ns()
            conn.inflight += 1
            pthread_mutex_lock(&st.res.lock)
            st.res.sent += 1
            pthread_mutex_unlock(&st.res.lock)
        nghttp2_session_resume_data(conn.session, stream_id)  # the next message, or the end of the stream


cdef int on_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                  void *user_data) noexcept nogil:
    cdef Conn *conn = <Conn *>user_data
    cdef Call *call = <Call *>nghttp2_session_get_stream_user_data(session, stream_id)
    if call != NULL:
        finish_call(conn.st, conn, call, error_code)
    return 0


# ---------------------------------------------------------------------- the Python face
cdef class Engine:
    """One load generator's connections and calls (see the module docstring)."""

    cdef State st
    cdef list _keep  # the bytes the header pointers point into
    cdef object _check
    cdef nghttp2_session_callbacks *callbacks

    def __cinit__(self):
        memset(&self.st, 0, sizeof(State))
        pthread_mutex_init(&self.st.res.lock, NULL)
        self.callbacks = NULL

    def __init__(self, list sockets, list requests, object check, str authority, str path, object metadata=(),
                 double timeout_s=60.0, bint streaming=False):
        """``sockets``: connected non-blocking socket file descriptors, one per HTTP/2 connection, owned (and
        closed) by the engine from here on.  ``requests``: serialized ModelInferRequest messages."""
        cdef Py_ssize_t i
        cdef bytes framed
        cdef nghttp2_settings_entry settings[2]
        if not sockets or not requests:
            raise ValueError("the engine needs at least one connection and one request")
        self._check = check
        self.st.check = <void *>check
        self.st.timeout_ns = <int64_t>(timeout_s * 1e9)
        self.st.streaming = streaming
        self.st.nconns = len(sockets)
        self.st.conns = <Conn *>malloc(self.st.nconns * sizeof(Conn))
        memset(self.st.conns, 0, self.st.nconns * sizeof(Conn))
        for i in range(self.st.nconns):
            self.st.conns[i].fd = sockets[i]
            self.st.conns[i].out = <uint8_t *>malloc(OUT_CAP)
            self.st.conns[i].st = &self.st
        self.st.nbodies = len(requests)
        self.st.bodies = <Body *>malloc(self.st.nbodies * sizeof(Body))
        memset(self.st.bodies, 0, self.st.nbodies * sizeof(Body))
        for i in range(<Py_ssize_t>self.st.nbodies):
            message = bytes(requests[i])
            framed = b"\x00" + len(message).to_bytes(4, "big") + message
            self.st.bodies[i].size = len(framed)
            self.st.bodies[i].data = <uint8_t *>malloc(len(framed))
            memcpy(self.st.bodies[i].data, <const char *>framed, len(framed))
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                   (b":authority", authority.encode()), (b"content-type", b"application/grpc"),
                   (b"te", b"trailers"), (b"user-agent", b"fastoip-bench-native")]
        headers += [(str(k).encode(), str(v).encode()) for k, v in metadata]
        self._keep = []
        self.st.nvlen = len(headers)
        self.st.nva = <nghttp2_nv *>malloc(self.st.nvlen * sizeof(nghttp2_nv))
        for i, (name, value) in enumerate(headers):
            self._keep.append(name)
            self._keep.append(value)
            self.st.nva[i].name = <uint8_t *><const char *>name
            self.st.nva[i].value = <uint8_t *><const char *>value
            self.st.nva[i].namelen = len(name)
            self.st.nva[i].valuelen = len(value)
            self.st.nva[i].flags = NGHTTP2_NV_FLAG_NONE
        self.st.lengths_cap = max(64, len(check.lengths))
        self.st.lengths = <int64_t *>malloc(self.st.lengths_cap * sizeof(int64_t))
        for length in check.lengths:
            add_length(&self.st, length)
        nghttp2_session_callbacks_new(&self.callbacks)
        nghttp2_session_callbacks_set_on_header_callback(self.callbacks, on_header)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(self.callbacks, on_data)
        nghttp2_session_callbacks_set_on_stream_close_callback(self.callbacks, on_close)
        settings[0].settings_id = NGHTTP2_SETTINGS_ENABLE_PUSH
        settings[0].value = 0
        settings[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        settings[1].value = (1 << 30) - 1
        for i in range(self.st.nconns):
            if nghttp2_session_client_new(&self.st.conns[i].session, self.callbacks, &self.st.conns[i]) != 0:
                raise MemoryError("nghttp2_session_client_new")
            nghttp2_submit_settings(self.st.conns[i].session, NGHTTP2_FLAG_NONE, settings, 2)
            nghttp2_session_set_local_window_size(self.st.conns[i].session, NGHTTP2_FLAG_NONE, 0, (1 << 30) - 1)

    def __dealloc__(self):
        cdef int i
        if self.st.conns != NULL:
            for i in range(self.st.nconns):
                if self.st.conns[i].session != NULL:
                    nghttp2_session_del(self.st.conns[i].session)
                if self.st.conns[i].fd > 0:
                    close(self.st.conns[i].fd)
                free(self.st.conns[i].out)
            free(self.st.conns)
        if self.st.bodies != NULL:
            for i in range(<int>self.st.nbodies):
                free(self.st.bodies[i].data)
            free(self.st.bodies)
        if self.st.calls != NULL:
            for i in range(self.st.ncalls):
                free(self.st.calls[i].keep)
            free(self.st.calls)
        free(self.st.free_calls)
        free(self.st.nva)
        free(self.st.lengths)
        free(self.st.res.ok.end)
        free(self.st.res.ok.value)
        free(self.st.res.err.end)
        free(self.st.res.err.value)
        if self.callbacks != NULL:
            nghttp2_session_callbacks_del(self.callbacks)
        pthread_mutex_destroy(&self.st.res.lock)

    def drain(self):
        """(ok_end, ok_latency, error_end, error_code, sent): what was recorded since the last drain (sent:
        the running total of calls started)."""
        cdef Results *res = &self.st.res
        pthread_mutex_lock(&res.lock)
        try:
            ok_end, ok_lat = take(&res.ok)
            err_end, err_code = take(&res.err)
            sent = res.sent
        finally:
            pthread_mutex_unlock(&res.lock)
        return ok_end, ok_lat, err_end, err_code, sent

    def stop(self):
        """Start no more calls; ``run`` returns once those in flight are done (or its drain time is up)."""
        self.st.stopping = 1

    def run(self, int concurrency, double drain_s=10.0):
        """Keep ``concurrency`` calls in flight until ``stop()`` (the GIL released); returns the number of
        connections that failed."""
        cdef State *st = &self.st
        cdef int i, k, rc, failed = 0
        cdef int64_t deadline = 0, scanned = 0, now
        cdef pollfd *fds
        cdef uint8_t *buf
        if st.calls != NULL:
            raise RuntimeError("an engine runs once")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        fds = <pollfd *>malloc(st.nconns * sizeof(pollfd))
        buf = <uint8_t *>malloc(IN_CAP)
        st.ncalls = concurrency
        st.calls = <Call *>malloc(concurrency * sizeof(Call))
        memset(st.calls, 0, concurrency * sizeof(Call))
        st.free_calls = <int *>malloc(concurrency * sizeof(int))
        for i in range(concurrency):
            st.free_calls[i] = concurrency - 1 - i
        st.nfree = concurrency
        for i in range(concurrency):
            st.conns[i % st.nconns].want += 1
        st.running = 1
        with nogil:
            while True:
                if st.stopping:
                    if deadline == 0:
                        deadline = now_ns() + <int64_t>(drain_s * 1e9)
                        if st.streaming:  # end the streams that wait between messages
                            for i in range(st.ncalls):
                                if st.calls[i].stream_id > 0 and not st.calls[i].awaiting:
                                    nghttp2_session_resume_data(st.conns[st.calls[i].conn].session,
                                                                st.calls[i].stream_id)
                    k = 0
                    for i in range(st.nconns):
                        if not st.conns[i].dead:
                            k += st.conns[i].inflight
                    if k == 0 or now_ns() > deadline:
                        break
                k = 0
                for i in range(st.nconns):
                    pump(st, &st.conns[i])
                    fds[i].fd = -1 if st.conns[i].dead else st.conns[i].fd
                    fds[i].events = POLLIN
                    if st.conns[i].out_len > st.conns[i].out_off:
                        fds[i].events = POLLIN | POLLOUT
                    fds[i].revents = 0
                    if not st.conns[i].dead:
                        k += 1
                if k == 0:
                    break
                rc = poll(fds, st.nconns, 50)
                now = now_ns()
                if now - scanned > 10000000:  # timeouts: a scan every 10 ms at most
                    scanned = now
                    expire(st, now)
                if rc <= 0:
                    continue
                for i in range(st.nconns):
                    if fds[i].revents & (POLLIN | POLLERR | POLLHUP):
                        read_conn(st, &st.conns[i], buf)
                    if fds[i].revents & POLLOUT and not st.conns[i].dead:
                        flush(st, &st.conns[i])
        st.running = 0
        free(fds)
        free(buf)
        for i in range(st.nconns):
            if st.conns[i].dead:
                failed += 1
        return failed

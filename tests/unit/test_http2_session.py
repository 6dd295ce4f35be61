"""The HTTP/2 session binding (``_http2.Http2Session``) in memory: no socket, the ``h2`` library as the client.

The binding is sans-I/O: bytes in, typed events out; answers in, bytes out.  These tests feed it what a real
client sends, cut at every byte boundary (nghttp2 and the gRPC message framing above it must not care where a
read ends), and read its answers back with ``h2``.  ``make debug`` runs them on the bounds-checked build.
"""

from __future__ import annotations

import struct

import pytest

_http2 = pytest.importorskip("fastoip.server.grpc._http2", reason="the native gRPC frontend was not built")

from h2.config import H2Configuration  # noqa: E402
from h2.connection import H2Connection  # noqa: E402
from h2.errors import ErrorCodes  # noqa: E402
from h2.events import (  # noqa: E402
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    PingReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.settings import SettingCodes  # noqa: E402

PATH = b"/inference.GRPCInferenceService/ModelInfer"
REQUEST_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", PATH),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def grpc_message(payload: bytes, *, compressed: bool = False, declared: int | None = None) -> bytes:
    return struct.pack(">BI", int(compressed), len(payload) if declared is None else declared) + payload


def client(**settings: int) -> H2Connection:
    conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    if settings:
        conn.update_settings({getattr(SettingCodes, k): v for k, v in settings.items()})
    return conn


def described(events: list[object]) -> list[tuple[object, ...]]:
    """Events as plain tuples (message bytes compared by value, whatever buffer type carried them)."""
    out: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, _http2.RequestReceived):
            out.append(("request", event.stream_id, tuple(event.headers)))
        elif isinstance(event, _http2.MessageReceived):
            out.append(("message", event.stream_id, bytes(event.data), event.flag))
        elif isinstance(event, _http2.RequestEnded):
            out.append(("ended", event.stream_id, event.leftover))
        elif isinstance(event, _http2.StreamClosed):
            out.append(("closed", event.stream_id, event.error_code))
        elif isinstance(event, _http2.MessageTooLarge):
            out.append(("too large", event.stream_id, event.declared))
        elif isinstance(event, _http2.PingAcknowledged):
            out.append(("ping ack",))
        else:
            raise AssertionError(f"not an event type of the binding: {event!r}")
    return out


def feed(session: _http2.Http2Session, data: bytes, cuts: list[int]) -> list[tuple[object, ...]]:
    """``data`` fed in pieces ending at ``cuts``; the events described."""
    events: list[object] = []
    start = 0
    for end in [*cuts, len(data)]:
        events += session.receive(memoryview(data)[start:end])
        start = end
    return described(events)


def answer(session: _http2.Http2Session, conn: H2Connection) -> list[object]:
    """What the session has to send, received by the client; the client's h2 events (SETTINGS and
    WINDOW_UPDATE bookkeeping left out)."""
    chunks = session.data_to_send()
    events = conn.receive_data(b"".join(bytes(chunk) for chunk in chunks)) if chunks else []
    return [e for e in events if not isinstance(e, RemoteSettingsChanged | SettingsAcknowledged | WindowUpdated)]


def two_streams_wire() -> tuple[bytes, list[tuple[object, ...]]]:
    """A client's first flight: preface, SETTINGS, two calls interleaved, one message split over DATA frames."""
    conn = client()
    small = b"\x0a\x03abc" * 7
    larger = bytes(range(256)) * 3  # 768 bytes, sent in three DATA frames
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_headers(3, REQUEST_HEADERS + [(b"grpc-timeout", b"5S")])
    framed = grpc_message(larger)
    conn.send_data(1, framed[:3])  # a DATA frame that ends inside the prefix
    conn.send_data(3, grpc_message(small) + grpc_message(b""))  # two messages (one empty) in one frame
    conn.send_data(1, framed[3:400])
    conn.send_data(1, framed[400:], end_stream=True)
    conn.end_stream(3)
    expected = [
        ("request", 1, tuple(REQUEST_HEADERS)),
        ("request", 3, tuple(REQUEST_HEADERS + [(b"grpc-timeout", b"5S")])),
        ("message", 3, small, 0),
        ("message", 3, b"", 0),
        ("message", 1, larger, 0),
        ("ended", 1, 0),
        ("ended", 3, 0),
    ]
    return conn.data_to_send(), expected


def test_events_are_the_same_wherever_the_reads_end() -> None:
    wire, expected = two_streams_wire()
    assert feed(_http2.Http2Session(1 << 20), wire, []) == expected
    for cut in range(1, len(wire)):
        assert feed(_http2.Http2Session(1 << 20), wire, [cut]) == expected, f"cut at byte {cut}"
    assert feed(_http2.Http2Session(1 << 20), wire, list(range(1, len(wire)))) == expected  # byte by byte


def test_a_repeated_request_head_reuses_the_previous_heads_field_objects() -> None:
    """A client sends the same head on every call: a field that repeats the previous head's field at the same
    place is that field's (name, value) object again (nothing allocated); any other field is read anew."""
    conn = client()
    other = [*REQUEST_HEADERS[:3], (b":authority", b"elsewhere:8001"), *REQUEST_HEADERS[4:], (b"grpc-timeout", b"1S")]
    shifted = [REQUEST_HEADERS[1], REQUEST_HEADERS[0], *REQUEST_HEADERS[2:]]  # the first two swapped
    for stream_id, headers in ((1, REQUEST_HEADERS), (3, REQUEST_HEADERS), (5, other), (7, shifted)):
        conn.send_headers(stream_id, headers, end_stream=True)
    events = _http2.Http2Session(1 << 20).receive(conn.data_to_send())
    heads = [event.headers for event in events if isinstance(event, _http2.RequestReceived)]
    assert heads == [REQUEST_HEADERS, REQUEST_HEADERS, other, shifted]
    assert all(a is b for a, b in zip(heads[0], heads[1], strict=True))
    assert [a is b for a, b in zip(heads[1], heads[2][:6], strict=True)] == [True, True, True, False, True, True]
    assert [a is b for a, b in zip(heads[2], heads[3], strict=False)] == [False, False, True, False, True, True]


def test_two_cuts_anywhere_in_one_request() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    payload = b"xyz" * 10
    conn.send_data(1, grpc_message(payload), end_stream=True)
    wire = conn.data_to_send()
    expected = [("request", 1, tuple(REQUEST_HEADERS)), ("message", 1, payload, 0), ("ended", 1, 0)]
    for first in range(1, len(wire), 3):
        for second in range(first + 1, len(wire), 5):
            assert feed(_http2.Http2Session(1 << 20), wire, [first, second]) == expected, (first, second)


def test_a_message_larger_than_a_frame_arrives_whole_from_any_read_size() -> None:
    payload = bytes(i % 251 for i in range(60_000))  # within the first window (65,535), four DATA frames
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    framed = grpc_message(payload, compressed=True)
    for start in range(0, len(framed), 16_384):  # h2's default largest frame
        conn.send_data(1, framed[start:start + 16_384])
    conn.end_stream(1)
    wire = conn.data_to_send()
    for step in (1_000, 4_099, 16_393, 65_536):
        events = feed(_http2.Http2Session(1 << 20), wire, list(range(step, len(wire), step)))
        assert events == [("request", 1, tuple(REQUEST_HEADERS)), ("message", 1, payload, 1), ("ended", 1, 0)]
    session = _http2.Http2Session(1 << 20)
    (message,) = [e for e in session.receive(wire) if isinstance(e, _http2.MessageReceived)]
    # over several DATA frames: gathered into the one bytearray allocated from its prefix, handed over as it is
    assert isinstance(message.data, bytearray) and len(message.data) == len(payload)


def test_a_declared_length_over_the_limit_is_refused_before_buffering() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"x" * 50, declared=1_000))  # a prefix that claims more than the limit
    conn.send_data(1, grpc_message(b"fine"), end_stream=True)  # the rest of the request is ignored
    wire = conn.data_to_send()
    session = _http2.Http2Session(100)
    assert feed(session, wire, []) == [
        ("request", 1, tuple(REQUEST_HEADERS)),
        ("too large", 1, 1_000),
        ("ended", 1, 0),
    ]


def test_a_request_that_ends_inside_a_message_says_how_much_arrived() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"abcdef", declared=10), end_stream=True)
    wire = conn.data_to_send()
    for cut in range(1, len(wire)):
        assert feed(_http2.Http2Session(1 << 20), wire, [cut])[-1] == ("ended", 1, 11)  # prefix + 6 bytes


def test_progress_counts_data_and_the_partial_message() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"abc", declared=8))
    session = _http2.Http2Session(1 << 20)
    session.receive(conn.data_to_send())
    assert session.progress(1) == (8, 8)
    assert session.is_open(1) and session.open_streams() == 1
    assert session.progress(99) == (-1, 0) and not session.is_open(99)


def test_an_answer_goes_out_as_headers_data_trailers_and_closes_the_stream() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"req"), end_stream=True)
    session.receive(conn.data_to_send())
    assert session.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    assert not session.send_headers(1, [(b":status", b"200")])  # once only
    assert session.send_message(1, b"response")
    assert session.send_trailers(1, [(b"grpc-status", b"0")])
    assert not session.send_message(1, b"late")  # nothing after the trailers
    events = answer(session, conn)
    kinds = [type(event) for event in events]
    assert kinds[:4] == [ResponseReceived, DataReceived, TrailersReceived, StreamEnded]
    assert events[1].data == grpc_message(b"response")
    assert dict(events[2].headers) == {b"grpc-status": b"0"}
    assert session.queued_bytes() == 0
    assert described(session.receive(b"")) == []  # closed normally once its trailers went out: no news
    assert session.open_streams() == 0


def test_a_stream_reset_before_its_answer_went_out_is_reported() -> None:
    """StreamClosed reports what the connection must act on: a client that reset its call (running or answered
    but not yet sent), with the error code it gave."""
    conn = client()
    session = _http2.Http2Session(1 << 20)
    for stream_id in (1, 3):
        conn.send_headers(stream_id, REQUEST_HEADERS)
        conn.send_data(stream_id, grpc_message(b"req"), end_stream=True)
    session.receive(conn.data_to_send())
    answer(session, conn)
    assert session.answer(3, [(b":status", b"200")], b"queued, not sent", [(b"grpc-status", b"0")])
    conn.reset_stream(1, ErrorCodes.CANCEL)
    conn.reset_stream(3, ErrorCodes.CANCEL)
    assert described(session.receive(conn.data_to_send())) == [("closed", 1, 8), ("closed", 3, 8)]
    assert session.open_streams() == 0 and session.queued_bytes() == 0


def test_a_unary_answer_in_one_call_goes_out_as_headers_data_trailers() -> None:
    """``answer``: what ``send_headers`` + ``send_message`` (or ``send_message_parts``) + ``send_trailers`` send,
    in one call; refused (False, nothing queued) on a stream that answered, and a bad part queues nothing."""
    conn = client()
    session = _http2.Http2Session(1 << 20)
    for stream_id in (1, 3, 5):
        conn.send_headers(stream_id, REQUEST_HEADERS)
        conn.send_data(stream_id, grpc_message(b"req"), end_stream=True)
    session.receive(conn.data_to_send())
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]
    with pytest.raises(TypeError, match="parts"):
        session.answer(5, headers, [b"ok", bytearray(b"not a part")], trailers)
    assert session.queued_bytes() == 0
    assert session.answer(1, headers, b"response", trailers)
    assert session.answer(3, headers, [b"head:", memoryview(b"tail")], trailers)
    assert not session.answer(1, headers, b"again", trailers)  # answered already
    assert not session.send_message(3, b"late")  # nothing after the trailers
    assert not session.answer(7, headers, b"no such stream", trailers)
    events = answer(session, conn)
    by_stream: dict[int, list[object]] = {}
    for event in events:
        by_stream.setdefault(event.stream_id, []).append(event)
    for stream_id, body in ((1, b"response"), (3, b"head:tail")):
        kinds = [type(event) for event in by_stream[stream_id]]
        assert kinds == [ResponseReceived, DataReceived, TrailersReceived, StreamEnded]
        assert by_stream[stream_id][1].data == grpc_message(body)
        assert dict(by_stream[stream_id][2].headers) == {b"grpc-status": b"0"}
    assert 5 not in by_stream and session.queued_bytes() == 0


def test_a_large_response_leaves_without_a_copy() -> None:
    conn = client()
    conn.increment_flow_control_window(1 << 24)
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"req"), end_stream=True)
    session.receive(conn.data_to_send())
    body = bytes(i % 256 for i in range(60_000))
    session.send_headers(1, [(b":status", b"200")])
    session.send_message(1, body)
    session.send_trailers(1, [(b"grpc-status", b"0")])
    chunks = session.data_to_send()
    views = [chunk for chunk in chunks if isinstance(chunk, memoryview)]
    assert views and all(view.obj is body for view in views)  # DATA payloads are slices of the message itself
    events = conn.receive_data(b"".join(bytes(chunk) for chunk in chunks))
    assert b"".join(e.data for e in events if isinstance(e, DataReceived)) == grpc_message(body)
    assert any(isinstance(e, TrailersReceived) for e in events)


def test_an_early_answer_is_followed_by_a_reset_in_the_same_send() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, b"\x00\x00\x00")  # the request goes on: the client is still sending
    session.receive(conn.data_to_send())
    assert session.send_headers_only(1, [(b":status", b"200"), (b"grpc-status", b"3")], reset=True)
    events = answer(session, conn)
    assert [type(e) for e in events] == [ResponseReceived, StreamEnded, StreamReset]
    assert events[2].error_code == ErrorCodes.NO_ERROR
    assert described(session.receive(b"")) == [("closed", 1, 0)]


def test_trailers_with_reset_follow_the_data_already_queued() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    session.receive(conn.data_to_send())
    session.send_headers(1, [(b":status", b"200")])
    session.send_message(1, b"one")
    session.send_trailers(1, [(b"grpc-status", b"4")], reset=True)
    events = answer(session, conn)
    assert [type(e) for e in events] == [ResponseReceived, DataReceived, TrailersReceived, StreamEnded, StreamReset]


def test_responses_wait_for_the_flow_control_window() -> None:
    conn = client(INITIAL_WINDOW_SIZE=10)
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, grpc_message(b"req"), end_stream=True)
    session.receive(conn.data_to_send())
    answer(session, conn)  # the server's SETTINGS and its ACK of ours
    session.receive(conn.data_to_send())  # the client's ACK of the server's SETTINGS
    session.send_headers(1, [(b":status", b"200")])
    session.send_message(1, b"x" * 1_000)
    session.send_trailers(1, [(b"grpc-status", b"0")])
    received = sum(len(e.data) for e in answer(session, conn) if isinstance(e, DataReceived))
    assert received == 10 and session.queued_bytes() == 1_005 - 10
    conn.increment_flow_control_window(10_000, stream_id=1)
    session.receive(conn.data_to_send())
    events = answer(session, conn)
    assert sum(len(e.data) for e in events if isinstance(e, DataReceived)) == 995
    assert any(isinstance(e, StreamEnded) for e in events) and session.queued_bytes() == 0


def test_a_ping_round_trip_is_an_event() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    session.receive(conn.data_to_send())
    session.ping()
    assert any(isinstance(e, PingReceived) for e in answer(session, conn))
    assert described(session.receive(conn.data_to_send())) == [("ping ack",)]
    conn.ping(b"12345678")
    session.receive(conn.data_to_send())
    assert any(isinstance(e, PingAckReceived) for e in answer(session, conn))  # nghttp2 answers the client's


def test_graceful_goaway_lets_open_streams_finish() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    conn.send_headers(1, REQUEST_HEADERS)
    session.receive(conn.data_to_send())
    session.shutdown_notice()
    session.goaway()
    events = answer(session, conn)
    (goaway,) = [e for e in events if isinstance(e, ConnectionTerminated)][-1:]
    assert goaway.last_stream_id == 1 and goaway.error_code == ErrorCodes.NO_ERROR
    assert session.open_streams() == 1 and session.want_read()  # stream 1 may still finish
    session.send_headers_only(1, [(b":status", b"200"), (b"grpc-status", b"0")], reset=True)
    sent = b"".join(bytes(chunk) for chunk in session.data_to_send())  # (h2 takes no frame after a GOAWAY)
    assert [sent[3], sent[9 + int.from_bytes(sent[:3], "big") + 3]] == [0x1, 0x3]  # HEADERS, then RST_STREAM
    assert not session.want_read() and not session.want_write()  # nothing left: the connection may close


def test_a_protocol_error_ends_the_connection_with_a_goaway() -> None:
    conn = client()
    session = _http2.Http2Session(1 << 20)
    session.receive(conn.data_to_send())
    answer(session, conn)
    # DATA on stream 0 is a connection error (RFC 9113 6.1): nghttp2 answers GOAWAY(PROTOCOL_ERROR)
    assert session.receive(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x") == []
    (goaway,) = [e for e in answer(session, conn) if isinstance(e, ConnectionTerminated)]
    assert goaway.error_code == ErrorCodes.PROTOCOL_ERROR
    assert not session.want_read() and not session.want_write()  # the connection closes


def test_a_connection_that_is_not_http2_raises() -> None:
    session = _http2.Http2Session(1 << 20)
    with pytest.raises(_http2.Http2Error):
        session.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_unknown_streams_are_refused_quietly() -> None:
    session = _http2.Http2Session(1 << 20)
    assert not session.send_headers(5, [(b":status", b"200")])
    assert not session.send_headers_only(5, [(b":status", b"200")], reset=True)
    assert not session.send_message(5, b"x")
    assert not session.send_trailers(5, [(b"grpc-status", b"0")], reset=True)
    session.reset(5, _http2.CANCEL)
    assert session.data_to_send()  # the server's SETTINGS only; no frame for stream 5


def test_headers_over_the_advertised_list_size_are_answered_in_the_binding() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS + [(b"x-big", b"v" * 300)])
    conn.send_data(1, grpc_message(b"body"))  # the upload goes on: the reset stops it
    wire = conn.data_to_send()
    for cut in (1, len(wire) // 2, len(wire) - 1):
        session = _http2.Http2Session(1 << 20, max_header_list_size=256)
        assert feed(session, wire, [cut]) == []  # never a call: no event at all
        peer = client()
        peer.send_headers(1, REQUEST_HEADERS + [(b"x-big", b"v" * 300)])
        peer.data_to_send()
        events = answer(session, peer)
        assert [type(e) for e in events] == [ResponseReceived, StreamEnded, StreamReset]
        assert dict(events[0].headers)[b"grpc-status"] == b"8"


def test_the_compressed_flag_byte_is_reported_as_sent() -> None:
    conn = client()
    conn.send_headers(1, REQUEST_HEADERS)
    conn.send_data(1, b"\x07" + grpc_message(b"abc")[1:], end_stream=True)
    assert feed(_http2.Http2Session(1 << 20), conn.data_to_send(), [])[1] == ("message", 1, b"abc", 7)

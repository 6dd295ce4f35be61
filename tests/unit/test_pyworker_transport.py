"""Small tensors inside a worker message: their bytes in C order, a writable array on the other side; BYTES
tensors in Triton's framing, never pickled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastoip.pyworker import channel, transport


def crossed(packed: Any) -> Any:
    """``packed`` as the other process reads it: inside a record, encoded and decoded (msgpack, no pickle)."""
    record = channel.decode(channel.encode(channel.Reply(1, packed, None)), channel.TO_WORKER)
    return record.value


@pytest.mark.parametrize(
    "array",
    [
        np.arange(16, dtype=np.float32),
        np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2, 1:],  # strided: copied in C order
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.arange(5, dtype=">i4"),  # big-endian keeps its byte order
        np.array(3.5, dtype=np.float16),  # 0-d
        np.zeros((0, 4), dtype=np.uint8),
        np.array([True, False]),
    ],
    ids=["fp32", "strided", "fortran", "big-endian", "scalar", "empty", "bool"],
)
def test_inline_arrays_cross_whole_and_writable(array: np.ndarray) -> None:
    before = transport.COPIED.arrays_inline
    packed = crossed(transport.pack(array, None))
    assert packed[0] == "b" and transport.COPIED.arrays_inline == before + 1
    out = transport.unpack(packed, None)
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable  # a model may write into its inputs, as in Triton


def test_bytes_arrays_travel_in_tritons_framing_not_as_objects() -> None:
    array = np.array([[b"a", b"bc"], ["d\u00e9", b""]], dtype=object)  # str elements as UTF-8, as Triton's
    packed = transport.pack(array, None)
    assert packed[0] == "t"
    assert packed[1] == b"\x01\0\0\0a" b"\x02\0\0\0bc" b"\x03\0\0\0d\xc3\xa9" b"\0\0\0\0"
    out = transport.unpack(crossed(packed), None)
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == [[b"a", b"bc"], ["d\u00e9".encode(), b""]]


def test_bytes_elements_that_are_not_bytes_cross_as_their_text() -> None:
    out = transport.unpack(crossed(transport.pack(np.array([1, 2.5], dtype=object), None)), None)
    assert out.tolist() == [b"1", b"2.5"]


@pytest.mark.parametrize(
    ("packed", "says"),
    [
        (("b", bytearray(8), "<f4", (3,)), "is not 8 bytes"),  # 12 bytes declared, 8 sent
        (("b", bytearray(16), "|O", (2,)), "cannot hold objects"),  # pointers from another process
        (("b", bytearray(4), "<f4", (-1,)), "is not a size"),
        (("b", bytearray(4), "<f4", (1,) * 65), "at most 64 dimensions"),
        (("b", "text", "<f4", (1,)), "not a packed tensor"),
        (("b", bytearray(4), "<f4", [1, "x"]), "not a packed tensor"),
        (("b", bytearray(8), "<i4", (1 << 62, 1 << 62)), "is not a size"),  # the count overflows
        (("t", b"\x05\x00\x00\x00ab", (1,)), "BYTES"),  # an element longer than the bytes
        (("t", b"", (3,)), "BYTES"),  # three elements announced, none sent
        (("m", 1, "|O", (1,)), "not a packed tensor"),  # (no segments here: nothing in shared memory)
        (("p", "fastoip-pyw-0-1", "<f4", (1,)), "not a packed tensor"),  # a name, as before: no such kind
        (("i", object()), "not a packed tensor"),  # the pickled form of before: refused
        ("b", "a tagged list"),
    ],
    ids=["short", "objects", "negative", "dims", "text", "bad-shape", "overflow", "bytes-long", "bytes-missing",
         "shm-without-segments", "a-name", "object", "not-a-list"],
)
def test_what_the_other_process_sends_is_checked_before_it_is_viewed(packed: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        transport.unpack(packed, None)


def test_the_received_array_keeps_its_bytes_from_being_resized() -> None:
    packed = transport.pack(np.arange(4, dtype=np.int32), None)  # (as the receiver that owns it holds it)
    out = transport.unpack(packed, None)
    with pytest.raises(BufferError):
        packed[1].extend(b"0000")  # the array's memory stays where it is while the array lives
    out[0] = 7
    assert bytes(packed[1][:4]) == (7).to_bytes(4, "little")  # a view, not a copy


def test_without_segments_a_large_array_travels_inline() -> None:
    """No segments (no handover socket, or no memfd_create): every numeric array goes inside the message."""
    array = np.arange(transport.INLINE_LIMIT // 4 + 16, dtype=np.float32)[::-1]  # over the limit, and strided
    packed = crossed(transport.pack(array, None))
    assert packed[0] == "b"
    np.testing.assert_array_equal(transport.unpack(packed, None), array)

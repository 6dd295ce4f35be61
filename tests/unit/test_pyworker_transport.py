"""Small tensors inside a worker message: their bytes in C order, a writable array on the other side."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from fastoip.pyworker import transport


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
    packed = pickle.loads(pickle.dumps(transport.pack(array), protocol=pickle.HIGHEST_PROTOCOL))
    assert packed[0] == "b" and transport.COPIED.arrays_inline == before + 1
    out = transport.unpack(packed)
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable  # a model may write into its inputs, as in Triton


def test_object_arrays_travel_as_objects() -> None:
    array = np.array([b"a", b"bc"], dtype=object)
    packed = transport.pack(array)
    assert packed[0] == "i" and transport.unpack(packed) is array


@pytest.mark.parametrize(
    ("packed", "says"),
    [
        (("b", bytearray(8), "<f4", (3,)), "is not 8 bytes"),  # 12 bytes declared, 8 sent
        (("b", bytearray(16), "|O", (2,)), "cannot hold objects"),  # pointers from another process
        (("b", bytearray(4), "<f4", (-1,)), "is not a size"),
        (("b", bytearray(4), "<f4", (1,) * 65), "at most 64 dimensions"),
        (("b", b"\0" * 4, "<f4", (1,)), "bytearray, dtype name, shape"),  # bytes: not what pack sends
        (("b", bytearray(4), "<f4", [1]), "bytearray, dtype name, shape"),
        (("b", bytearray(8), "<i4", (1 << 62, 1 << 62)), "is not a size"),  # the count overflows
    ],
    ids=["short", "objects", "negative", "dims", "bytes", "list-shape", "overflow"],
)
def test_what_the_other_process_sends_is_checked_before_it_is_viewed(packed: tuple, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        transport.unpack(packed)


def test_the_received_array_keeps_its_bytes_from_being_resized() -> None:
    packed = pickle.loads(pickle.dumps(transport.pack(np.arange(4, dtype=np.int32)), protocol=pickle.HIGHEST_PROTOCOL))
    out = transport.unpack(packed)
    with pytest.raises(BufferError):
        packed[1].extend(b"0000")  # the array's memory stays where it is while the array lives
    out[0] = 7
    assert bytes(packed[1][:4]) == (7).to_bytes(4, "little")  # a view, not a copy


def test_without_shared_memory_a_large_array_travels_inline(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No ``/dev/shm`` (a container without it): every numeric array goes inside the message, whatever its size."""
    monkeypatch.setattr(transport, "_SHM_DIR", str(tmp_path / "absent"))
    array = np.arange(transport.INLINE_LIMIT // 4 + 16, dtype=np.float32)[::-1]  # over the limit, and strided
    packed = pickle.loads(pickle.dumps(transport.pack(array), protocol=pickle.HIGHEST_PROTOCOL))
    assert packed[0] == "b"
    np.testing.assert_array_equal(transport.unpack(packed), array)


def test_a_segment_shared_memory_has_no_room_for_is_an_error_in_tritons_words_not_a_sigbus() -> None:
    # (ftruncate alone makes a sparse file: the first write to a page without memory would kill the writer)
    before = set(os.listdir(transport._SHM_DIR))
    free = os.statvfs(transport._SHM_DIR)
    too_big = (free.f_blocks + 1) * free.f_frsize  # more than the whole file system
    with pytest.raises(OSError, match="Failed to increase the shared memory pool size"):
        transport._new_file(too_big)
    assert set(os.listdir(transport._SHM_DIR)) - before == set()  # nothing left behind

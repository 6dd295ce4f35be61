"""fastoip.pyworker._ring: the shared-memory ring a worker writes its results into, read through a second mapping
of the same memfd (the way the server maps it), without processes or sockets."""

from __future__ import annotations

import mmap
import os
import struct

import pytest

from fastoip.pyworker import _ring as ring_module
from fastoip.pyworker._ring import CAPACITY, DATA_AT, RECORD_LIMIT, WRITE_AT, ResultRing, RingCorrupt

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux's")


@pytest.fixture
def pair() -> tuple[ResultRing, ResultRing]:
    reader = ResultRing.create()
    writer = ResultRing(os.dup(reader.fd))  # the worker's side: the same memory, mapped again
    yield writer, reader
    writer.close()
    reader.close()


def test_records_come_out_once_in_order(pair: tuple[ResultRing, ResultRing]) -> None:
    writer, reader = pair
    assert reader.take() == []
    for data in (b"one", b"", b"three" * 100):
        assert writer.put(data)
    assert reader.take() == [b"one", b"", b"three" * 100]
    assert reader.take() == []  # taken once


def test_records_wrap_around_the_end_of_the_ring(pair: tuple[ResultRing, ResultRing]) -> None:
    writer, reader = pair
    record = bytes(range(256)) * 100  # 25,600 bytes: CAPACITY is not a multiple of the record with its length
    seen = 0
    for round_ in range(5 * CAPACITY // len(record)):
        data = record[:-1] + bytes([round_ % 256])
        assert writer.put(data)
        if round_ % 3 == 2:
            for got in reader.take():
                assert got[:-1] == record[:-1]
                seen += 1
    seen += len(reader.take())
    assert seen == 5 * CAPACITY // len(record)


def test_a_full_ring_refuses_until_the_reader_takes(pair: tuple[ResultRing, ResultRing]) -> None:
    writer, reader = pair
    record = b"x" * (RECORD_LIMIT - 4)
    puts = 0
    while writer.put(record):
        puts += 1
    assert puts == CAPACITY // RECORD_LIMIT  # every byte in use, nothing overwritten
    assert not writer.put(b"y")
    assert len(reader.take()) == puts
    assert writer.put(b"y") and reader.take() == [b"y"]


def test_a_record_over_the_limit_is_refused(pair: tuple[ResultRing, ResultRing]) -> None:
    writer, reader = pair
    assert not writer.put(b"z" * (RECORD_LIMIT + 1))
    assert reader.take() == []
    assert ring_module.RECORD_LIMIT < CAPACITY


def test_what_no_writer_could_have_written_is_refused(pair: tuple[ResultRing, ResultRing]) -> None:
    """A length past the end of the area, or a write position behind the reader's or a ring ahead: RingCorrupt
    (the server then ends that worker), never a read outside the mapping or a wait for results that never come."""
    writer, reader = pair
    assert writer.put(b"fine")
    region = mmap.mmap(reader.fd, DATA_AT + CAPACITY)  # a third mapping: the process writing over it
    struct.pack_into("<I", region, DATA_AT, CAPACITY)  # the record's length, as that process might
    with pytest.raises(RingCorrupt):
        reader.take()
    struct.pack_into("<Q", region, WRITE_AT, 5 * CAPACITY)  # the write position more than a ring ahead of the reader
    with pytest.raises(RingCorrupt):
        reader.take()
    region.close()


def test_a_closed_ring_refuses_instead_of_touching_unmapped_memory() -> None:
    reader = ResultRing.create()
    writer = ResultRing(os.dup(reader.fd))
    assert writer.put(b"before")
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.put(b"after")
    assert reader.take() == [b"before"]  # what was written stays in the memory the other side maps
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.take()
    with pytest.raises(TypeError):
        ResultRing.create().put("text")  # type: ignore[arg-type]  # records are bytes

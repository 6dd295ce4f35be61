"""The tensor segments between the server and its Python workers (issue 36): made by the server, nameless
(memfds handed over as descriptors), named by index in messages, a lying index refused, sizes sealed, pages
reserved, pools bounded per worker and in all, idle ones given back.

Both sides run here, on the two ends of a socket pair (the handover socket), as in a server and its worker."""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from fastoip.pyworker import segments, transport
from fastoip.pyworker.segments import SegmentRefused, ServerSegments, SharedMemoryFull, WorkerSegments

LARGE = transport.INLINE_LIMIT // 4 * 2  # FP32 elements: over the inline limit, into a segment


class Pair:
    def __init__(self) -> None:
        server_end, worker_end = socket.socketpair()
        self.violations: list[str] = []
        self.server = ServerSegments(server_end, self.violations.append)
        self.worker = WorkerSegments(worker_end, self.server.grant)


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    monkeypatch.setattr(segments, "IDLE_S", 3600.0)  # the trimming threads leave the tests' segments alone
    made = Pair()
    yield made
    made.server.close()


def _memfd_mappings() -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "memfd:fastoip-segment" in line]


def _root(array: np.ndarray) -> object:
    root: object = array
    while isinstance(root, np.ndarray):
        root = root.base
    return root.obj if isinstance(root, memoryview) else root


def test_a_segment_has_no_name_and_crosses_by_index(pair: Pair) -> None:
    """Issue 36: the segments were files in /dev/shm that a client could register.  Now nothing is there: the
    server makes a memfd, the worker gets its descriptor, the message carries an index."""
    before = set(os.listdir("/dev/shm"))
    array = np.arange(LARGE, dtype=np.float32)
    packed = transport.pack(array, pair.server)
    assert packed[0] == "m" and type(packed[1]) is int  # an index, no name
    assert set(os.listdir("/dev/shm")) == before  # nothing nameable was made
    assert any("(deleted)" in line for line in _memfd_mappings())  # a memfd, mapped
    out = transport.unpack(packed, pair.worker)
    np.testing.assert_array_equal(out, array)
    assert isinstance(_root(out), mmap.mmap) and not out.flags.writeable  # a view on the mapping, not a copy
    # and back: the worker asks the server for a segment of its own, writes it, the server reads it by index
    answer = transport.pack(out * 2, pair.worker)
    assert answer[0] == "m" and answer[1] != packed[1]
    np.testing.assert_array_equal(transport.unpack(answer, pair.server), array * 2)
    assert set(os.listdir("/dev/shm")) == before
    assert pair.violations == []


def test_a_segment_cannot_be_resized_by_either_side() -> None:
    """Sealed: a worker that truncates a segment under the server (a SIGBUS in the server, before) cannot."""
    fd = segments._new_memfd(1 << 20)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL) == (
            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # and the seals stay
        assert os.fstat(fd).st_blocks * 512 >= 1 << 20  # every page reserved
    finally:
        os.close(fd)


def test_a_pooled_segment_is_reused_each_way(pair: Pair) -> None:
    array = np.ones(LARGE, dtype=np.float32)
    indexes, made = [], segments.MADE.segments
    for _ in range(3):
        packed = transport.pack(array, pair.server)
        out = transport.unpack(packed, pair.worker)
        answer = transport.pack(out, pair.worker)
        del out  # the worker's view of the input goes: the server may reuse it
        back = transport.unpack(answer, pair.server)
        indexes.append((packed[1], answer[1]))
        del back
    assert len(set(indexes)) == 1  # the same two segments each round
    assert segments.MADE.segments == made + 2


def _indexes(pair: Pair) -> dict[str, int]:
    """One segment of each kind the worker could name, and its index."""
    to_worker = transport.pack(np.ones(LARGE, dtype=np.float32), pair.server)[1]
    pooled = transport.pack(np.ones(LARGE, dtype=np.float32), pair.worker)[1]
    return {"to the worker": to_worker, "to the server": pooled}


@pytest.mark.parametrize("lie", ["unknown", "the server's own", "not a number", "a bool", "larger than it",
                                 "a one-shot twice", "retired"])
def test_an_index_the_worker_may_not_use_is_refused_and_the_worker_ended(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, lie: str
) -> None:
    """The worker's messages name segments by index: one it may not name is refused before any view is made,
    and the server is told to end the worker (on_violation), as for a frame that is not a record."""
    indexes = _indexes(pair)
    nbytes = LARGE * 4
    index: object
    if lie == "unknown":
        index = 10_000
    elif lie == "the server's own":
        index = indexes["to the worker"]
    elif lie == "not a number":
        index = "../../etc/passwd"
    elif lie == "a bool":
        index = True
    elif lie == "larger than it":
        index, nbytes = indexes["to the server"], 1 << 30
    elif lie == "a one-shot twice":
        monkeypatch.setattr(segments, "_pool_limit", 0)
        index = transport.pack(np.ones(LARGE, dtype=np.float32), pair.worker)[1]
        pair.server.open(index, nbytes)
    else:
        index = indexes["to the server"]
        pair.worker.collect(0.0)  # the worker retires its free pooled segment ...
        pair.server.collect(3600.0)  # ... and the server sees it
        if index in pair.server._incoming:  # (it was busy: the pack above left it so)
            pair.server._incoming[index].state[0] = segments.RETIRED
            pair.server.collect(3600.0)
    with pytest.raises(SegmentRefused):
        pair.server.open(index, nbytes)
    assert len(pair.violations) == 1


def test_a_tensor_over_the_pool_takes_a_one_shot_segment_read_once(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "_pool_limit", 4 * (segments.HEADER + segments.MIN_CAPACITY))
    used = segments.BUDGET.used
    held = [transport.pack(np.ones(LARGE, dtype=np.float32), pair.server) for _ in range(6)]
    pooled = [pair.server._outgoing[i].pooled for i in range(6)]
    assert pooled.count(True) == 2 and pooled.count(False) == 4  # (two of 128 KiB fill a pool of four 64 KiB)
    big = transport.pack(np.ones(1 << 20, dtype=np.float32), pair.server)  # 4 MiB: larger than the whole pool
    views = [transport.unpack(p, pair.worker) for p in [*held, big]]
    assert segments.BUDGET.used > used
    del views
    pair.server.collect(3600.0)  # free one-shot segments go at once; the pooled ones stay for reuse
    assert [s.pooled for s in pair.server._outgoing] == [True, True]
    pair.server.collect(0.0)
    assert pair.server._outgoing == [] and segments.BUDGET.used == used


def test_the_total_is_bounded_and_free_segments_make_room_first(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--python-shm-pool-total``: every worker's segments together; past it (once free ones are given back,
    this worker's and any other's) the tensor's request fails in python_backend's words, nothing else does."""
    other = Pair()
    four, two = np.ones(1 << 20, dtype=np.float32), np.ones(1 << 19, dtype=np.float32)  # 4 MiB, 2 MiB
    try:
        monkeypatch.setattr(segments, "_total_limit", segments.BUDGET.used + (6 << 20))
        free_elsewhere = transport.unpack(transport.pack(four, other.server), other.worker)  # pooled in another
        del free_elsewhere  # worker's table, and free
        held = transport.unpack(transport.pack(four, pair.server), pair.worker)
        assert other.server._outgoing == []  # the other worker's free segment was given back for it
        with pytest.raises(SharedMemoryFull, match=r"Failed to increase the shared memory pool size: .*"
                                                   r"--python-shm-pool-total"):
            transport.pack(four, pair.server)
        with pytest.raises(SharedMemoryFull, match="--python-shm-pool-total"):  # the worker's side too
            transport.pack(two, pair.worker)
        del held
        np.testing.assert_array_equal(  # room again once the first is free
            transport.unpack(transport.pack(two * 3, pair.worker), pair.server), 3)
        assert pair.violations == [] and other.violations == []
    finally:
        other.server.close()


def test_a_worker_over_its_segment_count_is_refused(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENTS_PER_WORKER", 3)
    for _ in range(3):
        pair.server.grant(1000)
    with pytest.raises(SharedMemoryFull, match="holds 3 segments, the most it may"):
        pair.server.grant(1000)
    for nbytes in (0, -5, "9", 2**80):
        with pytest.raises(SharedMemoryFull):
            pair.server.grant(nbytes)


def test_idle_segments_are_given_back_on_both_sides(pair: Pair) -> None:
    """Issue 36: an idle server kept 720 MB of /dev/shm after 8 requests of 48 MB; now idle segments go, the
    budget with them, and each side unmaps the other's."""
    used = segments.BUDGET.used
    out = transport.unpack(transport.pack(np.ones(LARGE, dtype=np.float32), pair.server), pair.worker)
    back = transport.unpack(transport.pack(out, pair.worker), pair.server)
    del out, back
    assert pair.worker._mapped and pair.worker._pool
    pair.server.collect(0.0)  # the server's free segments, idle (0 s here)
    pair.worker.collect(0.0)  # the worker's, and its mappings of the server's retired ones
    pair.server.collect(0.0)  # the server sees the worker's retired
    assert not pair.worker._mapped and not pair.worker._pool
    assert len(pair.server) == 0 and segments.BUDGET.used == used


def test_a_dead_workers_segments_are_given_back(pair: Pair) -> None:
    used = segments.BUDGET.used
    view = transport.unpack(transport.pack(np.ones(LARGE, dtype=np.float32), pair.worker), pair.server)
    transport.pack(np.ones(LARGE, dtype=np.float32), pair.server)
    pair.server.close()
    assert segments.BUDGET.used == used
    np.testing.assert_array_equal(view, 1)  # a view the server still holds keeps its pages
    with pytest.raises(SharedMemoryFull, match="the worker is gone"):
        transport.pack(np.ones(LARGE, dtype=np.float32), pair.server)


def test_a_worker_that_does_not_read_its_handover_socket_fails_requests_not_the_server(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "_pool_limit", 0)
    monkeypatch.setattr(segments, "SEGMENTS_PER_WORKER", 1 << 20)
    monkeypatch.setattr(segments, "_total_limit", 1 << 40)
    with pytest.raises(SharedMemoryFull, match="does not take the segments it is given"):
        for _ in range(100_000):  # never read: the socket's buffer fills
            pair.server.grant(1)


def test_requests_waiting_for_a_dead_worker_move_into_the_replacements_segments(pair: Pair) -> None:
    """A worker that dies leaves requests it never started; they go to its replacement, whose segments are its
    own: their bytes are copied there from the dead one's (which go once moved)."""
    replacement = Pair()
    try:
        large = np.arange(LARGE, dtype=np.float32)
        request = ("r", 0, 0, {}, [("A", "FP32", large), ("B", "INT32", np.arange(4, dtype=np.int32))], ["OUT"], None)
        packed = transport.pack_requests([request], pair.server)
        moved = transport.move_requests(packed, pair.server, replacement.server)
        assert moved[0][4][1][2][0] == "b"  # the small one as it was
        index = moved[0][4][0][2][1]
        assert replacement.server.written(index) is not None and pair.server._outgoing[0].state[0] == segments.FREE
        unpacked = transport.unpack_request(moved[0], replacement.worker)
        np.testing.assert_array_equal(unpacked.inputs[0][2], large)
        np.testing.assert_array_equal(unpacked.inputs[1][2], np.arange(4, dtype=np.int32))
    finally:
        replacement.server.close()


def test_a_worker_that_hoards_segments_leaves_the_others_room(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The segments a worker asks for (and may keep, never sending them) are its share, half the total: another
    worker's tensors still find room."""
    monkeypatch.setattr(segments, "_total_limit", segments.BUDGET.used + (8 << 20))
    monkeypatch.setattr(segments, "_pool_limit", 0)
    pair.server.grant(3 << 20)  # held, never sent
    with pytest.raises(SharedMemoryFull, match="half of --python-shm-pool-total .* the most one worker may"):
        pair.server.grant(2 << 20)
    other = Pair()
    try:
        out = transport.unpack(transport.pack(np.ones(1 << 19, dtype=np.float32), other.worker), other.server)
        np.testing.assert_array_equal(out, 1)  # 2 MiB for another worker
    finally:
        other.server.close()

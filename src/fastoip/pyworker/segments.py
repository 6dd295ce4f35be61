"""The shared-memory segments between the server and one Python worker: memory only these two processes hold.

Rules:
- The server makes every segment (python_backend's server process likewise
  creates each stub's shared-memory pool): ``memfd_create`` (an object with
  no name in any file system: nothing in /dev/shm, nothing a client or another
  process can open, register or guess), every page reserved (``posix_fallocate``:
  no room is :class:`SharedMemoryFull` for that request, never a fault later),
  its size sealed (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: neither side
  can truncate it under the other, so a mapping of it can never SIGBUS).
- The worker gets each segment as a descriptor on a socket of their own (the
  handover socket; ``SCM_RIGHTS``) with a per-worker index: messages name a
  segment by that index only.  Indexes are never reused.  An index the worker
  may not use (unknown, retired, the other direction's, a one-shot one used
  twice, a tensor larger than the segment) is refused and the worker is ended
  (``on_violation``), as for a frame that is not a record.  The server never
  reads the handover socket (its reading side is shut).
- Two kinds per worker, by who writes: *to the worker* (inputs, BLS answers:
  the server takes them) and *to the server* (outputs, BLS requests: the
  worker takes them, and asks the server for a new one by message,
  :class:`~.channel.SegmentWanted`, answered with its index after the
  descriptor went on the handover socket).
- Byte 0 of a segment is its state: 0 free, 1 busy (the writer set it; the
  reader clears it when its last view is gone), 2 retired (the side that
  takes it gave it up; the other side drops its mapping when it sees that).
  Pooled segments are reused; one-shot ones (a tensor over the pool) are
  retired as soon as they are free.  Free pooled ones idle for :data:`IDLE_S`
  are retired.
- Bounds: each worker's pooled segments, each way, total at most
  :func:`pool_limit` (``--python-shm-pool``); every segment of every worker
  together at most :func:`total_limit` (``--python-shm-pool-total``); the
  segments a worker asked for (its share: a worker that hoards them leaves the
  others room) at most half of that; a worker holds at most
  :data:`SEGMENTS_PER_WORKER` at once.  A segment that would
  pass the total first makes room (every free segment the server takes goes,
  idle before busy), then fails its request with :class:`SharedMemoryFull`
  (RESOURCE_EXHAUSTED): the server and the worker go on.
- The state byte is a plain byte store and load: ordered on x86-64 (total store
  order); other architectures would need a fence.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import itertools
import mmap
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable

#: Bytes before a segment's data (byte 0: its state).
HEADER = 64
FREE, BUSY, RETIRED = 0, 1, 2
#: Who writes a segment (the handover record says which).
TO_WORKER, TO_SERVER = 1, 2
#: The smallest pooled segment (a tensor smaller than 64 KiB travels inside its message).
MIN_CAPACITY = 64 * 1024
#: Pooled bytes per worker and direction by default (``--python-shm-pool``).
DEFAULT_POOL_BYTES = 16 * 1024 * 1024
#: Every segment of every worker together by default (``--python-shm-pool-total``): a 96 MiB tensor in and
#: its answer out, with the pools beside them.
DEFAULT_TOTAL_BYTES = 256 * 1024 * 1024
#: The environment variable that bounds the pools (bytes; the server sets it for its workers).
POOL_ENV = "FASTOIP_PYTHON_SHM_POOL"
#: The environment variable that gives a worker the descriptor of its end of the handover socket.
HANDOVER_ENV = "FASTOIP_PYWORKER_SEGMENTS_FD"
#: A free pooled segment unused this long is retired (its pages go once both sides dropped it).
IDLE_S = 1.0
#: Segments one worker holds at once (both ways): a worker that asks for many small ones is stopped here.
SEGMENTS_PER_WORKER = 1024
#: The handover socket's send buffer on the server's side: room for every record an honest worker has yet to
#: read (one per segment, each a small message with a descriptor).
HANDOVER_BUFFER = 1 << 20
#: How long the server waits for room on a handover socket before it gives up on that worker.
HANDOVER_WAIT_S = 1.0
#: One handover record: index, size (header included), kind (TO_WORKER / TO_SERVER), pooled.
_RECORD = struct.Struct("<QQBB6x")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: python_backend's words when its shared memory cannot grow (Triton's QA matches them).
NO_ROOM = "Failed to increase the shared memory pool size"


class _Made:
    def __init__(self) -> None:
        self.segments = 0


#: Segments this process made (the server's count: reuse shows as none made).
MADE = _Made()


class SharedMemoryFull(Exception):
    """No room for a tensor's segment: that request fails, nothing else does."""


class SegmentRefused(ValueError):
    """A message named a segment its sender may not use (the worker that sent it is ended)."""


def _pool_limit_from_environment() -> int:
    try:
        return max(0, int(os.environ.get(POOL_ENV, DEFAULT_POOL_BYTES)))
    except ValueError:
        return DEFAULT_POOL_BYTES


_pool_limit = _pool_limit_from_environment()
_total_limit = DEFAULT_TOTAL_BYTES


def pool_limit() -> int:
    """The most bytes one worker keeps in pooled segments, each way."""
    return _pool_limit


def set_pool_limit(nbytes: int) -> None:
    """Bound each worker's pooled segments (the workers spawned later read it from their environment)."""
    global _pool_limit
    _pool_limit = max(0, nbytes)
    os.environ[POOL_ENV] = str(_pool_limit)


def total_limit() -> int:
    """The most bytes all segments of all workers take together (the server's budget)."""
    return _total_limit


def set_total_limit(nbytes: int) -> None:
    global _total_limit
    _total_limit = max(0, nbytes)


class Segment:
    """One segment as one side maps it."""

    __slots__ = ("index", "mapping", "view", "state", "size", "pooled", "used_at")

    def __init__(self, index: int, mapping: mmap.mmap, size: int, pooled: bool) -> None:
        self.index = index
        self.mapping = mapping
        #: The whole segment (header included): what views are cut from.
        self.view = memoryview(mapping)
        self.state = self.view[:1]
        self.size = size
        self.pooled = pooled
        self.used_at = time.monotonic()

    @property
    def capacity(self) -> int:
        return self.size - HEADER


def _release(state: memoryview) -> None:
    state[0] = FREE  # the writer may reuse (or retire) it


def released_with(array: object, segment: Segment) -> None:
    """Mark ``segment`` free when ``array`` (a view on it, the reader's) is gone."""
    weakref.finalize(array, _release, segment.state)


class Segments:
    """One side's segments of one peer: what :mod:`.transport` packs into and unpacks from."""

    def take(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` to write into, marked busy (SharedMemoryFull when there is no room)."""
        raise NotImplementedError

    def open(self, index: object, nbytes: int) -> Segment:
        """The segment ``index`` the peer wrote ``nbytes`` into (SegmentRefused for one it may not name)."""
        raise NotImplementedError

    def discard(self, index: int) -> None:
        """A segment taken here whose message will never be read: free again."""
        raise NotImplementedError


# -- the server's side ---------------------------------------------------------------------------------------
class _Budget:
    """Bytes of every worker's segments together, against :func:`total_limit`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.used = 0

    def reserve(self, nbytes: int) -> bool:
        with self.lock:
            if self.used + nbytes > _total_limit:
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self.lock:
            self.used -= nbytes


BUDGET = _Budget()
#: The server's live tables (one per worker), for making room and for trimming.
_tables: set[ServerSegments] = set()
_tables_lock = threading.Lock()
_trimming = False


def _new_memfd(size: int) -> int:
    """A sealed, fully reserved memfd of ``size`` bytes (SharedMemoryFull when the pages cannot be had)."""
    fd = os.memfd_create("fastoip-segment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise
            raise SharedMemoryFull(
                f"{NO_ROOM}: no memory for a tensor segment of {size - HEADER} bytes between the server and a "
                f"Python model's worker ({os.strerror(exc.errno)})"
            ) from None
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _capacity(nbytes: int) -> int:
    """A pooled segment's capacity for ``nbytes``: the power of two that holds them, 64 KiB at least."""
    return 1 << max(MIN_CAPACITY - 1, nbytes - 1).bit_length()


def _over_total(nbytes: int) -> SharedMemoryFull:
    return SharedMemoryFull(
        f"{NO_ROOM}: a tensor segment of {nbytes - HEADER} bytes would take the Python models' shared memory past "
        f"--python-shm-pool-total ({_total_limit} bytes, {BUDGET.used} in use); raise it or send smaller tensors"
    )


def make_room(nbytes: int) -> bool:
    """Reserve ``nbytes`` of the budget, after every table gave back what it can (free before busy)."""
    if BUDGET.reserve(nbytes):
        return True
    with _tables_lock:
        tables = list(_tables)
    for table in tables:
        table.collect(0.0)
    return BUDGET.reserve(nbytes)


class ServerSegments(Segments):
    """The server's side of one worker's segments (see the module's rules).

    ``handover``: the server's end of the handover socket; ``on_violation(why)``: the worker named a segment
    it may not use (the caller ends it)."""

    def __init__(self, handover: socket.socket, on_violation: Callable[[str], None]) -> None:
        handover.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HANDOVER_BUFFER)
        try:
            handover.shutdown(socket.SHUT_RD)  # (the worker has nothing to say here)
        except OSError:
            pass
        handover.setblocking(False)
        self._handover = handover
        self._on_violation = on_violation
        self._lock = threading.Lock()
        self._indexes = itertools.count(1)
        #: Segments the server writes: the pooled ones for reuse, the one-shot ones until free.
        self._outgoing: list[Segment] = []
        #: Segments the worker writes, by index (a one-shot one leaves when it is read).
        self._incoming: dict[int, Segment] = {}
        #: One-shot incoming segments read and not yet free.
        self._read_once: list[Segment] = []
        self._pooled_out = 0
        self._pooled_in = 0
        self._closed = False
        with _tables_lock:
            _tables.add(self)

    def __len__(self) -> int:
        return len(self._outgoing) + len(self._incoming) + len(self._read_once)

    def _new(self, nbytes: int, kind: int, pooled_bytes: int) -> Segment:
        """A new segment for ``nbytes`` of data, pooled when the pool has room, handed to the worker (busy)."""
        capacity = _capacity(nbytes)
        pooled = pooled_bytes + HEADER + capacity <= _pool_limit
        size = HEADER + (capacity if pooled else nbytes)
        if len(self) >= SEGMENTS_PER_WORKER:
            self.collect(0.0)
            if len(self) >= SEGMENTS_PER_WORKER:
                raise SharedMemoryFull(f"{NO_ROOM}: the worker holds {SEGMENTS_PER_WORKER} segments, the most it may")
        if not make_room(size):
            raise _over_total(size)
        try:
            fd = _new_memfd(size)
            try:
                segment = Segment(next(self._indexes), mmap.mmap(fd, size), size, pooled)
                MADE.segments += 1
                segment.state[0] = BUSY
                self._hand_over(_RECORD.pack(segment.index, size, kind, pooled), fd)
            finally:
                os.close(fd)  # (the mapping, and the worker's descriptor once it is received, hold the pages)
        except BaseException:
            BUDGET.give_back(size)
            raise
        return segment

    def _hand_over(self, record: bytes, fd: int) -> None:
        """The record and the descriptor on the handover socket, before any message names its index."""
        if self._closed:
            raise SharedMemoryFull(f"{NO_ROOM}: the worker is gone")
        try:
            sent = socket.send_fds(self._handover, [record], [fd], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise SharedMemoryFull(f"{NO_ROOM}: the worker's handover socket is gone ({exc})") from None
        if sent == 0:
            raise SharedMemoryFull(f"{NO_ROOM}: the worker does not take the segments it is given")
        rest = memoryview(record)[sent:]
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while rest:  # (a partial record: its descriptor went with its first byte; the rest follows)
            if not select.select([], [self._handover], [], max(0.0, deadline - time.monotonic()))[1]:
                self._on_violation("it does not read its handover socket")
                raise SharedMemoryFull(f"{NO_ROOM}: the worker does not take the segments it is given")
            try:
                sent = self._handover.send(rest)
                rest = rest[sent:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                raise SharedMemoryFull(f"{NO_ROOM}: the worker's handover socket is gone ({exc})") from None

    def take(self, nbytes: int) -> Segment:
        with self._lock:
            for segment in self._outgoing:
                if segment.pooled and segment.capacity >= nbytes and segment.state[0] == FREE:
                    segment.state[0] = BUSY
                    segment.used_at = time.monotonic()
                    return segment
            size = HEADER + _capacity(nbytes)
            if size <= _pool_limit and self._pooled_out + size > _pool_limit:
                # Room in the pool for it: free segments that do not fit go first (idle before busy).
                keep = []
                for segment in self._outgoing:
                    if segment.pooled and segment.state[0] == FREE and self._pooled_out + size > _pool_limit:
                        self._pooled_out -= segment.size
                        self._retire(segment)
                    else:
                        keep.append(segment)
                self._outgoing = keep
            pooled_bytes = self._pooled_out
        segment = self._new(nbytes, TO_WORKER, pooled_bytes)
        with self._lock:
            if self._closed:
                self._retire(segment)
                raise SharedMemoryFull(f"{NO_ROOM}: the worker is gone")
            self._outgoing.append(segment)
            if segment.pooled:
                self._pooled_out += segment.size
        _start_trimming()
        return segment

    def grant(self, nbytes: object) -> list[int]:
        """A new segment the worker asked for (:class:`~.channel.SegmentWanted`): ``[index, size, pooled]``;
        SharedMemoryFull when there is no room for it."""
        if type(nbytes) is not int or nbytes <= 0:
            raise SharedMemoryFull(f"{NO_ROOM}: a segment of {str(nbytes)[:40]} bytes cannot be made")
        self.collect(float("inf"))  # (what the worker retired, before its pool's room is counted)
        with self._lock:
            pooled_bytes = self._pooled_in
            held = sum(segment.size for segment in self._incoming.values())
        if held + HEADER + nbytes > _total_limit // 2:  # a worker's share: one that hoards leaves the others room
            raise SharedMemoryFull(
                f"{NO_ROOM}: the worker holds {held} bytes of segments it writes; {nbytes} more would pass half of "
                f"--python-shm-pool-total ({_total_limit} bytes), the most one worker may"
            )
        segment = self._new(nbytes, TO_SERVER, pooled_bytes)
        with self._lock:
            if self._closed:
                self._retire(segment)
                raise SharedMemoryFull(f"{NO_ROOM}: the worker is gone")
            self._incoming[segment.index] = segment
            if segment.pooled:
                self._pooled_in += segment.size
        _start_trimming()
        return [segment.index, segment.size, int(segment.pooled)]

    def _refuse(self, why: str) -> SegmentRefused:
        self._on_violation(why)
        return SegmentRefused(why)

    def open(self, index: object, nbytes: int) -> Segment:
        if type(index) is not int:
            raise self._refuse(f"a segment index that is not a number: {str(index)[:40]!r}")
        with self._lock:
            segment = self._incoming.get(index)
            if segment is None:
                raise self._refuse(f"segment {index}, which is not one it may write (unknown or retired)")
            if nbytes > segment.capacity:
                raise self._refuse(f"{nbytes} bytes in segment {index} of {segment.capacity}")
            if not segment.pooled:
                del self._incoming[index]  # read once: naming it again is refused
                self._read_once.append(segment)
        return segment

    def discard(self, index: int) -> None:
        with self._lock:
            for segment in self._outgoing:
                if segment.index == index:
                    segment.state[0] = FREE

    def written(self, index: int) -> Segment | None:
        """The segment ``index`` the server wrote for this worker and still holds (None: no such segment)."""
        with self._lock:
            for segment in self._outgoing:
                if segment.index == index:
                    return segment
        return None

    def _retire(self, segment: Segment) -> None:
        """Drop the server's hold on ``segment`` (the lock is held, or it is in no list yet)."""
        segment.state[0] = RETIRED  # (the worker drops its mapping when it sees this)
        BUDGET.give_back(segment.size)

    def collect(self, idle_s: float) -> None:
        """Retire what is free: one-shot segments, pooled ones of the server's idle ``idle_s``, and the pooled
        ones the worker retired."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            keep = []
            for segment in self._outgoing:
                if segment.state[0] == FREE and (not segment.pooled or now - segment.used_at >= idle_s):
                    if segment.pooled:
                        self._pooled_out -= segment.size
                    self._retire(segment)
                else:
                    keep.append(segment)
            self._outgoing = keep
            for index in [i for i, s in self._incoming.items() if s.state[0] == RETIRED or (
                    not s.pooled and s.state[0] == FREE)]:
                segment = self._incoming.pop(index)
                if segment.pooled:
                    self._pooled_in -= segment.size
                BUDGET.give_back(segment.size)
            keep = []
            for segment in self._read_once:
                if segment.state[0] == BUSY:
                    keep.append(segment)
                else:
                    BUDGET.give_back(segment.size)
            self._read_once = keep

    def close(self) -> None:
        """The worker is gone: every segment is given back (views the server still has keep their pages)."""
        with _tables_lock:
            _tables.discard(self)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for segment in [*self._outgoing, *self._incoming.values(), *self._read_once]:
                BUDGET.give_back(segment.size)
            self._outgoing = []
            self._incoming = {}
            self._read_once = []
            self._pooled_out = self._pooled_in = 0
        try:
            self._handover.close()
        except OSError:
            pass


def _start_trimming() -> None:
    global _trimming
    with _tables_lock:
        if _trimming:
            return
        _trimming = True
    threading.Thread(target=_trim_tables, name="fastoip-segments-trim", daemon=True).start()


def _trim_tables() -> None:
    """Every IDLE_S: what each worker's table can give back (ends when no table holds a segment)."""
    global _trimming
    while True:
        time.sleep(IDLE_S)
        with _tables_lock:
            tables = list(_tables)
        for table in tables:
            table.collect(IDLE_S)
        with _tables_lock:
            if not any(len(table) for table in _tables):
                _trimming = False
                return


def _after_fork() -> None:
    """In a forked child of the server: its workers' segments stay the parent's (never made room in, trimmed or
    counted here; the locks start free)."""
    global _tables_lock, _trimming
    _tables.clear()
    _tables_lock = threading.Lock()
    _trimming = False  # (the thread did not come along)
    BUDGET.lock = threading.Lock()
    BUDGET.used = 0


os.register_at_fork(after_in_child=_after_fork)


# -- the worker's side ---------------------------------------------------------------------------------------
class WorkerSegments(Segments):
    """The worker's side: the segments the server handed over, by index.

    ``ask(nbytes)``: asks the server for a new segment to write (``[index, size, pooled]``), raising
    SharedMemoryFull with the server's words when there is none."""

    def __init__(self, handover: socket.socket, ask: Callable[[int], list]) -> None:
        handover.setblocking(False)
        self._handover = handover
        self._ask = ask
        self._lock = threading.Lock()
        #: Handed over and not yet taken: index -> (segment, kind).
        self._known: dict[int, tuple[Segment, int]] = {}
        #: Pooled segments the worker writes, for reuse.
        self._pool: list[Segment] = []
        #: Pooled segments the server writes, mapped here.
        self._mapped: dict[int, Segment] = {}
        self._unread = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._trimming = False

    def _sync(self) -> None:
        """Take every record the server handed over (never waits: a record is on the socket before any message
        that names its index)."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._handover, _RECORD.size * 64, 64, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            self._unread.extend(data)
            self._fds.extend(fds)
        while len(self._unread) >= _RECORD.size and self._fds:
            index, size, kind, pooled = _RECORD.unpack_from(self._unread)
            del self._unread[: _RECORD.size]
            fd = self._fds.popleft()
            try:
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._known[index] = (Segment(index, mapping, size, bool(pooled)), kind)

    def _handed(self, index: int, kind: int) -> Segment | None:
        """The segment ``index`` of ``kind`` the server handed over (and forget it: it is placed by the caller)."""
        entry = self._known.pop(index, None)
        if entry is None:
            self._sync()
            entry = self._known.pop(index, None)
        if entry is None or entry[1] != kind:
            return None
        return entry[0]

    def take(self, nbytes: int) -> Segment:
        with self._lock:
            for segment in self._pool:
                if segment.capacity >= nbytes and segment.state[0] == FREE:
                    segment.state[0] = BUSY
                    segment.used_at = time.monotonic()
                    return segment
        with self._lock:
            size = HEADER + _capacity(nbytes)
            pooled = sum(segment.size for segment in self._pool)
            if size <= _pool_limit and pooled + size > _pool_limit:
                keep = []
                for segment in self._pool:  # free ones that do not fit go first: the server pools this one
                    if segment.state[0] == FREE and pooled + size > _pool_limit:
                        segment.state[0] = RETIRED
                        pooled -= segment.size
                    else:
                        keep.append(segment)
                self._pool = keep
        try:
            index = self._ask(nbytes)[0]
        except SharedMemoryFull:
            self.collect(0.0)  # the pool's free segments go first (the server counts them), then once more
            index = self._ask(nbytes)[0]
        with self._lock:
            handed = self._handed(index, TO_SERVER)
            if handed is None:
                raise SharedMemoryFull(f"{NO_ROOM}: the server's segment {index} did not arrive")
            if handed.pooled:  # (busy: the server marked it so)
                self._pool.append(handed)
        self._start_trimming()
        return handed

    def open(self, index: object, nbytes: int) -> Segment:
        if type(index) is not int:
            raise SegmentRefused(f"a segment index that is not a number: {str(index)[:40]!r}")
        with self._lock:
            segment = self._mapped.get(index)
            if segment is None:
                segment = self._handed(index, TO_WORKER)
                if segment is None:
                    raise SegmentRefused(f"segment {index} is not one the server handed over")
                if segment.pooled:
                    self._mapped[index] = segment
                    self._start_trimming_locked()
            if nbytes > segment.capacity:
                raise SegmentRefused(f"{nbytes} bytes in segment {index} of {segment.capacity}")
        return segment

    def discard(self, index: int) -> None:
        with self._lock:
            for segment in self._pool:
                if segment.index == index:
                    segment.state[0] = FREE

    def collect(self, idle_s: float) -> None:
        """Retire own free pooled segments idle ``idle_s``; drop the server's it retired (and one-shot ones it
        handed over and gave up)."""
        now = time.monotonic()
        with self._lock:
            keep = []
            for segment in self._pool:
                if segment.state[0] == FREE and now - segment.used_at >= idle_s:
                    segment.state[0] = RETIRED  # the server gives its budget back when it sees this
                else:
                    keep.append(segment)
            self._pool = keep
            for index in [i for i, s in self._mapped.items() if s.state[0] == RETIRED]:
                del self._mapped[index]  # unmapped when the last view on it is gone
            if self._known:
                self._sync()
                for index in [i for i, (s, _) in self._known.items() if s.state[0] == RETIRED]:
                    del self._known[index]

    def _start_trimming(self) -> None:
        with self._lock:
            self._start_trimming_locked()

    def _start_trimming_locked(self) -> None:
        if not self._trimming:
            self._trimming = True
            threading.Thread(target=self._trim, name="fastoip-segments-trim", daemon=True).start()

    def _trim(self) -> None:
        while True:
            time.sleep(IDLE_S)
            self.collect(IDLE_S)
            with self._lock:
                if not self._pool and not self._mapped and not self._known:
                    self._trimming = False
                    return

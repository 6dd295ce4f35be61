"""Results a worker hands to the server through a ring in shared memory, without a system call each.

Rules:
- The server makes the ring (an anonymous ``memfd``) and passes its descriptor
  to the worker; both map it.  One writer (the worker's main thread, which
  runs the batches) and one reader (whoever reads the worker's socket in the
  server, under its read lock).
- A record is a 4-byte little-endian length and that many bytes.  A record
  that would cross the end of the data area starts again at its beginning
  (a length of :data:`_SKIP` marks the rest of the area unused when 4 bytes
  fit there).  ``put`` returns False when the record does not fit in what the
  reader has not taken yet: the caller sends it on the socket instead.
- Positions are byte counts since the start (they only grow); the writer
  stores its position after the record's bytes, the reader its own after
  taking them.  Each side reads the other's position before touching the
  data: on x86-64 (total store order) that is enough; other architectures
  would need fences (``transport`` relies on the same).
- What the ring holds survives the worker: when the worker dies, the server
  takes every result it had written before deciding which batch it was
  running (the first not answered).
- The reader checks what the writer's process could have scribbled (a length
  or a position that cannot be): :class:`RingCorrupt`, and the server ends
  that worker, as for a message it cannot read.
"""

from __future__ import annotations

import mmap
import os
import struct

#: Bytes of the data area: a run of results between two wake-ups of the server fits many times.
CAPACITY = 1 << 20
#: Records larger than this go on the socket (a few of them would fill the ring).
RECORD_LIMIT = CAPACITY // 8
_WRITE_AT = 0
_READ_AT = 64  # (its own cache line: the two sides each store one)
_DATA_AT = 128
_POSITION = struct.Struct("<Q")
_LENGTH = struct.Struct("<I")
_SKIP = 0xFFFFFFFF


class RingCorrupt(ValueError):
    """The ring holds what its writer could not have written (a process that wrote over it)."""


class ResultRing:
    """One side's mapping of a worker's result ring."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._region = mmap.mmap(fd, _DATA_AT + CAPACITY)
        #: The writer's own position (the writer is the only one to change it).
        self._written = _POSITION.unpack_from(self._region, _WRITE_AT)[0]

    @classmethod
    def create(cls) -> ResultRing:
        """A new, empty ring (the server's side); ``fd`` is inheritable by the worker it starts."""
        fd = os.memfd_create("fastoip-results", 0)
        os.ftruncate(fd, _DATA_AT + CAPACITY)
        return cls(fd)

    def put(self, data: bytes) -> bool:
        """Write one record (the writer); False when it does not fit now."""
        size = len(data)
        if size > RECORD_LIMIT:
            return False
        region = self._region
        written = self._written
        taken = _POSITION.unpack_from(region, _READ_AT)[0]
        offset = written % CAPACITY
        rest = CAPACITY - offset
        skip = rest if rest < 4 + size else 0
        if written - taken + skip + 4 + size > CAPACITY:
            return False
        if skip:
            if skip >= 4:
                _LENGTH.pack_into(region, _DATA_AT + offset, _SKIP)
            written += skip
            offset = 0
        start = _DATA_AT + offset
        _LENGTH.pack_into(region, start, size)
        region[start + 4:start + 4 + size] = data
        written += 4 + size
        self._written = written
        _POSITION.pack_into(region, _WRITE_AT, written)  # (after the record: the reader may take it now)
        return True

    def take(self) -> list[bytes]:
        """Every record written and not taken yet (the reader)."""
        region = self._region
        written = _POSITION.unpack_from(region, _WRITE_AT)[0]
        taken = _POSITION.unpack_from(region, _READ_AT)[0]
        if taken == written:
            return []
        if not taken < written <= taken + CAPACITY:
            raise RingCorrupt(f"write position {written} with read position {taken}")
        records = []
        while taken < written:
            offset = taken % CAPACITY
            rest = CAPACITY - offset
            if rest < 4:
                taken += rest
                continue
            size = _LENGTH.unpack_from(region, _DATA_AT + offset)[0]
            if size == _SKIP:
                taken += rest
                continue
            if size > rest - 4 or taken + 4 + size > written:  # (a record never crosses the end, nor the writer)
                raise RingCorrupt(f"a record of {size} bytes at {taken}, with {written} written")
            start = _DATA_AT + offset + 4
            records.append(region[start:start + size])
            taken += 4 + size
        _POSITION.pack_into(region, _READ_AT, taken)  # (after the copies: the writer may reuse the bytes)
        return records

    def close(self) -> None:
        try:
            self._region.close()
        except BufferError:  # a view of it is still alive somewhere: the mapping goes with it
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass

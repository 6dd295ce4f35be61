# cython: language_level=3
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
  stores its position after the record's bytes (a release store), the reader
  its own after copying them out; each side loads the other's position with
  acquire ordering before touching the data.
- What the ring holds survives the worker: when the worker dies, the server
  takes every result it had written before deciding which batch it was
  running (the first not answered).
- The reader checks what the writer's process could have scribbled (a length
  or a position that cannot be): :class:`RingCorrupt`, and the server ends
  that worker, as for a message it cannot read.
- C, not Python: a record costs a ``memcpy`` and two position accesses on each
  side (the interpreted or mypyc version spent ~1.1 us a record on
  ``struct`` and ``mmap`` slicing).
"""

import os

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap

cdef extern from *:
    """
    #define FASTOIP_RING_CAPACITY (1ULL << 20)
    #define FASTOIP_RING_RECORD_LIMIT (FASTOIP_RING_CAPACITY / 8)
    #define FASTOIP_RING_WRITE_AT 0
    #define FASTOIP_RING_READ_AT 64
    #define FASTOIP_RING_DATA_AT 128
    #define FASTOIP_RING_SKIP 0xFFFFFFFFu
    static inline unsigned long long fastoip_ring_load(const unsigned long long *at) {
        return __atomic_load_n(at, __ATOMIC_ACQUIRE);
    }
    static inline void fastoip_ring_store(unsigned long long *at, unsigned long long value) {
        __atomic_store_n(at, value, __ATOMIC_RELEASE);
    }
    """
    unsigned long long fastoip_ring_load(const unsigned long long *at) nogil
    void fastoip_ring_store(unsigned long long *at, unsigned long long value) nogil
    # the layout (the Python names below say the same for tests and readers)
    const uint64_t _CAPACITY "FASTOIP_RING_CAPACITY"
    const uint64_t _RECORD_LIMIT "FASTOIP_RING_RECORD_LIMIT"
    const uint64_t _WRITE_AT "FASTOIP_RING_WRITE_AT"
    const uint64_t _READ_AT "FASTOIP_RING_READ_AT"
    const uint64_t _DATA_AT "FASTOIP_RING_DATA_AT"
    const uint32_t _SKIP "FASTOIP_RING_SKIP"

#: Bytes of the data area: a run of results between two wake-ups of the server fits many times.
CAPACITY = _CAPACITY
#: Records larger than this go on the socket (a few of them would fill the ring).
RECORD_LIMIT = _RECORD_LIMIT
#: Where the positions and the data lie in the mapping (the two positions on their own cache lines).
WRITE_AT = _WRITE_AT
READ_AT = _READ_AT
DATA_AT = _DATA_AT
#: The length that marks the rest of the data area unused.
SKIP = _SKIP


class RingCorrupt(ValueError):
    """The ring holds what its writer could not have written (a process that wrote over it)."""


cdef inline uint32_t _length_at(char *at) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, at, 4)  # (little-endian hosts only: x86-64 and aarch64, what fastoip runs on)
    return value


cdef class ResultRing:
    """One side's mapping of a worker's result ring."""

    cdef readonly int fd
    cdef char *base
    cdef unsigned long long *write_position
    cdef unsigned long long *read_position
    cdef char *data
    #: The writer's own position (the writer is the only one to change it).
    cdef uint64_t written

    def __cinit__(self, int fd):
        self.fd = fd
        self.base = NULL
        cdef void *address = mmap(NULL, _DATA_AT + _CAPACITY, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if address == MAP_FAILED:
            raise OSError(f"cannot map the result ring (descriptor {fd})")
        self.base = <char *> address
        self.write_position = <unsigned long long *> (self.base + _WRITE_AT)
        self.read_position = <unsigned long long *> (self.base + _READ_AT)
        self.data = self.base + _DATA_AT
        self.written = fastoip_ring_load(self.write_position)

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, _DATA_AT + _CAPACITY)
            self.base = NULL

    @classmethod
    def create(cls):
        """A new, empty ring (the server's side); ``fd`` is inheritable by the worker it starts."""
        fd = os.memfd_create("fastoip-results", 0)
        os.ftruncate(fd, _DATA_AT + _CAPACITY)
        return cls(fd)

    cdef inline void _check_open(self) except *:
        if self.base == NULL:
            raise ValueError("the result ring is closed")

    def put(self, bytes data not None):
        """Write one record (the writer); False when it does not fit now."""
        self._check_open()
        cdef Py_ssize_t size = len(data)
        if <uint64_t> size > _RECORD_LIMIT:
            return False
        cdef uint64_t written = self.written
        cdef uint64_t taken = fastoip_ring_load(self.read_position)
        cdef uint64_t offset = written % _CAPACITY
        cdef uint64_t rest = _CAPACITY - offset
        cdef uint64_t skip = rest if rest < <uint64_t> (4 + size) else 0
        cdef uint32_t length
        # (signed: a read position past this writer's, which only a process writing over the ring makes, lets the
        # record through for the server to find, as the interpreted ring did)
        if <int64_t> (written - taken) + <int64_t> (skip + 4 + <uint64_t> size) > <int64_t> _CAPACITY:
            return False
        if skip:
            if skip >= 4:
                length = _SKIP
                memcpy(self.data + offset, &length, 4)
            written += skip
            offset = 0
        length = <uint32_t> size
        memcpy(self.data + offset, &length, 4)
        memcpy(self.data + offset + 4, PyBytes_AS_STRING(data), size)
        written += 4 + <uint64_t> size
        self.written = written
        fastoip_ring_store(self.write_position, written)  # (after the record: the reader may take it now)
        return True

    def take(self):
        """Every record written and not taken yet (the reader)."""
        self._check_open()
        cdef uint64_t written = fastoip_ring_load(self.write_position)
        cdef uint64_t taken = fastoip_ring_load(self.read_position)
        if taken == written:
            return []
        if not (taken < written and written <= taken + _CAPACITY):
            raise RingCorrupt(f"write position {written} with read position {taken}")
        cdef list records = []
        cdef uint64_t offset, rest
        cdef uint32_t size
        while taken < written:
            offset = taken % _CAPACITY
            rest = _CAPACITY - offset
            if rest < 4:
                taken += rest
                continue
            size = _length_at(self.data + offset)
            if size == _SKIP:
                taken += rest
                continue
            if size > rest - 4 or taken + 4 + size > written:  # (a record never crosses the end, nor the writer)
                raise RingCorrupt(f"a record of {size} bytes at {taken}, with {written} written")
            records.append(PyBytes_FromStringAndSize(self.data + offset + 4, size))
            taken += 4 + size
        fastoip_ring_store(self.read_position, taken)  # (after the copies: the writer may reuse the bytes)
        return records

    def close(self):
        if self.base != NULL:
            munmap(self.base, _DATA_AT + _CAPACITY)
            self.base = NULL
        try:
            os.close(self.fd)
        except OSError:
            pass

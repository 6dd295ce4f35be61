# cython: language_level=3
"""Shared-memory mappings that a client cannot crash the server with.

A client owns the POSIX shared-memory objects it registers and may shrink
one (``ftruncate``) at any time, also while the server copies from it or
ONNX Runtime reads a zero-copy view of it.  Touching a page past the new end
raises SIGBUS, whose default action ends the process.

Rules:
- Every mapping made here is entered in a fixed table that a SIGBUS handler
  reads.  A fault inside a registered mapping is repaired where it happens:
  the pages from the faulting one to the mapping's end are replaced by
  private zero pages (``mmap(MAP_FIXED|MAP_ANONYMOUS)``), the mapping is
  marked faulted, and the faulting instruction runs again on the new pages.
  The request that was using it then answers an error (see ``faulted``).
- Any other SIGBUS goes to whatever handled it before (faulthandler, or the
  default action), so real bugs still end the process as they would have.
- The table entry lives as long as the mapping itself (until the last view
  of it is released), so a view that outlives unregistration stays guarded.
- The handler and the table are C (``_shmguard.h``), declared in ``_shmguard.pxd``.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport errno

# The C half (the slot table and the signal handler) is _shmguard.h; declarations: _shmguard.pxd.


cdef class GuardedMapping:
    """``size`` bytes of the file ``fd`` mapped shared and read-write, guarded against SIGBUS.

    Exposes the bytes through the buffer protocol (``np.frombuffer`` views keep
    it alive); unmapped when the last reference goes.  Keeps its own duplicate
    of ``fd`` so the object's current size can be checked on every use, unless
    ``keep_fd`` is False (the Python workers' segments: one descriptor fewer
    each; ``file_size`` is then -1).
    """

    cdef char *address
    cdef Py_ssize_t size
    cdef int slot
    cdef int fd

    def __cinit__(self, int fd, Py_ssize_t size, bint keep_fd=True):
        self.address = NULL
        self.slot = -1
        self.fd = -1
        if size <= 0:
            raise ValueError("a mapping needs a positive size")
        if shmguard_install() != 0:
            raise OSError(errno, "cannot install the SIGBUS handler for shared memory")
        cdef void *address = mmap(NULL, <size_t>size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if address == MAP_FAILED:
            raise OSError(errno, "mmap failed")
        self.address = <char *>address
        self.size = size
        self.slot = shmguard_take_slot(<size_t>address, <size_t>address + <size_t>size)
        if self.slot < 0:
            raise MemoryError("too many shared memory mappings at once")
        if keep_fd:
            self.fd = dup(fd)
            if self.fd < 0:
                raise OSError(errno, "dup failed")

    def __dealloc__(self):
        if self.slot >= 0:
            shmguard_release_slot(self.slot)
        if self.address != NULL:
            munmap(self.address, <size_t>self.size)
        if self.fd >= 0:
            close(self.fd)

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.address, self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __len__(self):
        return self.size

    @property
    def faulted(self):
        """True once a SIGBUS was repaired in this mapping: its bytes are no longer the client's."""
        return self.slot >= 0 and shmguard_faulted(self.slot) != 0

    def file_size(self):
        """The shared-memory object's size now (``fstat``), or -1 when it cannot be read."""
        return shmguard_file_size(self.fd)

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
"""

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport errno

cdef extern from *:
    """
    #include <errno.h>
    #include <signal.h>
    #include <stdint.h>
    #include <string.h>
    #include <sys/mman.h>
    #include <sys/stat.h>
    #include <unistd.h>

    #define SHMGUARD_SLOTS 4096

    typedef struct {
        volatile uintptr_t start;
        volatile uintptr_t end;
        volatile sig_atomic_t faulted;
    } shmguard_slot;

    static shmguard_slot shmguard_slots[SHMGUARD_SLOTS];
    static struct sigaction shmguard_previous;
    static int shmguard_installed = 0;

    static void shmguard_handler(int sig, siginfo_t *info, void *context) {
        /* si_code > 0: raised by the kernel for a memory access, si_addr is the address. */
        if (info != NULL && info->si_code > 0) {
            uintptr_t address = (uintptr_t)info->si_addr;
            uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
            int i;
            for (i = 0; i < SHMGUARD_SLOTS; i++) {
                uintptr_t start = shmguard_slots[i].start, end = shmguard_slots[i].end;
                if (start != 0 && address >= start && address < end) {
                    uintptr_t page = address & ~(page_size - 1);
                    int saved_errno = errno;
                    void *got = mmap((void *)page, end - page, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                    errno = saved_errno;
                    if (got != MAP_FAILED) {
                        shmguard_slots[i].faulted = 1;
                        return;
                    }
                    break;
                }
            }
        }
        /* Not ours: do what would have happened without this handler. */
        if (shmguard_previous.sa_flags & SA_SIGINFO) {
            if (shmguard_previous.sa_sigaction != NULL) {
                shmguard_previous.sa_sigaction(sig, info, context);
                return;
            }
        } else if (shmguard_previous.sa_handler != SIG_DFL && shmguard_previous.sa_handler != SIG_IGN) {
            shmguard_previous.sa_handler(sig);
            return;
        }
        sigaction(SIGBUS, &shmguard_previous, NULL);
        if (info == NULL || info->si_code <= 0) {
            raise(sig);  /* a sent signal does not repeat by itself */
        }
        /* a fault repeats when the instruction runs again, now with the default action */
    }

    static int shmguard_install(void) {
        struct sigaction action;
        if (shmguard_installed) {
            return 0;
        }
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = shmguard_handler;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, &shmguard_previous) != 0) {
            return -1;
        }
        shmguard_installed = 1;
        return 0;
    }

    static int shmguard_take_slot(uintptr_t start, uintptr_t end) {
        int i;
        for (i = 0; i < SHMGUARD_SLOTS; i++) {
            if (shmguard_slots[i].start == 0) {
                shmguard_slots[i].faulted = 0;
                shmguard_slots[i].end = end;
                __atomic_store_n(&shmguard_slots[i].start, start, __ATOMIC_SEQ_CST);
                return i;
            }
        }
        return -1;
    }

    static void shmguard_release_slot(int i) {
        __atomic_store_n(&shmguard_slots[i].start, (uintptr_t)0, __ATOMIC_SEQ_CST);
        shmguard_slots[i].end = 0;
        shmguard_slots[i].faulted = 0;
    }

    static int shmguard_faulted(int i) {
        return shmguard_slots[i].faulted != 0;
    }

    static long long shmguard_file_size(int fd) {
        struct stat info;
        if (fstat(fd, &info) != 0) {
            return -1;
        }
        return (long long)info.st_size;
    }
    """
    int shmguard_install()
    int shmguard_take_slot(size_t start, size_t end)
    void shmguard_release_slot(int i)
    int shmguard_faulted(int i)
    long long shmguard_file_size(int fd)

cdef extern from "<sys/mman.h>":
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int PROT_READ
    int PROT_WRITE
    int MAP_SHARED
    void *MAP_FAILED

cdef extern from "<unistd.h>":
    int dup(int fd)
    int close(int fd)



cdef class GuardedMapping:
    """``size`` bytes of the file ``fd`` mapped shared and read-write, guarded against SIGBUS.

    Exposes the bytes through the buffer protocol (``np.frombuffer`` views keep
    it alive); unmapped when the last reference goes.  Keeps its own duplicate
    of ``fd`` so the object's current size can be checked on every use.
    """

    cdef char *address
    cdef Py_ssize_t size
    cdef int slot
    cdef int fd

    def __cinit__(self, int fd, Py_ssize_t size):
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

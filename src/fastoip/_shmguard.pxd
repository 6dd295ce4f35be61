# Declarations of the shared-memory guard (_shmguard.pyx): the C half in _shmguard.h, and the system calls
# it uses, as asyncpg's pgproto declares its C helpers (hton.pxd over hton.h).

cdef extern from "_shmguard.h":
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

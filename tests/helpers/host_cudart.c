/* A host-memory stand-in for the few libcudart calls fastoip makes (tests/test_cuda_plumbing.py).
 *
 * It lets CPU-only CI drive fastoip's CUDA shared-memory code end to end: an "IPC handle" is the
 * NUL-terminated name of a POSIX shared-memory object, "device memory" is that object mapped, and
 * cudaMemcpy is memcpy.  It proves fastoip's side (ctypes declarations, registration, bounds,
 * copies in and out, the frontends); it proves nothing about CUDA itself.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { char reserved[64]; } cudaIpcMemHandle_t;

enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_MEMORY = 2, ERR_INVALID_DEVICE = 101 };
#define MAX_MAPPINGS 64
static struct { void *address; size_t size; } mappings[MAX_MAPPINGS];
/* cudaMalloc'd blocks: each a POSIX shared-memory object, so that its "IPC handle" is its name. */
static struct { void *address; size_t size; char name[64]; } blocks[MAX_MAPPINGS];
static unsigned long next_block;

const char *cudaGetErrorString(int status) {
    switch (status) {
    case ERR_INVALID_VALUE: return "invalid argument (host stand-in)";
    case ERR_MEMORY: return "out of memory (host stand-in)";
    case ERR_INVALID_DEVICE: return "invalid device ordinal (host stand-in)";
    default: return "unknown error (host stand-in)";
    }
}
int cudaGetDeviceCount(int *count) { *count = 1; return OK; }
int cudaSetDevice(int device) { return device == 0 ? OK : ERR_INVALID_DEVICE; }
int cudaGetDevice(int *device) { *device = 0; return OK; }
int cudaHostAlloc(void **pointer, size_t size, unsigned int flags) {
    (void)flags;
    *pointer = malloc(size);
    return *pointer ? OK : ERR_MEMORY;
}
int cudaFreeHost(void *pointer) { free(pointer); return OK; }

int cudaIpcOpenMemHandle(void **pointer, cudaIpcMemHandle_t handle, unsigned int flags) {
    (void)flags;
    char name[65];
    memcpy(name, handle.reserved, 64);
    name[64] = 0;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return ERR_INVALID_VALUE;
    struct stat info;
    if (fstat(fd, &info) != 0 || info.st_size == 0) { close(fd); return ERR_INVALID_VALUE; }
    void *address = mmap(NULL, (size_t)info.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (address == MAP_FAILED) return ERR_MEMORY;
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (mappings[i].address == NULL) {
            mappings[i].address = address;
            mappings[i].size = (size_t)info.st_size;
            *pointer = address;
            return OK;
        }
    }
    munmap(address, (size_t)info.st_size);
    return ERR_MEMORY;
}

int cudaIpcCloseMemHandle(void *pointer) {
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (mappings[i].address == pointer) {
            munmap(pointer, mappings[i].size);
            mappings[i].address = NULL;
            return OK;
        }
    }
    return ERR_INVALID_VALUE;
}

int cudaMemcpy(void *destination, const void *source, size_t size, int kind) {
    (void)kind;
    memmove(destination, source, size);
    return OK;
}

int cudaStreamSynchronize(void *stream) { (void)stream; return OK; }

int cudaMemset(void *pointer, int value, size_t size) {
    memset(pointer, value, size);
    return OK;
}

int cudaMalloc(void **pointer, size_t size) {
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (blocks[i].address != NULL) continue;
        snprintf(blocks[i].name, sizeof blocks[i].name, "/hostcudart_%d_%lu", (int)getpid(), next_block++);
        int fd = shm_open(blocks[i].name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) return ERR_MEMORY;
        if (ftruncate(fd, (off_t)size) != 0) { close(fd); shm_unlink(blocks[i].name); return ERR_MEMORY; }
        void *address = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (address == MAP_FAILED) { shm_unlink(blocks[i].name); return ERR_MEMORY; }
        blocks[i].address = address;
        blocks[i].size = size;
        *pointer = address;
        return OK;
    }
    return ERR_MEMORY;
}

int cudaFree(void *pointer) {
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (blocks[i].address == pointer) {
            munmap(pointer, blocks[i].size);
            shm_unlink(blocks[i].name);
            blocks[i].address = NULL;
            return OK;
        }
    }
    return ERR_INVALID_VALUE;
}

int cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *pointer) {
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (blocks[i].address == pointer) {
            memset(handle->reserved, 0, sizeof handle->reserved);
            memcpy(handle->reserved, blocks[i].name, strlen(blocks[i].name));
            return OK;
        }
    }
    return ERR_INVALID_VALUE;
}

/* How many handles are open now (for the in-process test of unregistering). */
int hostcudart_open_handles(void) {
    int open = 0;
    for (int i = 0; i < MAX_MAPPINGS; i++) open += mappings[i].address != NULL;
    return open;
}

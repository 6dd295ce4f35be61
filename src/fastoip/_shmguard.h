/* The SIGBUS guard of fastoip's shared-memory mappings (see _shmguard.pyx for the rules).
 *
 * A fixed table of mapped ranges that a SIGBUS handler reads: a fault inside a registered range is repaired
 * in place (private zero pages from the faulting page to the range's end) and marked; any other SIGBUS goes
 * to the handler that was there before.  Everything here is async-signal-safe where the handler runs.
 * Declared for Cython in _shmguard.pxd.
 */
#ifndef FASTOIP_SHMGUARD_H
#define FASTOIP_SHMGUARD_H

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

#endif /* FASTOIP_SHMGUARD_H */

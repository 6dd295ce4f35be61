"""Process-wide allocator settings for ``fastoip serve``: large blocks go back to the system when freed, and freed
heap memory up to 64 MiB stays for the next requests.

Why: glibc raises its mmap threshold each time a mapped block is freed (the "dynamic" threshold, up to 32 MiB),
so after the first few batches, model reloads and 602 KB tensors, blocks of that size come from the heap instead
of their own mappings, and a heap fragmented by reloads under traffic never shrinks. Measured in-process (8 threads
of `simple` + 602 KB `image_identity` requests, a reload every 0.3 s): RSS 112 -> 196 MB over 90 reloads with the
dynamic threshold, flat at 103-122 MB with the threshold pinned at 1 MiB; pinned at 4 MiB it still crept (106 ->
149 MB). 1 MiB keeps 602 KB tensors on the heap (no mmap/munmap per request) and maps what is larger.

Setting the threshold (``mallopt(M_MMAP_THRESHOLD)``) turns glibc's dynamic adjustment off, and with it the
dynamic trim threshold (twice the mmap threshold): the trim threshold falls back to 128 KiB, so each time the
blocks at the top of a heap are freed (a 602 KB request, its batch, its answer) glibc hands the pages back
(``brk`` / ``MADV_DONTNEED``) and the next request faults them in again, one page fault per 4 KiB. Measured with
the peer lab's 602 KB identity load (h2load 64 connections, RESULTS.md 2026-11-27 "602 KB against the C++
server"): 2 to 70 page faults per request and up to +150 us of kernel time per request. So the trim threshold is
pinned too, at 64 MiB (a 64-request window of 602 KB messages fits under it): at most that much free memory stays
at the top of each of glibc's heaps; blocks of 1 MiB and more are still their own mappings and go back when freed.

Nothing happens on a libc without ``mallopt`` (musl, macOS) or for a parameter the operator set themselves
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

#: glibc's ``M_MMAP_THRESHOLD`` parameter number (malloc.h).
_M_MMAP_THRESHOLD = -3
#: glibc's ``M_TRIM_THRESHOLD`` parameter number (malloc.h).
_M_TRIM_THRESHOLD = -1
#: Blocks at least this large get their own mapping and are unmapped when freed.
MMAP_THRESHOLD_BYTES = 1 << 20
#: Free memory at the top of a heap is given back to the system only above this size.
TRIM_THRESHOLD_BYTES = 64 << 20
#: The collector's thresholds once a process has loaded what it serves: gen0 raised from CPython's 700 (a request
#: allocates a few dozen containers, and the request path creates no reference cycles of its own, so young
#: collections rarely free anything).
GC_THRESHOLDS = (10_000, 20, 20)


def settle_python_heap() -> None:
    """Everything allocated so far (modules, sessions, configs, a Python model) lives as long as the process: move
    it out of the collector's sight, so the collections the request path triggers stay short (a full one over
    numpy's and a model's objects took milliseconds, a stall every request in flight waited out), and collect
    young objects less often.  Called by the serve process and by each Python model's worker once loaded."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold at ``threshold`` bytes; True when it was set."""
    return _mallopt("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, threshold)


def pin_trim_threshold(threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Pin glibc's trim threshold at ``threshold`` bytes; True when it was set."""
    return _mallopt("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, threshold)


def _mallopt(variable: str, parameter: int, value: int) -> bool:
    if variable in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(parameter, value))

"""Reusable batch input buffers, so a busy model allocates nothing per batch.

Rules:
- A lease is taken for one execution and given back after it; buffers are
  kept per (input name, dtype) and grow to the largest batch seen.
- On the CUDA EP, buffers are page-locked (pinned) host memory
  (:func:`fastoip.cuda.pinned_allocator`, given by the model) so the
  host-to-device copy is a DMA; elsewhere plain numpy memory.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np


class Lease:
    """A buffer on loan, viewed with the shape of one batch."""

    __slots__ = ("key", "storage", "view")

    def __init__(self, key: tuple, storage: np.ndarray, view: np.ndarray) -> None:
        self.key = key
        self.storage = storage
        self.view = view


Allocator = Callable[[int], np.ndarray]


def host_allocator(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


class BufferPool:
    """Free buffers per (input, dtype); thread-safe."""

    def __init__(self, allocator: Allocator | None = None) -> None:
        self._allocate = allocator or host_allocator
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.allocations = 0

    def take(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Lease:
        key = (name, dtype.str)
        nbytes = math.prod(shape) * dtype.itemsize  # (np.prod costs a few µs a call: once per input per batch)
        storage = None
        with self._lock:
            free = self._free.get(key)
            if free:
                storage = free.pop()
        if storage is None or storage.nbytes < nbytes:
            self.allocations += 1
            storage = self._allocate(max(nbytes, 64))
        view = storage[:nbytes].view(dtype).reshape(shape)
        return Lease(key, storage, view)

    def idle(self) -> int:
        """Buffers in the pool now (every buffer ever allocated is here when no execution runs)."""
        with self._lock:
            return sum(len(free) for free in self._free.values())

    def give_back(self, lease: Lease) -> None:
        with self._lock:
            if not self._closed:  # a lease that outlived close() is simply dropped
                self._free.setdefault(lease.key, []).append(lease.storage)

    def close(self) -> None:
        """Drop every free buffer now and keep none given back later.

        Why: an unloaded model is cyclic garbage, freed only by a full collection, which a busy server may not
        run for many reloads; its pool (concurrency x the largest batch) would stay resident until then.
        """
        with self._lock:
            self._closed = True
            self._free.clear()

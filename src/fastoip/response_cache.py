"""Triton's response cache: finished responses kept by request content, least recently used out first.

Rules (Triton's ``docs/user_guide/response_cache.md``, with fastoip's additions):
- The key is the model name and version and which load of it answers (a reload
  never answers from the entries of the load before it), every input's name, datatype, shape and
  bytes, and the requested outputs with their parameters (Triton keys on the
  inputs only; two requests asking for different outputs get different answers
  here, so the outputs are part of the key).
- A stored response owns copies of its output arrays: a live response's arrays can
  be views into pooled batch buffers that the next batch overwrites.
- The cache holds at most ``capacity_bytes`` of output data; an entry larger than
  that is not stored.  Inserting evicts least recently used entries until it fits.
- Identical requests that arrive while the first is still running wait for it
  (one execution, N answers): :meth:`ResponseCache.claim` says who runs.  A
  leader that ends with an error of its own (its client cancelled, its deadline
  passed) fails no waiter (issue 37: one request with a 0.4 s deadline failed
  every identical one waiting on it): the first waiter takes over and runs
  (its waiter is called with :data:`TAKE_OVER`), the others wait on it.
- Never used for models whose answers depend on more than the request (sequence
  and decoupled models): the caller decides (``LoadedModel.uses_response_cache``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .types import InferOutput, InferRequest, InferResponse, Parameters

#: What a waiter for an in-flight identical request is called with: the response or the error.
Waiter = Callable[[InferResponse | None, BaseException | None], None]


class TakeOver(Exception):
    """Given to a waiter instead of an answer: the request it waited on ended on its own account (cancelled,
    past its deadline), so this one runs now and completes the key itself."""


TAKE_OVER = TakeOver("the identical request this one waited for ended on its own account: run it")


@dataclass(frozen=True)
class CacheSettings:
    """``--cache-config local,size=N`` as Triton spells it: the local cache's size in bytes."""

    size_bytes: int = 0

    @property
    def enabled(self) -> bool:
        return self.size_bytes > 0

    @classmethod
    def parse(cls, values: list[str]) -> CacheSettings:
        """Parse Triton's ``--cache-config <cache>,<key>=<value>`` entries (only the ``local`` cache exists)."""
        size = 0
        for value in values:
            cache, _, setting = value.partition(",")
            if cache != "local":
                raise ValueError(f"--cache-config: unknown cache '{cache}' (fastoip has the 'local' cache)")
            key, _, raw = setting.partition("=")
            if key != "size":
                raise ValueError(f"--cache-config local: unknown setting '{key}' (expected size=<bytes>)")
            try:
                size = int(raw)
            except ValueError:
                raise ValueError(f"--cache-config local,size: expected a byte count, got '{raw}'") from None
            if size < 0:
                raise ValueError("--cache-config local,size must not be negative")
        return cls(size)


@dataclass
class _Entry:
    outputs: list[InferOutput]
    parameters: Parameters
    nbytes: int


@dataclass
class _InFlight:
    waiters: list[tuple[InferRequest, Waiter]] = field(default_factory=list)


def request_key(request: InferRequest, model_name: str, version: str, load: int = 0) -> bytes:
    """A digest of everything that decides the response (see the module rules); ``load`` tells one load of
    the model version from the next (a reload may bring other weights under the same name and version)."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{model_name}\0{version}\0{load}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{list(tensor.shape)}\0".encode())
        data = tensor.data
        if data is None:
            raise ValueError(f"input '{tensor.name}' has no data to key the cache on")
        if data.dtype == object:
            # BYTES: each element length-prefixed so ["ab", "c"] and ["a", "bc"] differ
            for element in data.reshape(-1):
                raw = element if isinstance(element, bytes) else str(element).encode()
                digest.update(len(raw).to_bytes(8, "little"))
                digest.update(raw)
        else:
            digest.update(np.ascontiguousarray(data).view(np.uint8).reshape(-1).data)
    for output in sorted(request.outputs, key=lambda o: o.name):
        digest.update(f"out\0{output.name}\0{sorted(output.parameters.items())!r}\0".encode())
    return digest.digest()


def _owned_copy(output: InferOutput) -> InferOutput:
    data = None
    if output.data is not None:
        data = np.array(output.data, copy=True)
        data.flags.writeable = False
    return InferOutput(output.name, output.datatype, output.shape, data, dict(output.parameters))


def _output_bytes(outputs: list[InferOutput]) -> int:
    total = 0
    for output in outputs:
        if output.data is None:
            continue
        if output.data.dtype == object:
            total += sum(len(e) if isinstance(e, bytes) else 64 for e in output.data.reshape(-1))
        else:
            total += output.data.nbytes
    return total


class ResponseCache:
    """An LRU map of request digests to responses, bounded in bytes, shared by every cached model."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._in_flight: dict[bytes, _InFlight] = {}
        self._used = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def claim(
        self, key: bytes, request: InferRequest, waiter: Waiter
    ) -> InferResponse | bool:
        """Look ``key`` up.

        Returns the cached response (a hit, shaped for ``request``); or True when the
        caller must run the request and later call :meth:`complete`; or False when an
        identical request is already running and ``waiter`` will be called with its result.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return self._response_for(request, entry)
            running = self._in_flight.get(key)
            if running is not None:
                running.waiters.append((request, waiter))
                return False
            self._in_flight[key] = _InFlight()
            return True

    def complete(
        self, key: bytes, response: InferResponse | None, error: BaseException | None, own_error: bool = False
    ) -> list[tuple[Waiter, InferResponse | None, BaseException | None]]:
        """The claimed request finished: store a success, and say what each waiter gets.

        The waiters are returned with their answers, not called, so the caller runs
        them outside any lock (and on the thread or loop it chooses).  ``own_error``: the
        error is the leader's alone (cancelled, past its deadline): the first waiter gets
        ``TAKE_OVER`` and is the key's leader now, the others keep waiting.
        """
        if own_error and error is not None:
            with self._lock:
                running = self._in_flight.get(key)
                if running is None or not running.waiters:
                    self._in_flight.pop(key, None)
                    return []
                _, first = running.waiters.pop(0)
            return [(first, None, TAKE_OVER)]
        entry = None
        if response is not None and error is None:
            outputs = [_owned_copy(o) for o in response.outputs]
            entry = _Entry(outputs, dict(response.parameters), _output_bytes(outputs))
        with self._lock:
            running = self._in_flight.pop(key, None)
            if entry is not None and entry.nbytes <= self.capacity_bytes:
                self._store(key, entry)
        if running is None:
            return []
        if entry is None:
            return [(waiter, None, error) for _, waiter in running.waiters]
        return [(waiter, self._response_for(request, entry), None) for request, waiter in running.waiters]

    def _store(self, key: bytes, entry: _Entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._used -= old.nbytes
        while self._entries and self._used + entry.nbytes > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._used -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = entry
        self._used += entry.nbytes

    @staticmethod
    def _response_for(request: InferRequest, entry: _Entry) -> InferResponse:
        outputs = [InferOutput(o.name, o.datatype, o.shape, o.data, dict(o.parameters)) for o in entry.outputs]
        return InferResponse(request.model_name, request.model_version, request.id, dict(entry.parameters), outputs)

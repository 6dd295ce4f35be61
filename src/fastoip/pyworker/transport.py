"""Tensors between the server and a Python worker process: shared memory for their bytes, not pickled copies.

Rules:
- An array of at least :data:`INLINE_LIMIT` bytes (numeric) is written once into
  shared memory by the side that sends it; the message carries only the
  segment's name, dtype and shape.  The receiver reads a numpy view on the
  mapping (no copy).
- Segments are reused: each has a one-byte busy flag in its first page; the
  sender sets it when it writes, and the receiver clears it when the last view
  on the data is gone (``weakref.finalize``), so a steady stream of tensors
  costs one copy each, not a new file and fresh pages each.  A sender's pooled
  segments total at most :func:`pool_limit` bytes (``--python-shm-pool``, passed
  to workers in ``FASTOIP_PYTHON_SHM_POOL``); past that (or for a tensor larger
  than the pool) a tensor goes into a one-shot file the receiver unlinks when it
  maps it.  Pooled segments idle for :data:`IDLE_S` are removed (and the
  receiver drops its mapping of a removed one), so an idle server keeps no
  ``/dev/shm`` for tensors.
- Names no client can guess: ``fastoip-pyw-<token>-<n>``, with a random
  128-bit token per process (the server's own, and one the server gives each
  worker at spawn, :func:`new_token` / :data:`TOKEN_ENV`).  A name that comes
  from the other side is checked against that pattern (with the worker's token
  on the server's side) before anything is opened or unlinked: no ``/``, no
  ``..``, nothing but a segment of that worker.  The files are ``0600``, opened
  with ``O_NOFOLLOW``; the shared-memory API refuses every ``fastoip-`` key
  (:mod:`fastoip.shared_memory`).
- No SIGBUS from tmpfs: a segment's pages are reserved when it is made
  (``posix_fallocate``); a full ``/dev/shm`` is :class:`SharedMemoryFull` for
  that tensor's request, never a fault later.  Every mapping is a
  :class:`~fastoip._shmguard.GuardedMapping`, so a peer that truncates a
  segment under the other side costs that request zero pages, not the process.
- Smaller numeric arrays travel inside the message as their raw bytes (a
  ``bytearray``), dtype and shape: pickling a numpy array costs ~10 us to dump
  and ~5 us to load, its bytes ~1 us (measured, 16 x FP32).  The receiver gets
  a writable array on those bytes.  Both ends are the codec's C
  (``pack_inline`` / ``unpack_inline``, ~0.1 us each), which checks that
  shape, dtype and byte count agree.  BYTES (object) arrays travel in the
  message in Triton's framing (each element a 4-byte little-endian length and
  its bytes; str elements as UTF-8), ``("t", bytes, shape)``: never pickled.
- What a message carries is checked when it is unpacked (the other process
  wrote it): the kind, the dtype (numeric only), the shape against the bytes.
- :data:`COPIED` counts the bytes each side copied into shared memory.
- A side that dies leaves its files behind; :func:`remove_files_of` removes a
  dead worker's files by its token (and forgets their mappings); a side that
  exits removes its own segments.
- The busy flag is a plain byte store and load: ordered on x86-64 (total store
  order); other architectures would need a fence.
"""

from __future__ import annotations

import atexit
import errno
import glob
import itertools
import os
import re
import secrets
import stat
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np

from .._codec import deserialize_bytes_tensor, pack_inline, serialize_bytes_tensor, unpack_inline
from .._shmguard import GuardedMapping
from ..datatypes import to_bytes_elements
from ..errors import InferenceError
from .channel import ProtocolError, RequestData, request_of

#: Arrays smaller than this travel in the message itself.
INLINE_LIMIT = 64 * 1024
#: Bytes before a segment's data (the busy flag is byte 0).
HEADER = 64
#: What every segment's name starts with (the shared-memory API refuses keys that do).
SEGMENT_PREFIX = "fastoip-pyw-"
#: The environment variable that gives a worker its token (set by the server at spawn, removed by the worker).
TOKEN_ENV = "FASTOIP_PYWORKER_TOKEN"
#: The environment variable that bounds each process's pooled segments (bytes; the server sets it for workers).
POOL_ENV = "FASTOIP_PYTHON_SHM_POOL"
#: Pooled bytes per process by default: the server and one worker fit a 64 MB /dev/shm (Docker's default)
#: with room for one-shot segments.
DEFAULT_POOL_BYTES = 16 * 1024 * 1024
#: A free pooled segment unused this long is removed; the receiver drops its mapping of it as soon.
IDLE_S = 1.0
#: Pooled segments of one peer mapped here at once: more than an honest pool of small segments holds (16 MiB of
#: 64 KiB ones is 256), so a worker that invents names cannot fill the SIGBUS guard's table.
PEER_MAPPINGS_LIMIT = 512
_SHM_DIR = "/dev/shm"
_TOKEN = re.compile(r"[0-9a-f]{32}")
_ANY_SEGMENT = re.compile(re.escape(SEGMENT_PREFIX) + r"[0-9a-f]{32}-[0-9]{1,19}")
_counter = itertools.count()
_lock = threading.Lock()


class SharedMemoryFull(Exception):
    """No room in /dev/shm for a tensor's segment: that request fails, nothing else does."""


class _Counter:
    def __init__(self) -> None:
        self.bytes_to_shm = 0
        self.arrays_to_shm = 0
        self.arrays_inline = 0
        self.segments_made = 0


COPIED = _Counter()


def new_token() -> str:
    """A fresh, unguessable segment token (for a worker about to be spawned)."""
    return secrets.token_hex(16)


def _own_token() -> str:
    given = os.environ.pop(TOKEN_ENV, "")  # (a worker's own children do not inherit it)
    return given if _TOKEN.fullmatch(given) else new_token()


def _pool_limit_from_environment() -> int:
    try:
        return max(0, int(os.environ.get(POOL_ENV, DEFAULT_POOL_BYTES)))
    except ValueError:
        return DEFAULT_POOL_BYTES


#: This process's token: its segments are ``fastoip-pyw-<token>-<n>``.
TOKEN = _own_token()
_pool_limit = _pool_limit_from_environment()


def pool_limit() -> int:
    """The most bytes this process keeps in pooled segments."""
    return _pool_limit


def set_pool_limit(nbytes: int) -> None:
    """Bound this process's pooled segments (and, through the environment, those of workers spawned later)."""
    global _pool_limit
    _pool_limit = max(0, nbytes)
    os.environ[POOL_ENV] = str(_pool_limit)


def is_segment_name(key: str) -> bool:
    """Whether ``key`` (a /dev/shm name) could be one of fastoip's tensor segments."""
    return key.startswith(SEGMENT_PREFIX)


class _Segment:
    __slots__ = ("name", "region", "flag", "capacity", "used_at")

    def __init__(self, name: str, region: GuardedMapping, capacity: int) -> None:
        self.name = name
        self.region = region
        self.flag = memoryview(region)  # byte 0: busy
        self.capacity = capacity
        self.used_at = time.monotonic()

    def remove(self) -> None:
        """Give the pages back and unlink the file (free: no view on it on either side).

        Truncated first: the receiver may still map it (it drops the mapping within IDLE_S, see _trim), and
        a mapping would keep the pages of a file that is only unlinked."""
        path = os.path.join(_SHM_DIR, self.name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError:
            pass


#: This process's segments, for reuse, and their bytes.
_pool: list[_Segment] = []
_pool_bytes = 0
#: Segments of other processes this one maps (by name).
_mapped: dict[str, GuardedMapping] = {}
#: Whether the thread that removes idle segments runs.
_trimming = False


#: python_backend's words when its shared memory cannot grow (Triton's QA matches them).
NO_ROOM = "Failed to increase the shared memory pool size"


def _new_file(size: int) -> tuple[str, GuardedMapping]:
    """A new segment of ``size`` bytes, every page reserved (a full /dev/shm fails here, not with SIGBUS later)."""
    name = f"{SEGMENT_PREFIX}{TOKEN}-{next(_counter)}"
    path = os.path.join(_SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise
            raise SharedMemoryFull(
                f"{NO_ROOM}: no room in {_SHM_DIR} for a tensor of {size - HEADER} bytes between the server and a "
                f"Python model's worker ({os.strerror(exc.errno)}); give {_SHM_DIR} more space (docker run --shm-size, "
                "a Kubernetes emptyDir with medium: Memory) or send smaller tensors",
            ) from None
        region = GuardedMapping(fd, size, False)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    COPIED.segments_made += 1
    return name, region


def _evict_free() -> bool:
    """Remove every free pooled segment (the lock is held): whether any was."""
    global _pool_bytes
    free = [s for s in _pool if s.flag[0] == 0]
    for segment in free:
        _pool.remove(segment)
        _pool_bytes -= HEADER + segment.capacity
        segment.remove()
    return bool(free)


def _new_file_making_room(size: int, locked: bool) -> tuple[str, GuardedMapping]:
    """:func:`_new_file`; when /dev/shm is full, this process's free pooled segments go first and it tries once
    more (idle before busy: a pool must never be why a request fails)."""
    try:
        return _new_file(size)
    except SharedMemoryFull:
        if locked:
            evicted = _evict_free()
        else:
            with _lock:
                evicted = _evict_free()
        if not evicted:
            raise
    return _new_file(size)


def _take_segment(nbytes: int) -> tuple[str, GuardedMapping, memoryview, bool]:
    """A free pooled segment that fits (marked busy), else a new one: ``(name, region, view, pooled)``."""
    global _pool_bytes
    with _lock:
        for segment in _pool:
            if segment.capacity >= nbytes and segment.flag[0] == 0:
                segment.flag[0] = 1
                segment.used_at = time.monotonic()
                return segment.name, segment.region, segment.flag, True
        capacity = 1 << max(16, (nbytes - 1).bit_length())
        if HEADER + capacity <= _pool_limit:
            # Room for it: free segments go first (idle before busy), the busy ones stay.
            for segment in [s for s in _pool if s.flag[0] == 0]:
                if _pool_bytes + HEADER + capacity <= _pool_limit:
                    break
                _pool.remove(segment)
                _pool_bytes -= HEADER + segment.capacity
                segment.remove()
            if _pool_bytes + HEADER + capacity <= _pool_limit:
                name, region = _new_file_making_room(HEADER + capacity, True)
                segment = _Segment(name, region, capacity)
                segment.flag[0] = 1
                _pool.append(segment)
                _pool_bytes += HEADER + capacity
                _start_trimming()
                return name, region, segment.flag, True
    name, region = _new_file_making_room(HEADER + nbytes, False)
    return name, region, memoryview(region), False


def _start_trimming() -> None:
    """Start the thread that removes idle segments, unless it runs (the lock is held)."""
    global _trimming
    if not _trimming:
        _trimming = True
        threading.Thread(target=_trim, name="fastoip-shm-trim", daemon=True).start()


def _trim() -> None:
    """Every IDLE_S: remove own segments idle that long, drop mappings of the other side's removed ones.

    Ends when nothing is left to watch (started again with the next segment)."""
    global _pool_bytes, _trimming
    while True:
        time.sleep(IDLE_S)
        with _lock:
            now = time.monotonic()
            for segment in [s for s in _pool if s.flag[0] == 0 and now - s.used_at >= IDLE_S]:
                _pool.remove(segment)
                _pool_bytes -= HEADER + segment.capacity
                segment.remove()
            names = list(_mapped)
        # (a stat each, off the lock: the other side removed it, so its pages go once this mapping does)
        gone = [name for name in names if not os.path.exists(os.path.join(_SHM_DIR, name))]
        with _lock:
            for name in gone:
                _mapped.pop(name, None)  # unmapped when the last view on it is gone
            if not _pool and not _mapped:
                _trimming = False
                return


def pack(array: np.ndarray) -> tuple:
    """What goes into a message for ``array`` (:class:`SharedMemoryFull` when /dev/shm has no room for it)."""
    # A small array's bytes go into the message (one copy, in C order whatever its strides; no numpy pickling);
    # every numeric one when there is no shared memory.
    packed = pack_inline(array, INLINE_LIMIT)
    if packed is None and not array.dtype.hasobject and not os.path.isdir(_SHM_DIR):
        packed = pack_inline(array, sys.maxsize)
    if packed is not None:
        COPIED.arrays_inline += 1
        return packed
    dtype = array.dtype
    if dtype.hasobject:
        COPIED.arrays_inline += 1
        try:
            framed = serialize_bytes_tensor(array)
        except (TypeError, ValueError):  # elements that are neither bytes nor str: as Triton, their str()
            framed = serialize_bytes_tensor(to_bytes_elements(array))
        return ("t", framed, array.shape)
    segment, _, view, pooled = _take_segment(array.nbytes)
    # The one copy of these bytes on their way across (the receiver maps them); the pages are reserved.
    # (A one-shot segment is unmapped on return; its file stays for the receiver.)
    np.frombuffer(view, dtype=dtype, count=array.size, offset=HEADER).reshape(array.shape)[...] = array
    COPIED.bytes_to_shm += array.nbytes
    COPIED.arrays_to_shm += 1
    return ("p" if pooled else "s", segment, dtype.str, array.shape)


def _release(flag: memoryview) -> None:
    flag[0] = 0  # the sender may reuse the segment


def _checked_name(name: Any, token: str | None) -> str:
    """``name`` when it is a segment of the peer with ``token`` (of any fastoip process when None), else ValueError."""
    if type(name) is str:
        if token is None:
            if _ANY_SEGMENT.fullmatch(name):
                return name
        else:
            number = name[len(SEGMENT_PREFIX) + 33 :]
            if (
                name.startswith(SEGMENT_PREFIX)
                and name[len(SEGMENT_PREFIX) : len(SEGMENT_PREFIX) + 33] == token + "-"
                and 0 < len(number) < 20
                and number.isascii()
                and number.isdigit()
            ):
                return name
    raise ValueError(f"not a tensor segment of this worker: {str(name)[:80]!r}")


def _map_segment(name: str, unlink: bool) -> GuardedMapping:
    path = os.path.join(_SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size <= HEADER:
            raise ValueError(f"tensor segment {name!r} is not a segment (a regular file of this user's)")
        return GuardedMapping(fd, info.st_size, False)
    finally:
        os.close(fd)
        if unlink:
            os.unlink(path)


def _shape(value: Any) -> tuple:
    if type(value) is not list and type(value) is not tuple:
        raise ProtocolError(f"a tensor's shape is not a list of sizes: {value!r}")
    for n in value:
        if type(n) is not int or n < 0:
            raise ProtocolError(f"a tensor's shape is not a list of sizes: {value!r}")
    return tuple(value)


def unpack(packed: Any, token: str | None = None) -> np.ndarray:
    """The array a message carries (a read-only view on shared memory for large ones); ProtocolError (a
    ValueError) when it is not one of :func:`pack`'s forms.

    ``token``: the sending worker's, on the server's side; a name that is not one of its segments is refused
    (ValueError) before anything is opened.
    """
    if (type(packed) is not list and type(packed) is not tuple) or not packed:
        raise ProtocolError("a packed tensor is a tagged list")
    kind = packed[0]
    if kind == "b" and len(packed) == 4:
        data = packed[1]
        if type(data) is bytes:  # (msgpack gives bytes: the array is writable on a bytearray, the model may write)
            data = bytearray(data)
        try:  # (the codec checks the parts: a bytearray, a dtype name, sizes that agree with the bytes)
            return unpack_inline(("b", data, packed[2], tuple(packed[3])))
        except (TypeError, ValueError) as bad:
            raise ProtocolError(f"not a packed tensor: {bad}") from None
    if kind == "t" and len(packed) == 3 and isinstance(packed[1], (bytes, bytearray)):
        shape = _shape(packed[2])
        try:
            elements = deserialize_bytes_tensor(packed[1], int(np.prod(shape)) if shape else 1)
        except InferenceError as codec_error:  # (the codec's CodecError: a length that lies)
            raise ProtocolError(f"a BYTES tensor's framing is broken: {codec_error}") from None
        return elements.reshape(shape)
    if kind not in ("p", "s") or len(packed) != 4 or not isinstance(packed[1], str) or not isinstance(packed[2], str):
        raise ProtocolError(f"not a packed tensor (kind {kind!r})")
    dtype = packed[2]
    shape = _shape(packed[3])  # (one binding of shape per function: mypyc types it once)
    if np.dtype(dtype).hasobject:
        raise ProtocolError(f"a tensor in shared memory cannot hold objects (dtype {dtype!r})")
    name = _checked_name(packed[1], token)  # (before anything is opened: a name the peer may not use is refused)
    region = _mapped.get(name) if kind == "p" else None
    if region is None:
        if kind == "p" and token is not None:
            prefix = name[: len(SEGMENT_PREFIX) + 33]
            if sum(1 for known in list(_mapped) if known.startswith(prefix)) >= PEER_MAPPINGS_LIMIT:
                raise ValueError(f"the worker has {PEER_MAPPINGS_LIMIT} pooled segments mapped here, the most it may")
        region = _map_segment(name, kind == "s")
        if kind == "p":
            with _lock:
                _mapped[name] = region
                _start_trimming()
    count = int(np.prod(shape)) if shape else 1
    view = memoryview(region)
    flat = np.frombuffer(view, dtype=np.dtype(dtype), count=count, offset=HEADER)
    flat.flags.writeable = False
    if kind == "p":
        weakref.finalize(flat, _release, view)
    return flat.reshape(shape)


def discard(packed: tuple) -> None:
    """Give back the segment of a packed array (of this process's) that will never be unpacked."""
    if packed[0] == "s":
        try:
            os.unlink(os.path.join(_SHM_DIR, _checked_name(packed[1], TOKEN)))
        except (FileNotFoundError, ValueError):
            pass
    elif packed[0] == "p":
        with _lock:
            for segment in _pool:
                if segment.name == packed[1]:
                    segment.flag[0] = 0


def pack_tensors(tensors: list) -> list:
    """Every tensor packed, or none: what was packed before a failure (a full /dev/shm) is given back."""
    packed: list = []
    try:
        for name, datatype, array in tensors:
            packed.append((name, datatype, pack(np.asarray(array))))
    except BaseException:
        for _, _, tensor in packed:
            discard(tensor)
        raise
    return packed


def unpack_tensors(tensors: Any, token: str | None = None) -> list:
    if type(tensors) is not list and type(tensors) is not tuple:
        raise ProtocolError("tensors are a list of (name, datatype, packed tensor)")
    out = []
    for item in tensors:
        if len(item) != 3 or type(item[0]) is not str or type(item[1]) is not str:
            raise ProtocolError("a tensor is (name, datatype, packed tensor)")
        out.append((item[0], item[1], unpack(item[2], token)))
    return out


def remove_files_of(token: str) -> None:
    """Remove what a dead worker (by its token) left in shared memory, and forget its segments' mappings."""
    if not _TOKEN.fullmatch(token):
        return
    prefix = f"{SEGMENT_PREFIX}{token}-"
    with _lock:
        for name in [n for n in _mapped if n.startswith(prefix)]:
            del _mapped[name]  # unmapped when the last view on it is gone
    for path in glob.glob(os.path.join(_SHM_DIR, prefix + "*")):
        try:
            os.unlink(path)
        except OSError:
            pass


#: The process whose segments these are: a forked child gets its own token and pool (see _after_fork).
_owner_pid = os.getpid()


@atexit.register
def _remove_own_segments() -> None:
    if os.getpid() == _owner_pid:
        remove_files_of(TOKEN)


def _after_fork() -> None:
    """In a forked child: the parent's segments stay the parent's (never reused, removed or named again here)."""
    global TOKEN, _owner_pid, _pool_bytes, _trimming, _lock
    TOKEN = new_token()
    _owner_pid = os.getpid()
    _pool.clear()
    _pool_bytes = 0
    _mapped.clear()
    _trimming = False  # (the thread did not come along)
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def pack_request(data: Any) -> RequestData:
    request_id, correlation_id, flags, parameters, inputs, requested, trace = data
    return RequestData(request_id, correlation_id, flags, parameters, pack_tensors(inputs), requested, trace)


def pack_requests(requests: list) -> list:
    """Several requests packed, or none (as :func:`pack_tensors`)."""
    packed: list = []
    try:
        for data in requests:
            packed.append(pack_request(data))
    except BaseException:
        for request in packed:
            for _, _, tensor in request[4]:
                discard(tensor)
        raise
    return packed


def unpack_request(data: Any, token: str | None = None) -> RequestData:
    """A request the other side packed, its tensors unpacked (ProtocolError when it is not one)."""
    request = request_of(data)
    # (built whole: NamedTuple._replace costs a dict and a _make, ~1 us on the per-call path)
    return RequestData(request[0], request[1], request[2], request[3], unpack_tensors(request[4], token), request[5],
                       request[6])


def pack_response(data: Any) -> Any:
    if data is None:
        return None
    outputs, error, parameters = data
    return (pack_tensors(outputs), error, parameters)


def unpack_response(data: Any, token: str | None = None) -> Any:
    """``(outputs, error (code, message) or None, parameters)`` the other side packed (ProtocolError when it is
    not one)."""
    if data is None:
        return None
    try:
        outputs, error, parameters = data
    except (TypeError, ValueError):
        raise ProtocolError("a response is (outputs, error, parameters)") from None
    if error is not None:
        if (type(error) is not list and type(error) is not tuple) or len(error) != 2 or type(error[0]) is not int or (
            type(error[1]) is not str
        ):
            raise ProtocolError("a response's error is (code, message)")
        error = (error[0], error[1])
    if type(parameters) is not dict:
        raise ProtocolError("a response's parameters are a dict")
    return (unpack_tensors(outputs, token), error, parameters)

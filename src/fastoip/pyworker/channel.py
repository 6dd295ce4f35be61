"""Every message between the server and a Python worker process: typed records, one encoding, no pickle.

Rules:
- Each message is a ``NamedTuple`` below; :data:`TO_WORKER` and :data:`TO_SERVER`
  list which way each goes (python_backend's ``ipc_message.h`` has one command
  enum; MLServer's ``parallel/messages.py`` typed messages).  Each side
  dispatches on the record's type through one table.
- A record is one MessagePack array ``[tag, field, ...]`` (``msgpack``: data
  only, so a worker's bytes never run code in the server, as ``pickle.loads``
  would).  Fields are plain data: None, bool, int, float, str, bytes, lists,
  str-keyed dicts; numpy scalars become Python ones; anything else is refused
  when it is sent (a model's parameter that is not plain data fails its
  request, it does not travel as an object).
- Tensors inside requests and responses are :mod:`.transport`'s packed forms
  (raw bytes, a shared-memory segment, or a BYTES tensor in Triton's
  4-byte-length-prefixed framing), checked when they are unpacked.
- :func:`decode` checks what the other side sent: a known tag, the record's
  arity and each field's type (:data:`_FIELDS`).  A frame that fails is a
  :class:`ProtocolError`: the server ends that worker (it restarts) and logs why.
- Several records the event loop hands over in one turn travel as one
  :class:`Many` (one encoding, one frame).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import msgpack
import numpy as np


class ProtocolError(ValueError):
    """A frame the other side sent is not a record of this protocol."""


# -- the request and response as they cross -------------------------------------------------------------------
class RequestData(NamedTuple):
    """A request as plain data (both sides; a BLS request too)."""

    request_id: str
    #: Triton's sequence id: int or str (0: none)
    correlation_id: Any
    flags: int
    parameters: dict
    #: ``[(name, datatype, array)]``, packed (:func:`.transport.pack`) while it crosses
    inputs: list
    #: the requested outputs' names (an MLServer runtime's: ``(name, parameters)``)
    requested: list
    #: ``(trace id, W3C context dict)`` of the request's trace in the server, or None
    trace: Any


# -- server -> worker -----------------------------------------------------------------------------------------
class Load(NamedTuple):
    """Import a ``TritonPythonModel`` (answered by :class:`Done` or :class:`Failed`)."""

    path: str
    name: str
    version: int
    memory_limit_mb: int


class LoadMLServer(NamedTuple):
    """Import and load an MLServer runtime (``backends.python.mlserver.process.runtime_spec``)."""

    spec: dict
    memory_limit_mb: int


class AutoComplete(NamedTuple):
    config: dict


class Initialize(NamedTuple):
    args: dict
    decoupled: bool


class Execute(NamedTuple):
    """A batch: answered by a :class:`Result` (and :class:`Send` for a decoupled model)."""

    exec_id: int
    requests: list


class Reply(NamedTuple):
    """The answer to one of the worker's calls: ``value``, or ``error`` (the call failed)."""

    call_id: int
    value: Any
    error: str | None


class StreamPart(NamedTuple):
    """One response of a BLS stream (``response`` None: the end without a response)."""

    call_id: int
    response: Any
    final: bool


class Finalize(NamedTuple):
    pass


class Many(NamedTuple):
    """Records sent together (an event loop's turn), read one at a time."""

    records: list


# -- worker -> server -----------------------------------------------------------------------------------------
class Done(NamedTuple):
    """A control message's answer (auto-complete: the completed config)."""

    value: Any


class Failed(NamedTuple):
    """A control message failed: the model's words."""

    message: str


class Result(NamedTuple):
    """A batch's responses (None for a decoupled model), or the error that failed all of it; ``rescheduled``: the
    indices of the requests the model released with RESCHEDULE (they are not answered: they run again)."""

    exec_id: int
    responses: Any
    error: str | None
    rescheduled: list


class Send(NamedTuple):
    """A decoupled model's response to request ``request_index`` of batch ``exec_id``."""

    exec_id: int
    request_index: int
    response: Any
    final: bool


class InferCall(NamedTuple):
    """A BLS request; ``stream``: its responses come as :class:`StreamPart`, else one :class:`Reply`."""

    call_id: int
    model: str
    version: Any
    request: Any
    timeout_us: int
    stream: bool


class CancelStream(NamedTuple):
    """``ResponseIterator.cancel()`` of the BLS stream ``call_id``."""

    call_id: int


class CancelledQuery(NamedTuple):
    """``request.is_cancelled()`` of request ``request_index`` of batch ``exec_id``."""

    call_id: int
    exec_id: int
    request_index: int


class ReadyQuery(NamedTuple):
    call_id: int
    name: str
    version: str


class LoadModel(NamedTuple):
    call_id: int
    name: str
    config: str
    files: Any


class UnloadModel(NamedTuple):
    call_id: int
    name: str
    unload_dependents: bool


class MetricUpdate(NamedTuple):
    """A custom metric's operation; ``call_id`` 0: nobody waits for the value."""

    call_id: int
    family: dict
    labels: dict
    op: str
    value: float


class Log(NamedTuple):
    level: int
    message: str


class RingBell(NamedTuple):
    """Results wait in the ring (the server takes the ring before every message)."""


class SegmentWanted(NamedTuple):
    """A new shared-memory segment for ``nbytes`` the worker will write (:mod:`.segments`): answered by a
    :class:`Reply` whose value is ``[index, size, pooled]``, its descriptor sent before on the handover socket."""

    call_id: int
    nbytes: int


# -- the readiness socket (a second socket pair: asked while execute runs, as the stub's monitor thread answers) --
class ReadinessCheck(NamedTuple):
    """Run the model's own ``is_ready()`` (answered by :class:`Readiness`)."""


class Readiness(NamedTuple):
    """What the model's ``is_ready()`` said: ``defined`` (False: it has none, so it is ready, and it is not asked
    again), ``ready``, or the ``error`` it raised (or its non-bool answer) in python_backend's words."""

    defined: bool
    ready: bool
    error: str | None


TO_WORKER: tuple[type, ...] = (Load, LoadMLServer, AutoComplete, Initialize, Execute, Reply, StreamPart, Finalize, Many)
TO_SERVER: tuple[type, ...] = (
    Done, Failed, Result, Send, InferCall, CancelStream, CancelledQuery, ReadyQuery, LoadModel, UnloadModel,
    MetricUpdate, Log, RingBell, SegmentWanted,
)
#: What each side reads on the readiness socket.
READINESS_TO_WORKER: tuple[type, ...] = (ReadinessCheck,)
READINESS_TO_SERVER: tuple[type, ...] = (Readiness,)
_TAGS: dict[type, int] = {
    cls: tag for tag, cls in enumerate((*TO_WORKER, *TO_SERVER, *READINESS_TO_WORKER, *READINESS_TO_SERVER))
}
_BY_TAG: dict[int, type] = {tag: cls for cls, tag in _TAGS.items()}
_NONE = type(None)
_ANY = object
_ID = int
#: Each record's field types, checked when decoded (nested data is checked where it is used: transport.unpack).
#: msgpack makes exact types (int, float, str, bytes, list, dict, bool, None): a field's type is compared, not
#: ``isinstance``-checked (a bool is not an int here).
_FIELDS: dict[type, tuple[Any, ...]] = {
    Load: (str, str, int, int),
    LoadMLServer: (dict, int),
    AutoComplete: (dict,),
    Initialize: (dict, bool),
    Execute: (_ID, list),
    Reply: (_ID, _ANY, (str, _NONE)),
    StreamPart: (_ID, _ANY, bool),
    Finalize: (),
    Many: (list,),
    Done: (_ANY,),
    Failed: (str,),
    Result: (_ID, (list, _NONE), (str, _NONE), list),
    Send: (_ID, int, (list, _NONE), bool),
    InferCall: (_ID, str, (str, int, _NONE), list, int, bool),
    CancelStream: (_ID,),
    CancelledQuery: (_ID, _ID, int),
    ReadyQuery: (_ID, str, str),
    LoadModel: (_ID, str, str, (dict, _NONE)),
    UnloadModel: (_ID, str, bool),
    MetricUpdate: (_ID, dict, dict, str, (float, int)),
    Log: (int, str),
    RingBell: (),
    SegmentWanted: (_ID, int),
    ReadinessCheck: (),
    Readiness: (bool, bool, (str, _NONE)),
}


def _exact(expected: Any) -> frozenset[type] | None:
    if expected is _ANY:
        return None
    return frozenset(expected if isinstance(expected, tuple) else (expected,))


#: :data:`_FIELDS` as the sets of exact types the decoder compares with (None: anything).
_CHECKS: dict[type, tuple[frozenset[type] | None, ...]] = {
    cls: tuple(_exact(expected) for expected in types) for cls, types in _FIELDS.items()
}


def _plain(value: Any) -> Any:
    """msgpack's hook for what it does not know: numpy scalars and arrays of plain values; nothing else."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} cannot cross to the other process (plain data only)")


_packers = threading.local()


def _packer() -> Any:
    """This thread's packer (a Packer keeps a buffer: one per thread, none made per message)."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(default=_plain, use_bin_type=True, autoreset=True)
    return packer


def encode(record: tuple) -> bytes:
    """One record as the bytes of one frame (TypeError for a field that is not plain data)."""
    packer = _packer()
    try:
        if type(record) is Many:
            tagged = [[_TAGS[type(item)], *item] for item in record[0]]
            return packer.pack([_TAGS[Many], tagged])
        return packer.pack([_TAGS[type(record)], *record])
    except BaseException:
        packer.reset()  # (what a failed pack left in its buffer must not start the next frame)
        raise


#: Per set of records a reader takes (by the tuple's identity): tag -> (record class, its field checks).
_TABLES: dict[int, dict[int, tuple[type, tuple[frozenset[type] | None, ...]]]] = {}


def _table(allowed: tuple[type, ...]) -> dict[int, tuple[type, tuple[frozenset[type] | None, ...]]]:
    table = _TABLES.get(id(allowed))
    if table is None:
        table = {_TAGS[cls]: (cls, _CHECKS[cls]) for cls in allowed}
        _TABLES[id(allowed)] = table
        _KEPT.append(allowed)  # (its id stays its own)
    return table


_KEPT: list[tuple[type, ...]] = []


def _decoded(raw: Any, allowed: tuple[type, ...]) -> tuple:
    if type(raw) is not list or not raw:
        raise ProtocolError("a frame is not a tagged record")
    tag = raw[0]
    entry = _table(allowed).get(tag) if type(tag) is int else None
    if entry is None:
        if type(tag) is not int:
            raise ProtocolError("a frame is not a tagged record")
        raise ProtocolError(f"unknown or misdirected record tag {tag!r}")
    cls, checks = entry
    if len(raw) != len(checks) + 1:
        raise ProtocolError(f"a {cls.__name__} has {len(checks)} fields, not {len(raw) - 1}")
    index = 1
    for allowed_types in checks:
        if allowed_types is not None and type(raw[index]) not in allowed_types:
            raise ProtocolError(f"a {cls.__name__} field is a {type(raw[index]).__name__}")
        index += 1
    if cls is Many:
        return Many([_decoded(item, allowed) for item in raw[1]])
    return cls(*raw[1:])


def _unpackb(data: bytes | bytearray) -> Any:
    # (its defaults are the strict ones: str keys only, str as str, arrays as lists, sizes bounded by the data)
    return msgpack.unpackb(data)


def decode(data: bytes | bytearray, allowed: tuple[type, ...]) -> tuple:
    """The record in one frame, one of ``allowed`` (:data:`TO_SERVER` where the server reads): ProtocolError
    for anything else."""
    try:
        raw = _unpackb(data)
    except Exception as exc:  # msgpack's errors for bad bytes are several classes (and ValueError)
        raise ProtocolError(f"not a record: {type(exc).__name__}: {exc}") from None
    return _decoded(raw, allowed)


def request_of(value: Any) -> RequestData:
    """A :class:`RequestData` decoded from the other side (ProtocolError when its fields are not one's)."""
    if type(value) is RequestData:
        return value
    if type(value) is not list or len(value) != 7:
        raise ProtocolError("a request is 7 fields")
    correlation_id = value[1]
    if (
        type(value[0]) is not str
        or (type(correlation_id) is not int and type(correlation_id) is not str)
        or type(value[2]) is not int
        or type(value[3]) is not dict
        or type(value[4]) is not list
        or type(value[5]) is not list
    ):
        raise ProtocolError("a request's fields are not (str, int | str, int, dict, list, list, trace)")
    return RequestData(value[0], correlation_id, value[2], value[3], value[4], value[5], value[6])

"""Model warmup (Triton's ``model_warmup``): requests run at load, before the model turns READY.

Rules (Triton's ``model_configuration.md``, "Model Warmup"):
- Each entry names inputs by data type and dims (without the batch dimension);
  a batching model gets ``batch_size`` (at least 1) prepended, a model without
  batching must have ``batch_size`` 0 or 1.
- Data is ``zero_data``, ``random_data`` or ``input_data_file``: a file in the
  model's ``warmup/`` folder holding the tensor's raw little-endian bytes (BYTES
  tensors: each element as a 4-byte length and its bytes).  The file must stay
  inside that folder.
- Each entry runs ``count`` times (at least once) through the model's own
  scheduler; any failure fails the load with the entry's name and the reason.
- Issue 37: a config that came through the load API may ask for at most
  ``CLIENT_WARMUP_COUNT`` runs of an entry and ``CLIENT_WARMUP_BYTES`` of
  warmup data per entry (``check_client_warmup``: from the dims, before any
  session or tensor is built;
  BYTES elements count ``BYTES_ELEMENT_COST`` each, what Python objects cost).
  Every load's warmup stops between runs when ``check_stop`` raises (the server
  is shutting down, or the load's client went away), so a long warmup never
  holds SIGTERM or the load lock for a client that left.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from .._proto import model_config_pb2 as mc
from ..datatypes import CONFIG_TO_V2, NUMPY_DTYPES
from ..errors import InferenceError, InvalidArgument
from ..types import InferInput, InferRequest, InferResponse

WARMUP_FOLDER = "warmup"
#: Runs of one warmup entry a load through the API may ask for (Triton: any uint32; 2e9 held the load lock for ever).
CLIENT_WARMUP_COUNT = 1000
#: Bytes of warmup data one entry of a load through the API may build (a 1.5 KB config built +855 MB).
CLIENT_WARMUP_BYTES = 64 * 1024 * 1024
#: What one BYTES element costs as a Python object in an object array, about.
BYTES_ELEMENT_COST = 64


class WarmupTarget(Protocol):
    """What warmup needs of a loaded model: its name and a blocking run of one request."""

    name: str

    def run_blocking(self, request: InferRequest) -> InferResponse: ...


def check_client_warmup(config: mc.ModelConfig) -> None:
    """Refuse a load-API config whose warmup asks for more runs or data than a client may (nothing is built)."""
    for entry in config.model_warmup:
        label = entry.name or "(unnamed)"
        if entry.count > CLIENT_WARMUP_COUNT:
            raise InvalidArgument(
                f"model_warmup '{label}': count {entry.count}; a load through the API may ask for at most "
                f"{CLIENT_WARMUP_COUNT} runs of an entry"
            )
        entry_bytes = 0
        for name, spec in sorted(entry.inputs.items()):
            shape = [max(entry.batch_size, 1), *spec.dims]
            elements = math.prod(max(d, 0) for d in shape)
            datatype = CONFIG_TO_V2.get(mc.DataType.Name(spec.data_type))
            cost = BYTES_ELEMENT_COST if datatype in (None, "BYTES") else NUMPY_DTYPES[datatype].itemsize
            entry_bytes += elements * cost
            if entry_bytes > CLIENT_WARMUP_BYTES:
                raise InvalidArgument(
                    f"model_warmup '{label}': input '{name}' of dims {list(spec.dims)} takes the entry's data past "
                    f"{CLIENT_WARMUP_BYTES} bytes, the most a load through the API may ask for"
                )


def warmup_requests(config: mc.ModelConfig, model_dir: Path) -> list[tuple[str, InferRequest, int]]:
    """(entry name, request, repetitions) for each ``model_warmup`` entry, validated."""
    requests = []
    for entry in config.model_warmup:
        label = entry.name or "(unnamed)"
        if config.max_batch_size == 0 and entry.batch_size > 1:
            raise InvalidArgument(
                f"model_warmup '{label}': batch_size {entry.batch_size} for a model that does not batch"
            )
        if config.max_batch_size > 0 and entry.batch_size > config.max_batch_size:
            raise InvalidArgument(
                f"model_warmup '{label}': batch_size {entry.batch_size} exceeds max_batch_size {config.max_batch_size}"
            )
        batch = [max(entry.batch_size, 1)] if config.max_batch_size > 0 else []
        inputs = []
        for name, spec in sorted(entry.inputs.items()):
            shape = tuple(batch + list(spec.dims))
            if any(d < 0 for d in shape):
                raise InvalidArgument(
                    f"model_warmup '{label}': input '{name}' dims must be fixed, got {list(spec.dims)}"
                )
            datatype = CONFIG_TO_V2.get(mc.DataType.Name(spec.data_type))
            if datatype is None:
                raise InvalidArgument(f"model_warmup '{label}': input '{name}' has no data type")

            inputs.append(InferInput(name, datatype, shape, _data(label, name, spec, datatype, shape, model_dir)))
        requests.append((label, InferRequest(config.name, inputs=inputs, id=f"warmup:{label}"), max(entry.count, 1)))
    return requests


def run_warmup(model: WarmupTarget, config: mc.ModelConfig, model_dir: Path,
               check_stop: Callable[[], None] = lambda: None) -> None:
    """Run every warmup entry; raise InvalidArgument naming the entry when one fails, and whatever ``check_stop()``
    raises between runs (the load must stop), naming the entry."""
    for label, request, count in warmup_requests(config, model_dir):
        for _ in range(count):
            try:
                check_stop()
            except InferenceError as exc:
                raise type(exc)(f"model_warmup '{label}' stopped: {exc.message}") from None
            try:
                model.run_blocking(request)
            except InferenceError as exc:
                raise InvalidArgument(f"model_warmup '{label}' failed: {exc.message}") from exc


def _data(
    label: str, name: str, spec: mc.ModelWarmup.Input, datatype: str, shape: tuple[int, ...], model_dir: Path
) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    dtype = NUMPY_DTYPES[datatype]
    choice = spec.WhichOneof("input_data_type")
    if choice == "input_data_file":
        return _from_file(label, name, spec.input_data_file, datatype, shape, count, model_dir)
    if datatype == "BYTES":
        if choice == "random_data":
            rng = np.random.default_rng()
            items = [str(v).encode() for v in rng.integers(0, 10**6, count)]
        else:
            items = [b""] * count
        return np.array(items, dtype=object).reshape(shape)
    if choice == "random_data":
        rng = np.random.default_rng()
        if dtype.kind == "f":
            return rng.random(count).astype(dtype).reshape(shape)
        if dtype.kind == "b":
            return rng.integers(0, 2, count).astype(dtype).reshape(shape)
        return rng.integers(0, 100, count).astype(dtype).reshape(shape)
    return np.zeros(shape, dtype=dtype)


def _from_file(
    label: str, name: str, filename: str, datatype: str, shape: tuple[int, ...], count: int, model_dir: Path
) -> np.ndarray:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / filename).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise InvalidArgument(
            f"model_warmup '{label}': input '{name}': input_data_file '{filename}' is not a file in the model's "
            f"'{WARMUP_FOLDER}' folder"
        )
    raw = path.read_bytes()
    if datatype == "BYTES":
        items: list[bytes] = []
        offset = 0
        while offset < len(raw) and len(items) < count:
            if offset + 4 > len(raw):
                break
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4
            if offset + length > len(raw):
                break
            items.append(raw[offset : offset + length])
            offset += length
        if len(items) != count:
            raise InvalidArgument(
                f"model_warmup '{label}': input '{name}': '{filename}' holds {len(items)} complete BYTES elements, "
                f"expected {count}"
            )
        return np.array(items, dtype=object).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) < expected:
        raise InvalidArgument(
            f"model_warmup '{label}': input '{name}': '{filename}' has {len(raw)} bytes, expected {expected}"
        )
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

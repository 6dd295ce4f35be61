"""System shared-memory regions (Triton's system_shared_memory extension).

Rules:
- A region is a POSIX shared-memory object (``shm_open(key)``, i.e.
  ``/dev/shm/<key>``) mapped once at registration; ``offset`` and
  ``byte_size`` delimit the part the client lends to the server.
- Inputs read from a region are numpy views on the mapping (no copy).
  Outputs are copied into the region (the one output copy), unless the backend
  computed them there in the first place (ONNX models: no copy at all).
- Every offset and size a request names is checked against the region.
- Unregistering only drops the registry's reference: a request still using
  the region keeps the mapping alive through its views, and the mapping is
  unmapped when the last view goes away.  In-flight requests are never cut off.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .datatypes import ITEM_SIZES, numpy_dtype
from .errors import AlreadyExists, InvalidArgument, NotFound

SHM_DIR = "/dev/shm"
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    """Registered regions by name; thread-safe."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("shared memory region name must not be empty")
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{name}' is already registered")
        path = os.path.join(SHM_DIR, key.lstrip("/"))
        if "/" in key.lstrip("/") or not key.strip("/"):
            raise InvalidArgument(f"shared memory key '{key}' is not a valid POSIX shared memory name")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidArgument(f"unable to open shared memory region '{name}' (key '{key}'): {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if offset < 0 or byte_size <= 0 or offset + byte_size > size:
                raise InvalidArgument(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"exceeds the object's size {size}"
                )
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            if name in self._regions:
                mapping.close()
                raise AlreadyExists(f"shared memory region '{name}' is already registered")
            self._regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str = "") -> None:
        """Forget ``name`` (or every region when empty); mappings in use stay until released."""
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                if region is None:
                    return  # Triton: unregistering an unknown region is not an error
                regions = [region]
            else:
                regions = list(self._regions.values())
                self._regions.clear()
        for region in regions:
            try:
                region.mapping.close()
            except BufferError:
                pass  # views still exist: the mapping is released with the last of them

    def status(self, name: str = "") -> list[dict]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise NotFound(f"unable to find system shared memory region: '{name}'")
                return [region.status()]
            return [r.status() for r in self._regions.values()]

    def _get(self, name: str) -> Region:
        region = self._regions.get(name)  # one dict lookup is atomic; the lock guards check-then-act
        if region is None:
            raise NotFound(f"unable to find system shared memory region: '{name}'")
        return region

    def _span(self, tensor: str, parameters: dict) -> tuple[Region, int, int]:
        region = self._get(str(parameters[REGION]))
        offset = parameters.get(OFFSET, 0)
        byte_size = parameters.get(BYTE_SIZE)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgument(f"tensor '{tensor}': invalid {OFFSET} {offset!r}")
        if byte_size is None:
            byte_size = region.byte_size - offset
        if not isinstance(byte_size, int) or isinstance(byte_size, bool) or byte_size < 0:
            raise InvalidArgument(f"tensor '{tensor}': invalid {BYTE_SIZE} {byte_size!r}")
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"tensor '{tensor}': shared memory offset {offset} + byte size {byte_size} exceeds "
                f"region '{region.name}' of {region.byte_size} bytes"
            )
        return region, region.offset + offset, byte_size

    def input_view(self, name: str, datatype: str, shape: tuple[int, ...], parameters: dict) -> np.ndarray:
        """A zero-copy view of an input held in a region, checked against the region."""
        region, start, byte_size = self._span(name, parameters)
        count = 1
        for dim in shape:
            if dim < 0:
                raise InvalidArgument(f"input '{name}': negative dimension in shape {list(shape)}")
            count *= dim
        if datatype == "BYTES":
            from ._codec import deserialize_bytes_tensor

            return deserialize_bytes_tensor(memoryview(region.mapping)[start : start + byte_size], count).reshape(shape)
        expected = count * ITEM_SIZES.get(datatype, 0)
        if expected != byte_size:
            raise InvalidArgument(
                f"input '{name}': {datatype} {list(shape)} needs {expected} bytes, "
                f"but {BYTE_SIZE} is {byte_size}"
            )
        # frombuffer holds a buffer export, which keeps unregister from unmapping it under us.
        return np.frombuffer(region.mapping, numpy_dtype(datatype), count, start).reshape(shape)

    def output_view(self, name: str, parameters: dict) -> np.ndarray:
        """The writable bytes of a region an output goes to, checked against the region.

        Resolved before the request runs, so a bad region fails fast and a backend
        can write the output there directly (see :func:`write_output`).
        """
        region, start, byte_size = self._span(name, parameters)
        return np.frombuffer(region.mapping, np.uint8, byte_size, start)


def write_output(name: str, array: np.ndarray, datatype: str, destination: np.ndarray) -> None:
    """Put an output into its region bytes ``destination`` (the one output copy).

    Nothing is copied when the backend already computed the output in place.
    """
    if datatype == "BYTES":
        from ._codec import serialize_bytes_tensor

        data = np.frombuffer(serialize_bytes_tensor(array), dtype=np.uint8)
    else:
        if array.ctypes.data == destination.ctypes.data and array.nbytes <= destination.nbytes:
            return  # written in place by the backend
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.nbytes > destination.nbytes:
        raise InvalidArgument(
            f"output '{name}' needs {data.nbytes} bytes but shared memory byte size is {destination.nbytes}"
        )
    destination[: data.nbytes] = data


def uses_region(parameters: Optional[dict]) -> bool:
    return bool(parameters) and REGION in parameters  # type: ignore[operator]

"""Types of the worker's result ring (see _ring.pyx)."""

CAPACITY: int
RECORD_LIMIT: int
WRITE_AT: int
READ_AT: int
DATA_AT: int
SKIP: int

class RingCorrupt(ValueError):
    """The ring holds what its writer could not have written (a process that wrote over it)."""

class ResultRing:
    """One side's mapping of a worker's result ring."""

    fd: int

    def __init__(self, fd: int) -> None: ...
    @classmethod
    def create(cls) -> ResultRing: ...
    def put(self, data: bytes) -> bool: ...
    def take(self) -> list[bytes]: ...
    def close(self) -> None: ...

from typing import Any

import numpy as np

ERROR_NAMES: dict[int, str]

class Engine:
    def __init__(
        self,
        sockets: list[int],
        requests: list[bytes],
        check: Any,
        authority: str,
        path: str,
        metadata: Any = ...,
        timeout_s: float = ...,
        streaming: bool = ...,
    ) -> None: ...
    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]: ...
    def stop(self) -> None: ...
    def run(self, concurrency: int, drain_s: float = ...) -> int: ...

"""Memory for tests: how much this machine has free, and a process's resident size and its peak."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def mem_available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


#: A 1 GiB FP32 tensor through tritonclient takes about 11 GiB across client and server at its peak (measured
#: against grpcio: the numpy array, the request's serialised copy, gRPC's buffers, the server's response and the
#: client's decoded copy) and ~45 s on 2 cores, so it runs only where asked (FASTOIP_TEST_HUGE=1) or where that
#: much memory is free with room to spare for neighbours.
HUGE_NEEDS_GIB = 24.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class RssSampler:
    """The highest VmRSS a process reached while this sampler ran (VmHWM would include start-up)."""

    def __init__(self, pid: int, every_s: float = 0.002) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

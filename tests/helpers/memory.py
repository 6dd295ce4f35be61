"""How much memory this machine has free, for tests that need gigabytes."""

from __future__ import annotations

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

"""The host-memory stand-in for libcudart (``host_cudart.c``), built once per test session directory.

"Device memory" is host memory there (a cudaMalloc is a mapped POSIX shared-memory object, cudaMemcpy is memcpy),
so CPU-only CI can drive fastoip's CUDA code: ctypes declarations, registration, bounds, copies, gathers.  It
proves fastoip's side, never CUDA itself (``tests/e2e/test_cuda.py`` does that on a GPU machine).
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path


def build_host_cudart(directory: Path) -> Path:
    """Compile ``host_cudart.c`` into ``directory``/libhostcudart.so and return its path."""
    library = directory / "libhostcudart.so"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    source = Path(__file__).parent / "host_cudart.c"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source), "-lrt"], check=True)
    return library

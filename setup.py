"""Build the native extensions: codec, shared-memory guard, HTTP/2 on libnghttp2 (when its headers exist), and the
per-call path's Python modules compiled by mypyc."""

import glob
import os
import shutil
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("FASTOIP_DEBUG") == "1"
# The codec's include files (one concern each, compiled into the one module fastoip._codec): an edit to any
# of them rebuilds it (cythonize also follows `include`; `depends` covers setuptools' own staleness check).
CODEC_INCLUDES = sorted(glob.glob("src/fastoip/wire/codec/*.pxi"))
# Declarations beside each .pyx (asyncpg's pgproto and httptools' way): the .pxd files Cython reads and the C
# headers the generated code includes.  An edit to one rebuilds its extension.
CODEC_DECLARATIONS = ["src/fastoip/_codec.pxd", "src/fastoip/_codec.h"]
SHMGUARD_DECLARATIONS = ["src/fastoip/_shmguard.pxd", "src/fastoip/_shmguard.h"]
HTTP2_DECLARATIONS = ["src/fastoip/server/grpc/_http2.pxd", "src/fastoip/server/grpc/_nghttp2.pxd"]

extensions = [
    Extension(
        "fastoip._codec",
        ["src/fastoip/_codec.pyx"],
        depends=CODEC_INCLUDES + CODEC_DECLARATIONS,
        # numpy's C API makes the zero-copy views (several times cheaper than np.ndarray(...)).
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
    ),
    # A worker's result ring (Python models in worker processes): a memcpy a record, not struct and mmap slicing.
    Extension(
        "fastoip.pyworker._ring",
        ["src/fastoip/pyworker/_ring.pyx"],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
    ),
    # Shared-memory mappings whose SIGBUS (a client shrank the object) becomes a request error.
    Extension(
        "fastoip._shmguard",
        ["src/fastoip/_shmguard.pyx"],
        depends=SHMGUARD_DECLARATIONS,
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
    ),
]



def nghttp2_flags() -> "dict | None":
    """Compiler/linker flags for libnghttp2, or None when its headers are not installed."""
    if shutil.which("pkg-config"):
        probe = subprocess.run(["pkg-config", "--cflags", "--libs", "libnghttp2"], capture_output=True, text=True)
        if probe.returncode == 0:
            flags = probe.stdout.split()
            return {
                "include_dirs": [f[2:] for f in flags if f.startswith("-I")],
                "library_dirs": [f[2:] for f in flags if f.startswith("-L")],
                "libraries": [f[2:] for f in flags if f.startswith("-l")] or ["nghttp2"],
            }
    if os.path.exists("/usr/include/nghttp2/nghttp2.h"):
        return {"libraries": ["nghttp2"]}
    # headers unpacked somewhere else (scripts/gpu_check.sh: a Debian package on a machine without apt)
    include = os.environ.get("FASTOIP_NGHTTP2_INCLUDE")
    if include and os.path.exists(os.path.join(include, "nghttp2", "nghttp2.h")):
        return {"include_dirs": [include], "libraries": ["nghttp2"]}
    return None


HTTP2 = nghttp2_flags()
#: said again as the build's last line, where a user looks (pip -v, make build): the slower frontend is the
#: difference a user would otherwise find only in a benchmark
NO_NATIVE_GRPC = (
    "fastoip: WARNING: libnghttp2 headers not found (Debian: apt-get install libnghttp2-dev): the native gRPC "
    "frontend is NOT built and fastoip serves gRPC with grpcio, several times slower; install them and rebuild"
)
if HTTP2 is None or os.environ.get("FASTOIP_NO_NATIVE_GRPC") == "1":
    print(NO_NATIVE_GRPC, flush=True)
    HTTP2 = None
else:
    extensions.append(
        Extension(
            "fastoip.server.grpc._http2",
            ["src/fastoip/server/grpc/_http2.pyx"],
            depends=HTTP2_DECLARATIONS,
            extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
            **HTTP2,
        )
    )
    # fastoip bench's gRPC load core: nghttp2 in client mode (fastoip.bench falls back to grpcio without it).
    extensions.append(
        Extension(
            "fastoip.bench._h2client",
            ["src/fastoip/bench/_h2client.pyx"],
            depends=["src/fastoip/server/grpc/_nghttp2.pxd"],
            include_dirs=[numpy.get_include(), *HTTP2.get("include_dirs", [])],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
            **{k: v for k, v in HTTP2.items() if k != "include_dirs"},
        )
    )

# The per-call path's pure-Python modules, compiled to C by mypyc from the same .py sources (issue 24 item 1):
# the .py stays the one source (mypy, ruff and scripts/import_graph.py read it); the built module beside it
# shadows it on import (tests/conftest.py refuses one older than its .py: `make build` rebuilds).  Why these: a
# native gRPC `simple` call ran ~150 Python calls on the event loop's thread and ~40 on the batcher's, and the
# interpreter's dispatch of them, not any one function, was what was left (perf: more than half of the server's
# samples in libpython).  They are the modules cProfile of `benchmarks/bench_native_connection.py --connections
# 64 --batcher` finds on that path (loop and worker threads).  Cython's pure-Python mode compiled the same list
# with no measurable gain (Python 3.11's specialising interpreter is as fast as Cython's generic object code);
# mypyc's native classes (attributes in C structs, direct calls) cut the server's CPU per `simple` request by
# about a quarter end to end: benchmarks/RESULTS.md, "The per-call path compiled (cyhot)".  mypyc's rules hold
# in these modules: annotations are checked at run time, classes take no attributes they do not declare and
# cannot be subclassed by interpreted code (LoadedModel's subclass, the ensemble, is compiled with it), a call
# inside a slice (`view[sock.send(view):]`) runs twice and `+=` on a bytearray held in a local makes a new one
# (write them as two statements, and `.extend`: tests/e2e/test_pyworker_framing.py caught both); the name of an
# `except ... as name` has one type in a whole function (a second `except Other as name` raises TypeError when it
# binds: give each its own name; the compiled run of tests/e2e/test_pyworker_isolation.py caught it), and a native
# class takes no weak references.  Left out
# on purpose: fastoip/types.py (the codec fills its classes' slots by layout).  Keep the list short: every
# module adds compile time to every build (all 26, with the Cython extensions: about a minute of CPU).
# FASTOIP_PURE_PYTHON=1 builds none of them (the interpreted path, which `make debug` tests).
COMPILED_PY = [
    "src/fastoip/server/grpc/native_server.py",
    "src/fastoip/server/grpc/native_calls.py",
    "src/fastoip/server/grpc/native_head.py",
    "src/fastoip/server/grpc/native_timers.py",
    "src/fastoip/server/grpc/intake.py",
    "src/fastoip/server/grpc/limits.py",
    "src/fastoip/server/grpc/service.py",
    "src/fastoip/core/call.py",
    "src/fastoip/core/core.py",
    "src/fastoip/core/dataplane.py",
    "src/fastoip/repository/loaded.py",
    "src/fastoip/repository/ensemble.py",
    "src/fastoip/repository/runner.py",
    "src/fastoip/scheduling/batcher.py",
    "src/fastoip/scheduling/job.py",
    "src/fastoip/scheduling/execute.py",
    "src/fastoip/scheduling/direct.py",
    "src/fastoip/scheduling/wakeups.py",
    "src/fastoip/scheduling/buffers.py",
    "src/fastoip/metrics/counters.py",
    # Python models in worker processes: the server's side of each request and the worker's
    "src/fastoip/backends/python/triton/instances.py",
    "src/fastoip/backends/python/hosting/worker_process.py",
    "src/fastoip/pyworker/framing.py",
    "src/fastoip/pyworker/transport.py",
    "src/fastoip/pyworker/channel.py",
    "src/fastoip/pyworker/runner.py",
    "src/fastoip/pyworker/worker.py",
]
# mypyc type-checks and translates when setup.py runs: only for the commands that build (not for the sdist's or
# the metadata's, which PEP 517 front ends ask for first)
BUILDS = any(arg.startswith(("build", "bdist", "editable", "develop", "install")) for arg in sys.argv[1:])
COMPILE_PY = BUILDS and os.environ.get("FASTOIP_PURE_PYTHON") != "1"
compiled_py = []
try:
    from mypyc.build import mypycify
except ImportError:  # pip's builds have it ([build-system] requires); a bare `setup.py build_ext` may not
    mypycify = None
if COMPILE_PY and mypycify is None:
    print("fastoip: mypy (mypyc) is not installed: the per-call path's modules stay interpreted (slower); "
          "pip install 'mypy==2.4.1' to compile them", flush=True)
elif COMPILE_PY:
    compiled_py = mypycify(
        # mypy reads pyproject.toml's [tool.mypy]; a build environment (pip's isolated one) lacks the runtime
        # dependencies and their stubs: their names are Any there, the checks that depend on them are off, and
        # only the compiled modules' own errors count (`make check` runs the full mypy)
        ["--ignore-missing-imports", "--no-warn-unused-ignores", "--follow-imports=silent", *COMPILED_PY],
        opt_level="0" if DEBUG else "3",
        debug_level="2" if DEBUG else "1",
        # one shared library in the package (fastoip/_percall__mypyc*.so) and a small module per source
        group_name="fastoip._percall",
    )

# /v2/docs's Swagger UI 5 (scripts/swagger_ui.py: npm's swagger-ui-dist, integrity-checked), carried by the wheel
SWAGGER_UI = "scripts/swagger_ui.py"
if BUILDS and os.path.exists(SWAGGER_UI):
    subprocess.run([sys.executable, SWAGGER_UI], check=False)

setup(
    ext_modules=compiled_py + cythonize(
        extensions,
        language_level=3,
        annotate=os.environ.get("FASTOIP_ANNOTATE") == "1",
        compiler_directives={
            "boundscheck": DEBUG,
            "wraparound": False,
            "initializedcheck": DEBUG,
            "cdivision": True,
        },
    )
)
if BUILDS and HTTP2 is None:
    print("\n" + NO_NATIVE_GRPC + "\n", flush=True)

"""Build the native extensions: codec, shared-memory guard, HTTP/2 on libnghttp2 (when its headers exist)."""

import glob
import os
import shutil
import subprocess

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
if HTTP2 is None or os.environ.get("FASTOIP_NO_NATIVE_GRPC") == "1":
    print(
        "fastoip: libnghttp2 headers not found (apt-get install libnghttp2-dev): the native gRPC frontend "
        "is not built; fastoip serve falls back to the grpcio frontend",
        flush=True,
    )
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

setup(
    ext_modules=cythonize(
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

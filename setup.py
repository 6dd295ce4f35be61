"""Build the native extensions (codec, shared-memory guard); all other metadata lives in pyproject.toml."""

import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("FASTOIP_DEBUG") == "1"

extensions = [
    Extension(
        "fastoip._codec",
        ["src/fastoip/_codec.pyx"],
        # numpy's C API makes the zero-copy views (several times cheaper than np.ndarray(...)).
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
    ),
    # Shared-memory mappings whose SIGBUS (a client shrank the object) becomes a request error.
    Extension(
        "fastoip._shmguard",
        ["src/fastoip/_shmguard.pyx"],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
    ),
]

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

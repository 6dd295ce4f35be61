"""The serve process pins glibc's mmap threshold (why and the measurement: ``fastoip/allocator.py``)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from fastoip.allocator import pin_mmap_threshold

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _pin_in_child(env: dict[str, str]) -> str:
    code = "from fastoip.allocator import pin_mmap_threshold; print(pin_mmap_threshold())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@glibc_only
def test_glibc_takes_the_threshold() -> None:
    assert pin_mmap_threshold() is True


@glibc_only
def test_an_operators_malloc_setting_wins() -> None:
    assert _pin_in_child({"MALLOC_MMAP_THRESHOLD_": "262144", "PATH": "/usr/bin:/bin"}) == "False"
    assert _pin_in_child({"PATH": "/usr/bin:/bin"}) == "True"

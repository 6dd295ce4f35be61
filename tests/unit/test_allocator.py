"""The serve process pins glibc's mmap threshold (why and the measurement: ``fastoip/allocator.py``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from fastoip.allocator import pin_mmap_threshold, pin_trim_threshold

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _pin_in_child(env: dict[str, str], pin: str = "pin_mmap_threshold") -> str:
    code = f"from fastoip.allocator import {pin}; print({pin}())"
    env = {**env, "PYTHONPATH": os.pathsep.join(sys.path)}  # this checkout's fastoip, whatever is installed
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@glibc_only
def test_glibc_takes_the_threshold() -> None:
    assert pin_mmap_threshold() is True


@glibc_only
def test_an_operators_malloc_setting_wins() -> None:
    assert _pin_in_child({"MALLOC_MMAP_THRESHOLD_": "262144", "PATH": "/usr/bin:/bin"}) == "False"
    assert _pin_in_child({"PATH": "/usr/bin:/bin"}) == "True"


@glibc_only
def test_glibc_takes_the_trim_threshold() -> None:
    assert pin_trim_threshold() is True


@glibc_only
def test_an_operators_trim_setting_wins() -> None:
    env = {"MALLOC_TRIM_THRESHOLD_": "131072", "PATH": "/usr/bin:/bin"}
    assert _pin_in_child(env, "pin_trim_threshold") == "False"
    assert _pin_in_child({"PATH": "/usr/bin:/bin"}, "pin_trim_threshold") == "True"


# Eight 602 KB messages (the lab's image_identity request) allocated, touched and freed, fifty times over; page
# faults per round, after one round to warm the heap. Run in a child: the settings are process-wide.
_FAULTS = """
import resource, sys
from fastoip.allocator import pin_mmap_threshold, pin_trim_threshold
pin_mmap_threshold()
if sys.argv[1] == "trim":
    pin_trim_threshold()
def round_trip():
    blocks = [bytearray(602112) for _ in range(8)]
    for block in blocks:
        block[::4096] = bytes(len(block[::4096]))
    del blocks
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    round_trip()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def _faults_per_round(mode: str) -> float:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return float(out.strip())


@glibc_only
def test_freed_messages_stay_mapped_for_the_next_ones() -> None:
    # with the mmap threshold alone pinned, the trim threshold is glibc's 128 KiB: the freed heap top goes back
    # to the system and the next round faults every page in again (8 x 147 pages); pinned, nothing faults
    assert _faults_per_round("trim") < 8
    assert _faults_per_round("mmap-only") > 8 * 50

"""The suite's own layout: test modules are imported by their base name (no packages), so two rooms must never
hold modules of the same name (pytest refuses the second with "import file mismatch" when one process collects
both, which depends on how xdist shares the files out)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parents[1]


def test_no_two_test_modules_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []

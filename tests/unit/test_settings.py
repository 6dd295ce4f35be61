"""Log settings (issue 27): values outside what Triton's API can carry are refused, not applied."""

from __future__ import annotations

import pytest

from fastoip.errors import InvalidArgument
from fastoip.settings import LogSettings


@pytest.mark.parametrize("level", [2**40, 2**32, -1])
def test_log_verbose_level_is_an_unsigned_32_bit_integer(level: int) -> None:
    settings = LogSettings()
    with pytest.raises(InvalidArgument, match="unsigned 32-bit"):
        settings.update({"log_verbose_level": level})
    assert settings.update({"log_verbose_level": 2**32 - 1})["log_verbose_level"] == 2**32 - 1
    settings.update({"log_verbose_level": 0})

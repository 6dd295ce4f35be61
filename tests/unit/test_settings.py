"""Log settings (issue 27): values outside what Triton's API can carry are refused, not applied; Triton's
info / warning / error / verbose switches are independent (fidelity7)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from fastoip.errors import InvalidArgument
from fastoip.settings import SWITCHES, LogSettings, switches_for_level


@pytest.mark.parametrize("level", [2**40, 2**32, -1])
def test_log_verbose_level_is_an_unsigned_32_bit_integer(level: int) -> None:
    settings = LogSettings()
    with pytest.raises(InvalidArgument, match="unsigned 32-bit"):
        settings.update({"log_verbose_level": level})
    assert settings.update({"log_verbose_level": 2**32 - 1})["log_verbose_level"] == 2**32 - 1
    settings.update({"log_verbose_level": 0})


def _passes(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``logger`` reaches a handler that carries SWITCHES, as serve()'s do."""
    if not logger.isEnabledFor(level):
        return False
    record = logger.makeRecord(logger.name, level, __file__, 0, "message", (), None)
    return all(f.filter(record) for f in logging.getLogger("fastoip").filters) and SWITCHES.filter(record)


@pytest.fixture
def restore_switches() -> Iterator[None]:
    logger = logging.getLogger("fastoip")
    level = logger.level
    yield
    LogSettings().update(switches_for_level(logging.INFO))
    logger.setLevel(level)


def test_info_warning_and_error_switch_independently(restore_switches: None) -> None:
    """Triton's --log-info=false --log-verbose=1: verbose (debug) messages pass, info ones do not."""
    settings = LogSettings()
    settings.started_with("", "default", {"log_info": False, "log_warning": True, "log_error": True,
                                          "log_verbose_level": 1})
    assert settings.update({}) == {"log_file": "", "log_info": False, "log_warning": True, "log_error": True,
                                   "log_verbose_level": 1, "log_format": "default"}
    child = logging.getLogger("fastoip.metrics")  # a child's records: the handler's filter judges them
    assert [_passes(child, level) for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)] == [
        True, False, True, True]
    settings.update({"log_warning": False, "log_verbose_level": 0, "log_info": True})
    assert [_passes(child, level) for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)] == [
        False, True, False, True]
    settings.update({"log_error": False, "log_info": False})
    assert not any(_passes(child, level) for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR))
    other = logging.getLogger("someone.else").makeRecord("someone.else", logging.INFO, __file__, 0, "m", (), None)
    assert SWITCHES.filter(other)  # another library's records are not fastoip's switches to drop


def test_the_switches_read_back_independently(restore_switches: None) -> None:
    settings = LogSettings()
    for key in ("log_info", "log_warning", "log_error"):
        values = settings.update({key: False})
        assert values[key] is False and all(values[k] for k in ("log_info", "log_warning", "log_error") if k != key)
        settings.update({key: True})


def test_an_empty_log_file_is_refused_as_any_other(restore_switches: None) -> None:
    """Issue 37: {"log_file": ""} answered 200 and changed nothing; Triton refuses any log_file over the network."""
    from fastoip.errors import InvalidArgument

    settings = LogSettings()
    for value in ("", "/tmp/elsewhere.log"):
        with pytest.raises(InvalidArgument, match="can not be updated through network protocol"):
            settings.update({"log_file": value})

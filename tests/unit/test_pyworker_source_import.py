"""Model files are imported from their source every time (pyworker/source_import.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fastoip.pyworker.source_import import import_source


def test_an_edit_of_the_same_size_in_the_same_second_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text("VALUE = 1\n")
    stamp = path.stat().st_mtime_ns
    assert import_source(path, "_test_source_a").VALUE == 1
    path.write_text("VALUE = 2\n")  # same size; the mtime put back: a bytecode cache would hand back VALUE = 1
    os.utime(path, ns=(stamp, stamp))
    assert import_source(path, "_test_source_b").VALUE == 2
    assert not (tmp_path / "__pycache__").exists()  # nothing written beside the model


def test_the_files_folder_is_importable_while_it_runs_only(tmp_path: Path) -> None:
    (tmp_path / "helper_beside.py").write_text("NAME = 'beside'\n")
    (tmp_path / "model.py").write_text("import helper_beside\nNAME = helper_beside.NAME\n")
    assert import_source(tmp_path / "model.py", "_test_source_c").NAME == "beside"
    assert str(tmp_path) not in sys.path


def test_a_failing_file_is_not_left_registered(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("raise RuntimeError('broken model')\n")
    with pytest.raises(RuntimeError, match="broken model"):
        import_source(tmp_path / "model.py", "_test_source_d")
    assert "_test_source_d" not in sys.modules


def test_in_a_package_of_its_folder_relative_imports_work_and_keep_on_path_leaves_the_folders(tmp_path: Path) -> None:
    # python_backend's stub: "<version>.model" with the version folder and the model folder on sys.path (issue 41)
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "helper_rel.py").write_text("NAME = 'relative'\n")
    (version / "model.py").write_text("from . import helper_rel\nNAME = helper_rel.NAME\n")
    module = import_source(version / "model.py", "_test_source_pkg", in_package=True, keep_on_path=True)
    try:
        assert module.NAME == "relative" and module.__name__ == "_test_source_pkg.model"
        assert str(version) in sys.path and str(version.parent) in sys.path
    finally:
        for folder in (str(version), str(version.parent)):
            while folder in sys.path:
                sys.path.remove(folder)

"""scripts/triton_qa.py's bookkeeping (issue 41): per-case names that match between a fastoip run and a real-Triton
run (the python3 shim's time stamps taken off, a reused report name numbered), the per-case JSON and the comparison
that lists what Triton passes and fastoip fails."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "triton_qa.py"


@pytest.fixture(scope="module")
def qa() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_qa", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton_qa"] = module  # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["triton_qa"]
    return module


def _report(path: Path, cases: dict[str, str]) -> None:
    body = "".join(
        f'<testcase classname="t.T" name="{name}">{"<failure/>" if outcome == "fail" else ""}'
        f'{"<skipped/>" if outcome == "skip" else ""}</testcase>'
        for name, outcome in cases.items()
    )
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")


def test_case_names_drop_the_shim_time_stamp_and_number_a_reused_report(qa: ModuleType, tmp_path: Path) -> None:
    since = time.time() - 5
    _report(tmp_path / "lifecycle.report.1796588971172453576.xml", {"test_a": "pass", "test_b": "fail"})
    _report(tmp_path / "lifecycle.report.1796588971999999999.xml", {"test_a": "fail", "test_c": "skip"})
    old = tmp_path / "stale.report.1000000000000000000.xml"  # written before the suite started: not counted
    _report(old, {"test_z": "pass"})
    os.utime(old, (since - 100, since - 100))
    passed, failed, skipped = qa.junit_cases(tmp_path, since)
    assert passed == ["lifecycle.report::t.T.test_a"]
    assert failed == ["lifecycle.report::t.T.test_b", "lifecycle.report#2::t.T.test_a"]
    assert skipped == ["lifecycle.report#2::t.T.test_c"]


def test_the_comparison_sorts_cases_into_the_goal_list_and_the_rest(qa: ModuleType, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def run(server: str, outcome: dict[str, tuple[list[str], list[str]]]) -> Path:
        results = [qa.SuiteResult(suite, 0, 1.0, passed, failed) for suite, (passed, failed) in outcome.items()]
        path = tmp_path / server / "run.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"server": server, "suites": [r.__dict__ for r in results],
                                    "cases": qa.case_rows(results)}))
        return path

    ours = run("fastoip", {"io": (["a", "b"], ["c", "d"]), "only_ours": (["x"], [])})
    theirs = run("triton", {"io": (["a", "c"], ["b", "d"])})
    groups = qa.compare(qa.load_rows(ours), qa.load_rows(theirs), {"io"})
    assert groups["triton_only"] == [("io", "c")]
    assert groups["fastoip_only"] == [("io", "b")]
    assert groups["both_fail"] == [("io", "d")]
    assert groups["both_pass"] == [("io", "a")]
    # a folder of per-suite files reads as one run; a suite only one side ran is left out of the listing
    assert qa.main(["--compare", str(ours.parent), str(theirs)]) == 0
    out = capsys.readouterr().out
    assert "Triton passes, fastoip fails (the goal's list): 1\n    io: c" in out
    assert "only_ours" not in out


def test_the_real_triton_shim_leaves_out_flags_newer_than_the_reference(qa: ModuleType, tmp_path: Path) -> None:
    venv = tmp_path / "venv-triton"
    server = venv / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    (server / "bin").mkdir(parents=True)
    # a stand-in binary that prints the arguments it got
    (server / "bin" / "tritonserver").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (server / "bin" / "tritonserver").chmod(0o755)
    shim = tmp_path / "shim"
    qa.write_shim(shim, qa.RealTriton(venv).command("/x"))
    out = subprocess.run([str(shim), "--model-repository=/m", "--allow-client-shm=true", "--log-verbose=1"],
                         check=True, capture_output=True, text=True).stdout.split()
    assert out == ["--model-repository=/m", "--log-verbose=1"]


def test_the_real_triton_shim_sets_aside_what_the_wheel_cannot_serve(qa: ModuleType, tmp_path: Path) -> None:
    """ONNX models (no onnxruntime backend in the pytriton wheel) and models importing torch leave the repository
    before real Triton starts; the Python models stay."""
    venv = tmp_path / "venv-triton"
    server = venv / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    (server / "bin").mkdir(parents=True)
    (server / "bin" / "tritonserver").write_text('#!/bin/bash\nexit 0\n')
    (server / "bin" / "tritonserver").chmod(0o755)
    (server / "backends" / "python").mkdir(parents=True)
    (server / "python_backend_stubs" / "3.11").mkdir(parents=True)
    (server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub").write_text("")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    repo = tmp_path / "models"
    for name, files in {"onnx_seq": {"config.pbtxt": 'platform: "onnxruntime_onnx"'},
                        "onnx_bare": {"1/model.onnx": ""},
                        "torchy": {"1/model.py": "import torch\n"},
                        "plain": {"1/model.py": "import numpy\n", "config.pbtxt": 'backend: "python"'}}.items():
        for relative, text in files.items():
            (repo / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (repo / name / relative).write_text(text)
    work = tmp_path / "work"
    qa.make_shims(work, None, qa.RealTriton(venv), "/x")
    subprocess.run([str(work / "bin" / "tritonserver"), f"--model-repository={repo}"], check=True,
                   capture_output=True)
    assert sorted(p.name for p in repo.iterdir()) == ["plain"]
    assert sorted(p.name for p in (work / "set-aside").iterdir()) == ["onnx_bare", "onnx_seq", "torchy"]
    assert (work / "backends" / "python" / "triton_python_backend_stub").is_file()

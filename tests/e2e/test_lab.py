"""``benchmarks/lab.py``'s ModelStreamInfer point (issue 24): fastoip served by ``fastoip bench --streaming``.

The point runs the real ``fastoip bench`` (this tree's, as a child process) against a real fastoip server and
reads its JSON; the target compares it with another server's unary figure of the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastoip.bench._h2client", reason="the native bench client is not built (no libnghttp2 headers)")

from script_modules import load_script  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STREAM_TARGET = ("cross", "fastoip-native", "stream", "grpc-cpp", "grpc", "simple", 64, 1.0)


lab = load_script(ROOT / "benchmarks" / "lab.py", "lab")
needs_taskset = pytest.mark.skipif(shutil.which("taskset") is None, reason="the lab pins its clients with taskset")


@needs_taskset
def test_stream_point_loads_the_server_and_checks_every_answer(server: ServerProcess,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab, "FASTOIP_PY", sys.executable)  # this test's interpreter (the lab uses <repo>/.venv)
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    result = lab.run_fastoip_stream(f"127.0.0.1:{server.grpc_port}", "simple", 4, 1, cpus)
    assert "error" not in result, result
    assert result["client"] == "native-stream" and result["errors"] == 0
    assert result["done"] > 10 and result["rps"] > 10 and 0.5 < result["secs"] < 5
    assert result["p50_us"] is not None and result["p50_us"] <= result["p99_us"]
    assert lab.verify(result, {}, "stream", 4) == (True, "no errors, every answer checked by fastoip bench --verify")


@needs_taskset
def test_stream_point_with_errors_is_not_verified(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab, "FASTOIP_PY", sys.executable)
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    result = lab.run_fastoip_stream(f"127.0.0.1:{server.grpc_port}", "no_such_model", 2, 1, cpus)
    ok, why = lab.verify(result, {}, "stream", 2)
    assert not ok and why


def point(server: str, transport: str, rps: float, cpu_us: float) -> dict[str, Any]:
    return dict(server=server, model="simple", transport=transport, conc=64, rps=rps, verified=True,
                server_cpu_us_per_req=cpu_us, p99_us=1000.0)


@pytest.mark.parametrize("stream_rps, status", [(70_000.0, "PASS"), (60_000.0, "FAIL")])
def test_stream_target_compares_with_the_cpp_servers_unary_figure(stream_rps: float, status: str) -> None:
    result = {"points": [point("fastoip-native", "stream", stream_rps, 15.0), point("grpc-cpp", "grpc", 66_000.0, 12.0),
                         point("fastoip-native", "grpc", 30_000.0, 30.0)],
              "targets": [STREAM_TARGET]}
    [outcome] = lab.evaluate_targets(result)
    assert outcome["status"] == status
    assert outcome["ratio"] == round(stream_rps / 66_000.0, 3)
    assert "efficiency ratio 0.80" in outcome["detail"]


def test_stream_target_is_left_out_when_the_stream_point_was_not_asked_for() -> None:
    result = {"points": [point("grpc-cpp", "grpc", 66_000.0, 12.0)], "targets": [STREAM_TARGET]}
    assert lab.evaluate_targets(result) == []


def test_stream_point_runs_only_when_named() -> None:
    args = argparse.Namespace(conc=[64], models=["simple"], peers=None, servers=["fastoip-native", "grpc-cpp"],
                              transports=None, variants={}, order="model", ceilings=False)
    sessions, _ = lab.build_sessions("grpc-e2e", args)
    assert sessions == [("fastoip-native", [("simple", "grpc", [64])]), ("grpc-cpp", [("simple", "grpc", [64])])]
    args.transports = ["grpc", "stream"]
    sessions, _ = lab.build_sessions("grpc-e2e", args)
    assert sessions == [("fastoip-native", [("simple", "grpc", [64]), ("simple", "stream", [64])]),
                        ("grpc-cpp", [("simple", "grpc", [64])])]

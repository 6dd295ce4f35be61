"""The prepared GPU check (issue 26), proven on CPU: the ResNet-50-shaped CNN, the bench driver, the "no GPU" stop.

``benchmarks/gpu_bench.py`` and ``scripts/gpu_check.sh`` run for real only on a GPU machine; here the CNN is
built and run on ONNX Runtime's CPU EP, the driver runs its shared-memory part end to end on the CPU EP, and the
script's ``run`` reassembles split files, checks them and stops with "no GPU".
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]


gpu_bench = load_script(ROOT / "benchmarks" / "gpu_bench.py", "gpu_bench")


def gpu_listed() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return any(line.startswith("GPU ") for line in listed.stdout.splitlines())


def test_resnet50_has_resnet50s_layers_and_runs_on_the_cpu_ep() -> None:
    import onnx
    import onnxruntime as ort

    model = gpu_bench.build_resnet50()
    onnx.checker.check_model(model)
    ops = collections.Counter(node.op_type for node in model.graph.node)
    # stem conv + 16 bottlenecks x 3 convs + 4 projection shortcuts; ReLU: stem + 2 a block + 1 after each Add
    assert ops == {"Conv": 53, "Relu": 49, "Add": 16, "MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    parameters = sum(int(np.prod(init.dims)) for init in model.graph.initializer)
    assert 25_000_000 < parameters < 26_000_000  # ResNet-50's 25.5 M, less BatchNorm's (folded)
    data = model.SerializeToString()
    assert len(data) < 110_000_000
    assert hashlib.sha256(data).digest() == hashlib.sha256(gpu_bench.build_resnet50().SerializeToString()).digest()

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert inp.name == "INPUT0" and inp.shape[1:] == [3, 224, 224]
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    (out,) = session.run(None, {"INPUT0": images})
    assert out.shape == (2, 1000) and out.dtype == np.float32
    assert np.isfinite(out).all() and not np.allclose(out[0], out[1])  # a real function of its input


def test_each_parts_table_and_its_error_rows() -> None:
    row = {"model": "mlp", "concurrency": 16, "infer_per_s": 1234.5, "p50_us": 800.0, "p99_us": 2100.0,
           "avg_batch": 3.25, "errors": 0}
    copy = {"batch": "b", "bytes": 123456, "host": "pinned", "median_ms": 1.5, "gb_per_s": 2.25}
    results = {
        "passed": False, "complete": True, "gpu": True, "elapsed_s": 12.0, "model_bytes": {}, "instance_kinds": {},
        "problems": [], "skipped": [],
        "ep": [{"ep": "cuda", **row}, {"ep": "cpu", **row, "p99_us": None},
               {"model": "r", "ep": "cpu", "error": "boom"}],
        "graph": [{"ep": "cuda", "graphs": True, **row}, {"ep": "cpu", "graphs": True, **row, "p50_us": None},
                  {"model": "x", "ep": "cuda", "graphs": True, "error": "bad"}],
        "h2d": [{**copy, "really_pinned": False}, {**copy, "host": "pageable", "really_pinned": None}, {"error": "e"}],
        "shm": [{"ep": "cuda", "shm": "cuda", **row}, {"model": "i", "ep": "cuda", "shm": "system", "error": "e"}],
    }
    lines = gpu_bench.markdown(results).splitlines()
    assert lines[lines.index("| model | EP | c | infer/s | p99 ms | avg batch | errors |") + 1:][:4] == [
        "|---|---|---|---|---|---|---|",
        "| mlp | cuda | 16 | 1,234.5 | 2.10 | 3.25 | 0 |",
        "| mlp | cpu | 16 | 1,234.5 | - | 3.25 | 0 |",
        "| r | cpu | - | ERROR: boom | | | |",
    ]
    assert "| mlp | cuda | yes | 1,234.5 | 0.800 | 2.100 | 0 |" in lines
    assert "| mlp | cpu | asked (none on the CPU EP) | 1,234.5 | - | 2.100 | 0 |" in lines
    assert "| x | cuda | True | ERROR: bad | | | |" in lines
    assert "| b | 123,456 | pinned (NOT pinned: fell back) | 1.500 | 2.2 |" in lines
    assert "| b | 123,456 | pageable | 1.500 | 2.2 |" in lines and "| ERROR: e | | | | |" in lines
    assert "| mlp | cuda | cuda | 16 | 1,234.5 | 2.10 | 0 |" in lines
    assert "| i | cuda | system | - | ERROR: e | | |" in lines
    assert [line for line in lines if line.startswith("### ")] == [
        "### CUDA EP vs CPU EP (gRPC, fastoip bench)",
        "### CUDA graphs vs the plain CUDA EP, c=1 (gRPC, fastoip bench)",
        "### Host-to-device copy of one batch (CUDA events, median of 20)",
        "### Shared memory vs tensor bytes in the request (gRPC, identity models)",
    ]


@pytest.mark.skipif(gpu_listed(), reason="a GPU is here: the driver would run its GPU parts (minutes)")
def test_the_driver_runs_end_to_end_on_the_cpu_ep_and_lists_the_gpu_parts(tmp_path: Path) -> None:
    # a 1 s window: a 16 MB request took ~20 ms alone and over 200 ms under `make test`'s load (6 workers on 2
    # cores), when a 200 ms window saw none complete
    code = gpu_bench.main(
        ["--out", str(tmp_path), "--dry-run", "--parts", "shm", "--window-ms", "1000", "--trials", "1"]
    )
    results = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert code == 0 and results["passed"] and results["dry_run"]
    assert results["instance_kinds"]["cpu"]["resnet50"] == "KIND_CPU"
    points = {(row["model"], row["shm"]) for row in results["shm"]}
    assert points == {(m, s) for m in ("identity_602k", "identity_16m") for s in ("system", "none")}
    assert all(row["infer_per_s"] > 0 and row["errors"] == 0 for row in results["shm"])
    assert any("cuda" in line and "no GPU" in line for line in results["skipped"])
    table = (tmp_path / "gpu_bench.md").read_text()
    assert "identity_16m | cpu | system | 1 |" in table and "skipped: shm: --shared-memory cuda" in table


@pytest.mark.skipif(gpu_listed(), reason="a GPU is here: run would install and build")
def test_gpu_check_run_reassembles_checks_and_stops_saying_no_gpu(tmp_path: Path) -> None:
    gpu_dir, stage, out = tmp_path / "gpu", tmp_path / "stage", tmp_path / "out"
    (gpu_dir / "wheels").mkdir(parents=True)
    wheel = gpu_dir / "wheels" / "big-1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    (gpu_dir / "SHA256SUMS").write_text(f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  wheels/{wheel.name}\n")
    stage.mkdir()
    # what `pack` and `stage` leave there: the file split in pieces, and the checksums
    data = wheel.read_bytes()
    for index, start in enumerate(range(0, len(data), 1024 * 1024)):
        (stage / f"{wheel.name}.part{index:02d}").write_bytes(data[start : start + 1024 * 1024])
    shutil.copy(gpu_dir / "SHA256SUMS", stage)
    env = {**os.environ, "STAGE": str(stage), "OUT": str(out), "PY": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "run"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "reassembled and checked: 1 wheels" in done.stdout
    assert "no GPU on this machine" in done.stdout and "benchmarks/gpu_bench.py" in done.stdout
    assert (stage / wheel.name).read_bytes() == data and not list(stage.glob("*.part*"))
    assert (out / "summary.md").read_text().startswith("# gpu-check: no GPU")

    (stage / wheel.name).write_bytes(b"corrupt")  # a bad piece must stop the run, not install it
    failed = subprocess.run(["bash", "scripts/gpu_check.sh", "run"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert failed.returncode != 0


@pytest.mark.skipif(gpu_listed(), reason="a GPU is here: the driver would run its GPU parts (minutes)")
def test_the_graph_part_runs_each_model_beside_its_cuda_graph_twin(tmp_path: Path) -> None:
    code = gpu_bench.main(
        # (3 s windows: under make test's load one CPU resnet50 inference took over the 0.3 s window once, none done)
        ["--out", str(tmp_path), "--dry-run", "--parts", "graph", "--window-ms", "3000", "--trials", "1"]
    )
    results = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert code == 0 and results["passed"]
    assert [(row["model"], row["graphs"]) for row in results["graph"]] == [
        ("mlp", False), ("mlp_graph", True), ("resnet50", False), ("resnet50_graph", True)
    ]
    assert all(row["infer_per_s"] > 0 and row["errors"] == 0 and row["p50_us"] for row in results["graph"])
    config = (tmp_path / "repo" / "resnet50_graph" / "config.pbtxt").read_text()
    assert 'key: "enable_cuda_graph" value: "1"' in config
    table = (tmp_path / "gpu_bench.md").read_text()
    assert "| resnet50_graph | cpu | asked (none on the CPU EP) |" in table and "skipped: graph:" in table


def native_frontend_built() -> bool:
    return any((ROOT / "src" / "fastoip" / "server" / "grpc").glob("_http2*.so"))


@pytest.mark.skipif(shutil.which("h2load") is None, reason="needs h2load (nghttp2-client)")
@pytest.mark.skipif(not native_frontend_built(), reason="needs the native gRPC frontend built")
def test_the_cores_step_dry_runs_on_a_small_machine_and_notes_its_progress(tmp_path: Path) -> None:
    stage, out = tmp_path / "stage", tmp_path / "out"
    env = {**os.environ, "STAGE": str(stage), "OUT": str(out), "PY": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "cores"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads((out / "cores.json").read_text())
    by_name = {row["name"]: row for row in figures["results"]}
    for name in ("fastoip-simple", "fastoip-mlp"):
        row = by_name[name]
        assert "error" not in row, row
        assert row["rps"] > 0 and row["done"] == row["succeeded"] and row["server_cpu_s"] > 0
    for name in ("cpp-1cq", "cpp-8cq"):  # measured where `prepare` built the bundle (.gpu/cores), else said why not
        row = by_name[name]
        assert row["error"].startswith("no C++ server built") if "error" in row else row["rps"] > 0, row
    progress = (stage / "progress").read_text()
    assert "cores: begun" in progress and "cores: done" in progress
    assert "| fastoip-simple | simple |" in (stage / "summary.md").read_text()


def test_a_step_the_device_time_left_cannot_hold_is_skipped_saying_so(tmp_path: Path) -> None:
    stage, out = tmp_path / "stage", tmp_path / "out"
    stage.mkdir()
    (stage / "began_at").write_text("1\n")  # the first command began long ago: the device time is spent
    env = {**os.environ, "STAGE": str(stage), "OUT": str(out), "PY": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "cores"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "cores: skipped" in done.stdout
    assert "- cores: SKIPPED" in (stage / "summary.md").read_text()
    assert not (out / "cores.json").exists() and "cores: begun" in (out / "progress").read_text()

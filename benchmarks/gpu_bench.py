"""The GPU benchmark of ``make gpu-check`` (issue 26): CUDA EP vs CPU EP, pinned vs pageable, CUDA shm vs bytes.

    python benchmarks/gpu_bench.py --out DIR [--window-ms 1000] [--trials 3] [--dry-run]

Parts (each writes its rows into ``DIR/gpu_bench.json`` and a table into ``DIR/gpu_bench.md``):

1. ``ep``: ``fastoip serve`` on a repository written here (the batched ``mlp`` and ``resnet50``, a
   ResNet-50-shaped CNN built below with the onnx helper API, both with the dynamic batcher), once on the
   CUDA EP and once with ``--cpu-only``; ``fastoip bench`` over gRPC at c=1,16,64: throughput, p99 and the
   server's average batch size.
2. ``h2d``: host-to-device time of one batch (mlp: 64 x 256 FP32; resnet50: 16 and 64 x 3x224x224 FP32),
   from pinned memory (:func:`fastoip.cuda.pinned_allocator`, the batcher's own) and from pageable memory
   (``numpy.empty``), timed with CUDA events through CuPy.
3. ``graph`` (issue 42): ``mlp`` and ``resnet50`` against ``mlp_graph`` and ``resnet50_graph`` (the same models
   with the ``cuda`` accelerator's ``enable_cuda_graph``: a CUDA graph per batch bucket) at c=1 on the CUDA EP,
   side by side on one server: throughput and p50/p99 latency.
4. ``shm``: ``identity_602k`` (FP32 [3,224,224], 602,112 bytes) and ``identity_16m`` (FP32 [4,1024,1024],
   16 MiB) on the CUDA EP, ``fastoip bench --shared-memory cuda|system|none`` at c=1,16: throughput.

``--dry-run`` (no GPU): part 1 on the CPU EP only at c=1 with short windows, part 3 on the CPU EP (where the
option leaves the model as it is: the driver is proven, not the graphs), part 4 with ``system`` and ``none``
only; every GPU-only step is listed as skipped, so the driver is proven end to end on CPU.
Exit status: 0 when every point that ran answered without errors, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fastoip.launcher import ChildProcess

OPSET = 13
IR_VERSION = 8
#: ResNet-50: (bottleneck width, blocks, stride of the first block) per stage; out channels = 4 x width.
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))

CONFIG = (
    'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {batch}\n'
    "dynamic_batching {{\n  max_queue_delay_microseconds: {delay}\n}}\n"
)
IDENTITY_CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
#: The ``cuda`` accelerator's CUDA graphs (Triton's onnxruntime backend passes the parameter to the CUDA EP).
CUDA_GRAPHS = (
    "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator [ { name: \"cuda\" parameters "
    "{ key: \"enable_cuda_graph\" value: \"1\" } } ]\n  }\n}\n"
)
#: The models part 3 compares: each plain one beside its CUDA-graph twin.
GRAPH_PAIRS = (("mlp", "mlp_graph"), ("resnet50", "resnet50_graph"))


# -- models ------------------------------------------------------------------------------------
def build_resnet50(seed: int = 0, classes: int = 1000) -> Any:
    """A ResNet-50-shaped CNN: INPUT0 FP32 [batch,3,224,224] -> OUTPUT0 FP32 [batch,classes].

    Stem (7x7/2 conv, ReLU, 3x3/2 max pool), 16 bottleneck blocks in 4 stages (1x1, 3x3, 1x1 convs, projection
    shortcut on each stage's first block, Add, ReLU), global average pool, Flatten, Gemm. BatchNorm is folded
    into each Conv's weight and bias (as an exported inference graph has it). 53 Conv, 1 Gemm; about 25.5 M
    parameters (about 102 MB). Weights: He-scaled normal from ``numpy.random.default_rng(seed)``, the last conv
    of each block scaled down so activations stay finite through 16 residual additions.
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[Any] = []
    initializers: list[Any] = []
    count = [0]

    def conv(x: str, c_in: int, c_out: int, k: int, stride: int, relu: bool, gain: float = 1.0) -> str:
        index = count[0]
        count[0] += 1
        std = gain * np.sqrt(2.0 / (c_in * k * k))
        weight = (rng.standard_normal((c_out, c_in, k, k), dtype=np.float32) * std).astype(np.float32)
        bias = (rng.standard_normal(c_out, dtype=np.float32) * 0.01).astype(np.float32)
        initializers.extend(
            [numpy_helper.from_array(weight, f"conv{index}.w"), numpy_helper.from_array(bias, f"conv{index}.b")]
        )
        pad = k // 2
        out = f"conv{index}"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{index}.w", f"conv{index}.b"],
                [out],
                name=out,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        if relu:
            nodes.append(helper.make_node("Relu", [out], [f"{out}.relu"], name=f"{out}.relu"))
            out = f"{out}.relu"
        return out

    x = conv("INPUT0", 3, 64, 7, 2, relu=True)
    nodes.append(
        helper.make_node(
            "MaxPool", [x], ["pool0"], name="pool0", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        )
    )
    x, c_in = "pool0", 64
    for stage, (width, blocks, first_stride) in enumerate(RESNET50_STAGES):
        c_out = 4 * width
        for block in range(blocks):
            stride = first_stride if block == 0 else 1
            shortcut = conv(x, c_in, c_out, 1, stride, relu=False) if block == 0 else x
            y = conv(x, c_in, width, 1, 1, relu=True)
            y = conv(y, width, width, 3, stride, relu=True)
            y = conv(y, width, c_out, 1, 1, relu=False, gain=0.2)
            name = f"s{stage}b{block}"
            nodes.append(helper.make_node("Add", [y, shortcut], [f"{name}.add"], name=f"{name}.add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}.out"))
            x, c_in = f"{name}.out", c_out
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flat", axis=1))
    fc_w = (rng.standard_normal((c_in, classes), dtype=np.float32) / np.sqrt(c_in)).astype(np.float32)
    initializers.extend(
        [numpy_helper.from_array(fc_w, "fc.w"), numpy_helper.from_array(np.zeros(classes, np.float32), "fc.b")]
    )
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["OUTPUT0"], name="fc"))
    inp = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 3, 224, 224])
    out = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", classes])
    graph = helper.make_graph(nodes, "resnet50", [inp], [out], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.producer_name = "fastoip-gpu-bench"
    return model


def write_repository(root: Path) -> dict[str, int]:
    """The benchmark's models and configs under ``root``; returns each model's file size in bytes."""
    from onnx import TensorProto

    from fastoip.demo import build_identity, build_mlp

    resnet50 = build_resnet50()
    models = {
        "mlp": (build_mlp(), CONFIG.format(name="mlp", batch=64, delay=0)),
        "resnet50": (resnet50, CONFIG.format(name="resnet50", batch=64, delay=200)),
        "mlp_graph": (build_mlp(), CONFIG.format(name="mlp_graph", batch=64, delay=0) + CUDA_GRAPHS),
        "resnet50_graph": (resnet50, CONFIG.format(name="resnet50_graph", batch=64, delay=200) + CUDA_GRAPHS),
        "identity_602k": (build_identity("identity_602k", TensorProto.FLOAT, [3, 224, 224]), None),
        "identity_16m": (build_identity("identity_16m", TensorProto.FLOAT, [4, 1024, 1024]), None),
    }
    sizes = {}
    for name, (model, config) in models.items():
        folder = root / name / "1"
        folder.mkdir(parents=True, exist_ok=True)
        data = model.SerializeToString()
        (folder / "model.onnx").write_bytes(data)
        sizes[name] = len(data)
        text = config if config is not None else IDENTITY_CONFIG.format(name=name)
        (root / name / "config.pbtxt").write_text(text)
    return sizes


# -- the server and the bench ------------------------------------------------------------------
def serve(repo: Path, cpu_only: bool, log: Path) -> ChildProcess:
    argv = [
        sys.executable,
        "-m",
        "fastoip.cli",
        "serve",
        "--model-repository",
        str(repo),
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--http-port",
        "-1",
        "--metrics-port",
        "-1",
    ]
    if cpu_only:
        argv.append("--cpu-only")
    return ChildProcess(argv, want=("grpc",), log_path=log).start(timeout=300)


def bench(port: int, model: str, levels: str, args: argparse.Namespace, out: Path, shm: str = "none") -> list[dict]:
    """``fastoip bench`` on one model; its JSON rows (an ``error`` row when it failed)."""
    report = out / f"bench-{model}-{shm}-{int(time.time() * 1000)}.json"
    argv = [
        sys.executable,
        "-m",
        "fastoip.cli",
        "bench",
        f"grpc://127.0.0.1:{port}",
        "-m",
        model,
        "--concurrency-range",
        levels,
        "-p",
        str(args.window_ms),
        "-r",
        str(args.trials),
        "--shared-memory",
        shm,
        "--json",
        str(report),
        "-q",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.point_timeout)
    try:
        document = json.loads(report.read_text())
    except (OSError, ValueError):
        tail = (done.stdout + done.stderr)[-600:]
        return [{"model": model, "shm": shm, "error": f"bench exited {done.returncode}: {tail}"}]
    finally:
        report.unlink(missing_ok=True)
    rows = []
    for row in document.get("results", []):
        server = row.get("server") or {}
        rows.append(
            {
                "model": model,
                "shm": shm,
                "concurrency": row.get("concurrency"),
                "infer_per_s": row.get("throughput_infer_per_s"),
                "p50_us": (row.get("latency_us") or {}).get("p50"),
                "p99_us": (row.get("latency_us") or {}).get("p99"),
                "avg_batch": server.get("avg_batch_size"),
                "errors": sum((row.get("errors") or {}).values()),
                "requests": row.get("requests"),
            }
        )
    if document.get("error"):
        rows.append({"model": model, "shm": shm, "error": str(document["error"])})
    return rows


def measure(
    results: dict[str, Any],
    part: str,
    mode: str,
    port: int,
    model: str,
    levels: str,
    args: argparse.Namespace,
    started: float,
    shm: str = "none",
    **labels: Any,
) -> None:
    """One point of a part (``fastoip bench`` on ``model``): its rows into ``results[part]`` with the EP and
    ``labels``, printed, and the results saved (a run cut short keeps them)."""
    for row in bench(port, model, levels, args, args.out, shm=shm):
        results[part].append({"ep": mode, **labels, **row})
        print(f"gpu_bench: {part} {mode} {row}", flush=True)
    save(args.out, results, started)


def instance_kinds(port: int, models: tuple[str, ...]) -> dict[str, str]:
    """Each model's instance_group kind as the server reports it (KIND_GPU: the CUDA EP runs it)."""
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(f"127.0.0.1:{port}")
    kinds = {}
    for model in models:
        try:
            config = client.get_model_config(model, as_json=True)["config"]
        except Exception as exc:  # a model that did not load (a CUDA graph ORT refused): said, the others measured
            kinds[model] = f"not loaded: {exc}"[:300]
            continue
        kinds[model] = ",".join(group.get("kind", "?") for group in config.get("instance_group", [])) or "?"
    client.close()
    return kinds


# -- pinned vs pageable ------------------------------------------------------------------------
def h2d_times(shapes: dict[str, tuple[int, ...]], repeats: int = 20) -> list[dict]:
    """Milliseconds to copy one batch host-to-device, pinned and pageable, timed with CUDA events (CuPy)."""
    import cupy  # type: ignore[import-not-found]  # on the GPU image only

    from fastoip import cuda

    rows = []
    stream = cupy.cuda.Stream(non_blocking=True)
    for label, shape in shapes.items():
        nbytes = int(np.prod(shape)) * 4
        device = cupy.empty(nbytes, dtype=cupy.uint8)
        pinned = cuda.pinned_allocator(nbytes)
        is_pinned = isinstance(pinned.base, cuda._PinnedBlock)
        sources = {"pinned": pinned, "pageable": np.empty(nbytes, dtype=np.uint8)}
        for kind, host in sources.items():
            host[:] = 1
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            times = []
            for index in range(repeats + 2):
                start.record(stream)
                cupy.cuda.runtime.memcpyAsync(
                    device.data.ptr, host.ctypes.data, nbytes, cupy.cuda.runtime.memcpyHostToDevice, stream.ptr
                )
                end.record(stream)
                end.synchronize()
                if index >= 2:  # two warm-ups
                    times.append(cupy.cuda.get_elapsed_time(start, end))
            median = float(np.median(times))
            rows.append(
                {
                    "batch": label,
                    "bytes": nbytes,
                    "host": kind,
                    "median_ms": median,
                    "gb_per_s": nbytes / median / 1e6,
                    "really_pinned": is_pinned if kind == "pinned" else None,
                }
            )
    return rows


# -- the run -----------------------------------------------------------------------------------
def gpu_present() -> bool:
    from fastoip import cuda
    from fastoip.backends.onnx import cuda_available

    return cuda.runtime() is not None and cuda_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window-ms", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--point-timeout", type=float, default=150.0, help="seconds for one fastoip bench run")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: CPU EP and system shm only, short")
    parser.add_argument("--parts", default="ep,graph,h2d,shm")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    gpu = gpu_present()
    if not gpu and not args.dry_run:
        print("gpu_bench: no GPU (CUDA runtime with a device, and onnxruntime's CUDAExecutionProvider): use --dry-run")
        return 2
    levels = "1,16,64" if gpu else "1"
    results: dict[str, Any] = {
        "gpu": gpu,
        "dry_run": not gpu,
        "skipped": [],
        "ep": [],
        "h2d": [],
        "shm": [],
        "graph": [],
        "instance_kinds": {},
        "problems": [],
        "complete": False,
    }
    repo = args.out / "repo"
    started = time.monotonic()
    results["model_bytes"] = write_repository(repo)
    results["build_s"] = round(time.monotonic() - started, 1)
    print(f"gpu_bench: repository written in {results['build_s']} s: {results['model_bytes']}", flush=True)

    # first the few seconds of copies, then the servers: a run cut short keeps what it measured
    if "h2d" in parts:
        if gpu:
            shapes = {
                "mlp 64x256": (64, 256),
                "resnet50 16x3x224x224": (16, 3, 224, 224),
                "resnet50 64x3x224x224": (64, 3, 224, 224),
            }
            try:
                results["h2d"] = h2d_times(shapes)
            except Exception as exc:  # CuPy missing or a CUDA error: say so in the summary
                results["h2d"] = [{"error": f"{type(exc).__name__}: {exc}"}]
            save(args.out, results, started)
        else:
            results["skipped"].append("h2d: pinned vs pageable host-to-device copy of one batch, CUDA events (no GPU)")
    modes = ["cuda", "cpu"] if gpu else ["cpu"]
    if not gpu:
        results["skipped"].append("ep: mlp and resnet50 on the CUDA EP at c=1,16,64 (no GPU); CPU EP at c=1 only")
    for mode in modes if parts & {"ep", "graph", "shm"} else []:
        child = serve(repo, cpu_only=mode == "cpu", log=args.out / f"serve-{mode}.log")
        try:
            port = child.ports["grpc"]
            kinds = instance_kinds(port, ("mlp", "resnet50", "identity_602k", "identity_16m", "mlp_graph"))
            results["instance_kinds"][mode] = kinds
            want = "KIND_GPU" if mode == "cuda" else "KIND_CPU"
            wrong = {model: kind for model, kind in kinds.items() if kind != want}
            if wrong:
                results["problems"].append(f"{mode} server: instance kinds {wrong}, expected {want}")
            if "ep" in parts:
                for model in ("mlp", "resnet50"):
                    measure(results, "ep", mode, port, model, levels, args, started)
            if "graph" in parts and (mode == "cuda" or not gpu):
                for pair in GRAPH_PAIRS:  # the plain model and its graph twin one after the other, at c=1
                    for model in pair:
                        measure(results, "graph", mode, port, model, "1", args, started,
                                graphs=model.endswith("_graph"))
            shm_here = mode == "cuda" or (not gpu and mode == "cpu")
            if "shm" in parts and shm_here:
                shm_kinds = ["cuda", "system", "none"] if gpu else ["system", "none"]
                for model in ("identity_602k", "identity_16m"):
                    for shm in shm_kinds:
                        measure(results, "shm", mode, port, model, "1,16" if gpu else "1", args, started, shm=shm)
        finally:
            child.stop()
    if not gpu and "graph" in parts:
        results["skipped"].append("graph: CUDA graphs at c=1 on the CUDA EP (no GPU: the twins ran as plain models)")
    if not gpu and "shm" in parts:
        results["skipped"].append("shm: --shared-memory cuda on identity_602k and identity_16m at c=1,16 (no GPU)")
    results["complete"] = True
    save(args.out, results, started)
    print(markdown(results), flush=True)
    return 0 if results["passed"] else 1


def save(out: Path, results: dict[str, Any], started: float) -> None:
    """gpu_bench.json and gpu_bench.md as they stand (after each model too: a run cut short keeps its rows)."""
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    failed = [
        row for part in ("ep", "graph", "shm", "h2d") for row in results[part] if row.get("error") or row.get("errors")
    ]
    results["passed"] = bool(results.get("complete")) and not failed and not results["problems"]
    (out / "gpu_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "gpu_bench.md").write_text(markdown(results))


def _cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _graphs_cell(row: dict[str, Any]) -> str:
    if not row["graphs"]:
        return "no"
    return "yes" if row["ep"] == "cuda" else "asked (none on the CPU EP)"


def _ms(microseconds: float | None) -> float | None:
    return None if microseconds is None else microseconds / 1000


Cells = Callable[[dict[str, Any]], list[str]]

#: Each part's table: (part, title, header, the cells of a measured row, the cells before a failed row's error).
TABLES: tuple[tuple[str, str, str, Cells, Cells], ...] = (
    (
        "ep",
        "CUDA EP vs CPU EP (gRPC, fastoip bench)",
        "| model | EP | c | infer/s | p99 ms | avg batch | errors |",
        lambda row: [row["model"], row["ep"], str(row["concurrency"]), _cell(row["infer_per_s"], 1),
                     _cell(_ms(row["p99_us"]), 2), _cell(row["avg_batch"], 2), str(row["errors"])],
        lambda row: [row["model"], row["ep"], "-"],
    ),
    (
        "graph",
        "CUDA graphs vs the plain CUDA EP, c=1 (gRPC, fastoip bench)",
        "| model | EP | CUDA graphs | infer/s | p50 ms | p99 ms | errors |",
        lambda row: [row["model"], row["ep"], _graphs_cell(row), _cell(row["infer_per_s"], 1),
                     _cell(_ms(row.get("p50_us")), 3), _cell(_ms(row["p99_us"]), 3), str(row["errors"])],
        lambda row: [row["model"], row["ep"], str(row["graphs"])],
    ),
    (
        "h2d",
        "Host-to-device copy of one batch (CUDA events, median of 20)",
        "| batch | bytes | host memory | ms | GB/s |",
        lambda row: [row["batch"], f"{row['bytes']:,}",
                     row["host"] + ("" if row["really_pinned"] in (None, True) else " (NOT pinned: fell back)"),
                     f"{row['median_ms']:.3f}", f"{row['gb_per_s']:.1f}"],
        lambda row: [],
    ),
    (
        "shm",
        "Shared memory vs tensor bytes in the request (gRPC, identity models)",
        "| model | EP | shm | c | infer/s | p99 ms | errors |",
        lambda row: [row["model"], row["ep"], row["shm"], str(row["concurrency"]), _cell(row["infer_per_s"], 1),
                     _cell(_ms(row["p99_us"]), 2), str(row["errors"])],
        lambda row: [row["model"], row["ep"], row["shm"], "-"],
    ),
)


def _table(title: str, header: str, rows: list[dict[str, Any]], cells: Cells, before_error: Cells) -> list[str]:
    """One part's Markdown table; a row that failed is its first cells, the error, and empty cells to the end."""
    width = header.count("|") - 1
    lines = [f"### {title}", "", header, "|" + "---|" * width]
    for row in rows:
        if "error" in row:
            filled = [*before_error(row), f"ERROR: {row['error'][:200]}"]
            lines.append("| " + " | ".join(filled) + " |" + " |" * (width - len(filled)))
        else:
            lines.append("| " + " | ".join(cells(row)) + " |")
    return [*lines, ""]


def markdown(results: dict[str, Any]) -> str:
    """The figures as Markdown tables, to paste into RESULTS.md."""
    verdict = "PASSED" if results["passed"] else "FAILED" if results.get("complete") else "INCOMPLETE (cut short)"
    lines = [
        f"## gpu_bench ({'GPU' if results['gpu'] else 'dry run, no GPU'}): {verdict} "
        f"after {results.get('elapsed_s')} s",
        "",
    ]
    lines += [f"- models (bytes): {results['model_bytes']}", f"- instance kinds: {results['instance_kinds']}", ""]
    lines += [f"- PROBLEM: {problem}" for problem in results["problems"]]
    for part, title, header, cells, before_error in TABLES:
        if results[part]:
            lines += _table(title, header, results[part], cells, before_error)
    for skipped in results["skipped"]:
        lines.append(f"- skipped: {skipped}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

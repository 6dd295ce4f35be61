"""Benchmark: ONNX Runtime intra-op threads, 1 against ORT's default (0: one per physical core).

fastoip used to pin every session to one intra-op thread; Triton's onnxruntime backend leaves
ORT's default unless the config's ``intra_op_thread_count`` says otherwise.  This script times
``InferenceSession.run`` directly (no server) with the session options fastoip's ``OnnxBackend``
sets (sequential execution, all graph optimisations, spinning off; ORT's own default, spinning on,
is timed too), for:

* ``mlp4x1024``: 4 layers of Gemm 1024x1024 + Relu, FP32, at batch 32 and batch 1 (compute-heavy);
* the demo models: ``simple`` (batch 1), ``mlp`` (256 -> 1024 -> 1024 -> 10, batch 1 and 32),
  ``image_identity`` (602 KB, batch 1).

Each (model, batch) is timed for both settings in alternation, several rounds, so both see the
same machine load; the median per-call time is reported.  Run:

    PYTHONPATH=src python benchmarks/bench_ort_threads.py [--seconds 0.5] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np


def mlp_4x1024() -> bytes:
    """INPUT0 FP32 [batch, 1024] -> 4 x (Gemm 1024x1024 -> Relu) -> OUTPUT0 FP32 [batch, 1024]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, initializers = [], []
    current = "INPUT0"
    for index in range(4):
        weight = (rng.standard_normal((1024, 1024)) / 32.0).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"W{index}"),
                         numpy_helper.from_array(np.zeros(1024, np.float32), f"B{index}")]
        out = "OUTPUT0" if index == 3 else f"h{index}"
        nodes += [helper.make_node("Gemm", [current, f"W{index}", f"B{index}"], [f"g{index}"]),
                  helper.make_node("Relu", [f"g{index}"], [out])]
        current = out
    graph = helper.make_graph(nodes, "mlp4x1024",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 1024])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1024])],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def session(model: bytes, intra: int, spin: bool = False) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def per_call(run: Callable[[], Any], seconds: float) -> float:
    run()
    calls, start = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def workloads() -> list[tuple[str, bytes, dict[str, np.ndarray]]]:
    from fastoip.demo import build_all

    demo = build_all()
    rng = np.random.default_rng(1)
    big = mlp_4x1024()
    return [
        ("mlp4x1024 b32", big, {"INPUT0": rng.standard_normal((32, 1024)).astype(np.float32)}),
        ("mlp4x1024 b1", big, {"INPUT0": rng.standard_normal((1, 1024)).astype(np.float32)}),
        ("demo mlp b32", demo["mlp"], {"INPUT0": rng.standard_normal((32, 256)).astype(np.float32)}),
        ("demo mlp b1", demo["mlp"], {"INPUT0": rng.standard_normal((1, 256)).astype(np.float32)}),
        ("simple b1", demo["simple"], {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                                       "INPUT1": np.ones((1, 16), np.int32)}),
        ("image_identity b1", demo["image_identity"],
         {"INPUT0": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per setting per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    rows = []
    print(f"cpus={os.cpu_count()}  median per-call time over {args.rounds} rounds of {args.seconds} s")
    print(f"{'workload':<20}{'1 thread us':>14}{'default us':>14}{'1/default':>11}{'default+spin us':>17}")
    for name, model, feeds in workloads():
        sessions = {"one": session(model, 1), "default": session(model, 0), "spin": session(model, 0, spin=True)}
        times: dict[str, list[float]] = {key: [] for key in sessions}
        for _ in range(args.rounds):
            for key, sess in sessions.items():
                times[key].append(per_call(partial(sess.run, None, feeds), args.seconds))
        one, default, spin = (statistics.median(times[key]) * 1e6 for key in ("one", "default", "spin"))
        rows.append({"workload": name, "one_thread_us": round(one, 1), "default_us": round(default, 1),
                     "speedup_default": round(one / default, 2), "default_spinning_us": round(spin, 1)})
        print(f"{name:<20}{one:>14.1f}{default:>14.1f}{one / default:>11.2f}{spin:>17.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

"""Benchmark: stateful and composed models (issue 14), each comparison in one run on one server.

Three parts, one fastoip process (pinned to SERVER_CPUS) serving one generated repository; the client
is this process (grpc.aio through ``tritonclient.grpc.aio``, pinned to CLIENT_CPUS):

* ``sequence``: an accumulator with implicit state (``tests/helpers/models.py``'s Triton dyna_sequence
  stand-in, UINT64 correlation ids), once with the ``direct`` strategy and once with ``oldest``
  (same model, same ``max_batch_size``).  ``--sequences`` concurrent sequences of ``--steps`` steps,
  each step sent when the previous answer came back; every answer is checked (the running sum).
  Reports steps/s, p50/p99 per step, and the server's average batch.
* ``ensemble``: pre-process (x0.5) -> the demo MLP -> post-process (ArgMax) as one ensemble call,
  against the client making the same three calls itself, closed loop at ``--conc`` for
  ``--duration`` seconds each; answers are checked against each other.
* ``cache``: the demo MLP with ``response_cache { enable: true }``: ``--cache-requests`` distinct
  requests sent once (all misses), then again (all hits), one at a time; reports client latency per
  phase and, from ModelStatistics, the server's request time per phase and the cache_hit / cache_miss
  (lookup, lookup + insert) times.

PyTriton is not measured for ``sequence``: its ``ModelConfig`` offers ``batching``, ``max_batch_size``,
``batcher`` (a DynamicBatcher), ``response_cache``, ``decoupled`` and warm-up, and no sequence batcher,
and it serves Python callables (not ONNX files), so Triton's sequence batcher cannot be configured
through it for the same model.  Run:

    python benchmarks/bench_stateful.py [--parts sequence,ensemble,cache] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import CLIENT_CPUS, ROOT, Fastoip, markdown_table  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "helpers"))
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.grpc.aio as aioclient  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from fastoip.demo import CONFIGS, build_mlp  # noqa: E402
from fastoip.launcher import parse_cpu_list  # noqa: E402
from models import accumulator_sequence_model_bytes, sequence_controls, write_model  # noqa: E402

SEQUENCE_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
STATE = 'state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "SCALED" value: "scaled" } },
  { model_name: "mlp" model_version: -1 input_map { key: "INPUT0" value: "scaled" }
    output_map { key: "OUTPUT0" value: "scores" } },
  { model_name: "argmax" model_version: -1 input_map { key: "SCORES" value: "scores" }
    output_map { key: "LABEL" value: "LABEL" } }
] }
"""


def small_model(name: str, nodes: list, inputs: list, outputs: list, initializers: list) -> bytes:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def write_repository(root: Path, max_batch_size: int) -> None:
    """Sequence models (direct, oldest), the ensemble and its steps, the cached MLP."""
    oldest = f"oldest {{ max_candidate_sequences: {max_batch_size} }}"
    for strategy, block in (("direct", "direct { }"), ("oldest", oldest)):
        write_model(root, f"seq_{strategy}", accumulator_sequence_model_bytes(TensorProto.UINT64), config=(
            f"max_batch_size: {max_batch_size}\n" + SEQUENCE_IO + "sequence_batching { "
            "max_sequence_idle_microseconds: 60000000 " + block + " "
            + sequence_controls("START", "END", "READY", "CORRID") + " " + STATE + " }\n"))
    fp32 = TensorProto.FLOAT
    write_model(root, "scale", small_model(
        "scale", [helper.make_node("Mul", ["INPUT0", "HALF"], ["SCALED"])],
        [helper.make_tensor_value_info("INPUT0", fp32, ["batch", 256])],
        [helper.make_tensor_value_info("SCALED", fp32, ["batch", 256])],
        [helper.make_tensor("HALF", fp32, [1], [0.5])]), config="max_batch_size: 64\n")
    write_model(root, "argmax", small_model(
        "argmax", [helper.make_node("ArgMax", ["SCORES"], ["LABEL"], axis=1, keepdims=1)],
        [helper.make_tensor_value_info("SCORES", fp32, ["batch", 10])],
        [helper.make_tensor_value_info("LABEL", TensorProto.INT64, ["batch", 1])], []), config="max_batch_size: 64\n")
    mlp = build_mlp().SerializeToString()
    write_model(root, "mlp", mlp, config=CONFIGS["mlp"])
    write_model(root, "mlp_cached", mlp, config=CONFIGS["mlp"].replace('"mlp"', '"mlp_cached"')
                + "response_cache { enable: true }\n")
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def statistics(url: str, model: str) -> dict[str, Any]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    pick = lambda key: (int(inference[key].get("count", 0)), int(inference[key].get("ns", 0)))  # noqa: E731
    return {"inference_count": int(stats.get("inference_count", 0)),
            "execution_count": int(stats.get("execution_count", 0)),
            **{key: pick(key) for key in ("success", "cache_hit", "cache_miss")}}


def delta(after: dict[str, Any], before: dict[str, Any], key: str) -> tuple[int, int]:
    return after[key][0] - before[key][0], after[key][1] - before[key][1]


# -- sequence -----------------------------------------------------------------------------------------
async def run_sequences(url: str, model: str, sequences: int, steps: int, first_id: int) -> dict[str, Any]:
    client = aioclient.InferenceServerClient(url)
    latencies: list[float] = []

    async def one(sequence_id: int) -> None:
        data = np.ones((1, 1), dtype=np.int32)
        for step in range(1, steps + 1):
            inputs = [aioclient.InferInput("INPUT", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(data)
            start = time.perf_counter()
            result = await client.infer(model, inputs, sequence_id=sequence_id, sequence_start=step == 1,
                                        sequence_end=step == steps)
            latencies.append(time.perf_counter() - start)
            expected = step + (sequence_id if step == steps else 0)  # the running sum, + the id at END
            got = int(result.as_numpy("OUTPUT")[0, 0])
            if got != expected:
                raise AssertionError(f"{model} sequence {sequence_id} step {step}: {got} != {expected}")

    before = statistics(url, model)
    start = time.perf_counter()
    await asyncio.gather(*(one(first_id + index) for index in range(sequences)))
    wall = time.perf_counter() - start
    after = statistics(url, model)
    await client.close()
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    return {"model": model, "steps": len(latencies), "seconds": round(wall, 3),
            "steps_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(percentile(latencies, 50) * 1e3, 3), "p99_ms": round(percentile(latencies, 99) * 1e3, 3),
            "avg_batch": round(inferences / executions, 2) if executions else 0.0}


# -- ensemble -------------------------------------------------------------------------------------------
def mlp_input(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((1, 256)).astype(np.float32)


async def ensemble_call(client: aioclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    inputs = [aioclient.InferInput("INPUT0", [1, 256], "FP32")]
    inputs[0].set_data_from_numpy(data)
    return (await client.infer("pipeline", inputs)).as_numpy("LABEL")


async def client_calls(client: aioclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    """The same pipeline as three calls: each step's output is the next call's input."""
    current = data
    for model, input_name, output_name in (("scale", "INPUT0", "SCALED"), ("mlp", "INPUT0", "OUTPUT0"),
                                           ("argmax", "SCORES", "LABEL")):
        inputs = [aioclient.InferInput(input_name, list(current.shape), "FP32")]
        inputs[0].set_data_from_numpy(current)
        current = (await client.infer(model, inputs)).as_numpy(output_name)
    return current


async def closed_loop(url: str, call: Any, conc: int, duration: float, warmup: float) -> dict[str, Any]:
    client = aioclient.InferenceServerClient(url)
    rng = np.random.default_rng(1)
    samples = [mlp_input(rng) for _ in range(64)]
    latencies: list[float] = []
    stop = time.perf_counter() + warmup + duration
    measure_from = time.perf_counter() + warmup

    async def worker(index: int) -> None:
        i = index
        while time.perf_counter() < stop:
            start = time.perf_counter()
            await call(client, samples[i % len(samples)])
            if start >= measure_from:
                latencies.append(time.perf_counter() - start)
            i += conc

    await asyncio.gather(*(worker(index) for index in range(conc)))
    await client.close()
    return {"requests": len(latencies), "req_per_s": round(len(latencies) / duration, 1),
            "p50_ms": round(percentile(latencies, 50) * 1e3, 3), "p99_ms": round(percentile(latencies, 99) * 1e3, 3)}


async def check_same_answers(url: str) -> None:
    client = aioclient.InferenceServerClient(url)
    rng = np.random.default_rng(2)
    for _ in range(8):
        data = mlp_input(rng)
        one, three = await ensemble_call(client, data), await client_calls(client, data)
        if not np.array_equal(one, three):
            raise AssertionError(f"ensemble {one} != three calls {three}")
    await client.close()


# -- cache ----------------------------------------------------------------------------------------------
async def cache_phases(url: str, requests: int) -> dict[str, Any]:
    client = aioclient.InferenceServerClient(url)
    rng = np.random.default_rng(3)
    samples = [mlp_input(rng) for _ in range(requests)]
    phases: dict[str, Any] = {}
    answers: dict[int, np.ndarray] = {}
    for phase in ("miss", "hit"):
        before = statistics(url, "mlp_cached")
        latencies = []
        for index, data in enumerate(samples):
            inputs = [aioclient.InferInput("INPUT0", [1, 256], "FP32")]
            inputs[0].set_data_from_numpy(data)
            start = time.perf_counter()
            output = (await client.infer("mlp_cached", inputs)).as_numpy("OUTPUT0")
            latencies.append(time.perf_counter() - start)
            if phase == "miss":
                answers[index] = output
            elif not np.array_equal(output, answers[index]):
                raise AssertionError(f"cached answer {index} differs")
        after = statistics(url, "mlp_cached")
        success, hit, miss = (delta(after, before, key) for key in ("success", "cache_hit", "cache_miss"))
        expected = (0, requests) if phase == "miss" else (requests, 0)
        if (hit[0], miss[0]) != expected:
            raise AssertionError(f"{phase} phase: {hit[0]} hits and {miss[0]} misses, expected {expected}")
        phases[phase] = {
            "client_p50_us": round(percentile(latencies, 50) * 1e6, 1),
            "client_mean_us": round(float(np.mean(latencies)) * 1e6, 1),
            "server_request_us": round(success[1] / success[0] / 1e3, 1),
            "cache_time_us": round((hit[1] if phase == "hit" else miss[1]) / requests / 1e3, 2),
        }
    await client.close()
    phases["hit_over_miss"] = {
        "server_request": round(phases["hit"]["server_request_us"] / phases["miss"]["server_request_us"], 3),
        "client_p50": round(phases["hit"]["client_p50_us"] / phases["miss"]["client_p50_us"], 3),
        "client_mean": round(phases["hit"]["client_mean_us"] / phases["miss"]["client_mean_us"], 3),
    }
    return phases


# -- driver ---------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="sequence,ensemble,cache")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--conc", type=int, default=16)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--cache-requests", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    parts = args.parts.split(",")
    os.sched_setaffinity(0, parse_cpu_list(CLIENT_CPUS))
    results: dict[str, Any] = {"server_cpus": os.environ.get("SERVER_CPUS", "0"), "client_cpus": CLIENT_CPUS}
    with tempfile.TemporaryDirectory(prefix="bench-stateful-") as tmp:
        root = Path(tmp)
        write_repository(root, args.sequences)
        server = Fastoip(root, "--cache-config", "local,size=104857600")
        try:
            url = server.grpc
            if "sequence" in parts:
                asyncio.run(run_sequences(url, "seq_direct", 4, 3, 1))  # warm-up, then one run each
                asyncio.run(run_sequences(url, "seq_oldest", 4, 3, 1))
                rows = [asyncio.run(run_sequences(url, f"seq_{strategy}", args.sequences, args.steps, 1000))
                        for strategy in ("direct", "oldest")]
                results["sequence"] = rows
                print(markdown_table(["model", "steps", "steps/s", "p50 ms", "p99 ms", "avg batch"],
                                     [[r["model"], r["steps"], r["steps_per_s"], r["p50_ms"], r["p99_ms"],
                                       r["avg_batch"]] for r in rows]))
                print(f"oldest / direct throughput: {rows[1]['steps_per_s'] / rows[0]['steps_per_s']:.2f}x\n")
            if "ensemble" in parts:
                asyncio.run(check_same_answers(url))
                one = asyncio.run(closed_loop(url, ensemble_call, args.conc, args.duration, args.warmup))
                three = asyncio.run(closed_loop(url, client_calls, args.conc, args.duration, args.warmup))
                ratio = one["req_per_s"] / three["req_per_s"]
                results["ensemble"] = {"conc": args.conc, "ensemble": one, "client_calls": three,
                                       "ratio": round(ratio, 2)}
                print(markdown_table(["variant", "c", "pipelines/s", "p50 ms", "p99 ms"],
                                     [[name, args.conc, r["req_per_s"], r["p50_ms"], r["p99_ms"]]
                                      for name, r in (("ensemble (1 call)", one), ("client (3 calls)", three))]))
                print(f"ensemble / client calls: {ratio:.2f}x (target >= 2x)\n")
            if "cache" in parts:
                phases = asyncio.run(cache_phases(url, args.cache_requests))
                results["cache"] = phases
                print(markdown_table(
                    ["phase", "client p50 us", "client mean us", "server request us", "cache lookup(+insert) us"],
                    [[phase, phases[phase]["client_p50_us"], phases[phase]["client_mean_us"],
                      phases[phase]["server_request_us"], phases[phase]["cache_time_us"]]
                     for phase in ("miss", "hit")]))
                print(f"hit / miss: {json.dumps(phases['hit_over_miss'])} (target <= 0.30)\n")
        finally:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

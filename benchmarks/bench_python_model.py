"""Benchmark: per-request overhead of a Python model against the ONNX identity, over gRPC.

One fastoip process serves two models with the same signature
(INPUT0 FP32 [-1, 16] -> OUTPUT0):

* ``identity_fp32``: the ONNX Identity graph (onnxruntime), as in the demo repository;
* ``py_identity``: a ``fastoip.Model`` whose ``predict`` returns its input.

Neither has a dynamic batcher, so every request is one execution and the
difference between the two is what the Python backend adds per request:
content-type decoding, the call into user code, output encoding.  Each model
is driven in turn, closed loop at ``--concurrency`` (default 16), with the
same pre-encoded ModelInferRequest bytes, by either

* ``grpc`` (default): grpcio futures on raw channel methods (no protobuf
  object per request), ``--channels`` TCP connections; or
* ``h2load``: nghttp2's HTTP/2 load generator speaking gRPC framing
  (``/usr/bin/h2load``; much lighter than a Python client).

Every response of the grpc driver is checked (status OK and the echoed
bytes); with h2load one tritonclient call per model checks the answer first.
Reports requests/s per model, the ratio, and the extra server time per
request implied by the two rates.  Run:

    PYTHONPATH=src python benchmarks/bench_python_model.py [--duration 10] [--driver h2load] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastoip.launcher import ChildProcess, parse_cpu_list

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
MODELS = ("identity_fp32", "py_identity")

PY_IDENTITY = '''
import fastoip


class Identity(fastoip.Model):
    def predict(self, inputs, parameters):
        return {"OUTPUT0": inputs["INPUT0"]}
'''

CONFIG = '''
name: "{name}"
{backend}
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
'''


def write_repository(root: Path, instances: int) -> Path:
    from onnx import TensorProto

    from fastoip.demo import build_identity

    onnx_dir = root / "identity_fp32"
    (onnx_dir / "1").mkdir(parents=True)
    (onnx_dir / "1" / "model.onnx").write_bytes(
        build_identity("identity_fp32", TensorProto.FLOAT, [16]).SerializeToString()
    )
    (onnx_dir / "config.pbtxt").write_text(
        CONFIG.format(name="identity_fp32", backend='platform: "onnxruntime_onnx"', instances=instances)
    )
    py_dir = root / "py_identity"
    (py_dir / "1").mkdir(parents=True)
    (py_dir / "1" / "model.py").write_text(PY_IDENTITY)
    py_config = CONFIG.format(name="py_identity", backend='backend: "python"', instances=instances)
    (py_dir / "config.pbtxt").write_text(py_config)
    return root


def request_bytes(model: str, data: np.ndarray) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend(data.shape)
    request.raw_input_contents.append(data.tobytes())
    request.outputs.add().name = "OUTPUT0"
    return request.SerializeToString()


#: The server on one CPU and h2load on the other, as every side-by-side run here (override with env).
SERVER_CPUS = os.environ.get("SERVER_CPUS", "0")
CLIENT_CPUS = os.environ.get("CLIENT_CPUS", "1")


def pin(cpus: str) -> list[str]:
    """A ``taskset`` prefix when the machine has more than one CPU and taskset exists."""
    if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
        return ["taskset", "-c", cpus]
    return []


class Server(ChildProcess):
    """``fastoip serve`` on a free loopback port (the shared launcher), pinned to SERVER_CPUS where there are two."""

    def __init__(self, repository: Path, extra: list[str]) -> None:
        src = str(Path(__file__).resolve().parents[1] / "src")
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        argv = [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(repository),
                "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "-1", "--metrics-port", "-1",
                "--log-level", "WARNING", *extra]
        cpus = parse_cpu_list(SERVER_CPUS) if (os.cpu_count() or 1) > 1 else None
        super().__init__(argv, env=env, cpus=cpus, keep_lines=200)
        self.start(timeout=120)
        self.port = self.ports["grpc"]

    def stop(self, timeout: float = 60.0, *, first_signal: int = signal.SIGTERM, group: bool = False) -> int | None:
        return super().stop(timeout, first_signal=first_signal, group=group)


def check_model(port: int, model: str, data: np.ndarray) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    out = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    if not np.array_equal(out, data):
        raise RuntimeError(f"{model} answered wrongly")


def drive_grpc(port: int, payload: bytes, expected: bytes, concurrency: int, channels: int,
               warmup: float, duration: float) -> dict[str, Any]:
    """Closed loop: ``concurrency`` requests always outstanding, re-sent from each completion callback."""
    import grpc

    stubs: list[grpc.UnaryUnaryMultiCallable[bytes, bytes]] = []
    for index in range(channels):
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.use_local_subchannel_pool", 1), ("bench.channel", index)],
        )
        stubs.append(channel.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None))
    lock = threading.Lock()
    state = {"measuring": False, "stop": False, "done": 0, "errors": 0, "bad": 0, "latency_ns": 0}
    finished = threading.Semaphore(0)

    def send(slot: int) -> None:
        started = time.perf_counter_ns()
        future = stubs[slot % channels].future(payload, timeout=30)
        future.add_done_callback(lambda f: on_done(f, slot, started))

    def on_done(future: Any, slot: int, started: int) -> None:
        elapsed = time.perf_counter_ns() - started
        ok = future.code() == grpc.StatusCode.OK
        good = ok and expected in future.result()
        with lock:
            if state["measuring"]:
                state["done"] += 1
                state["latency_ns"] += elapsed
                state["errors"] += not ok
                state["bad"] += ok and not good
            stop = state["stop"]
        if stop:
            finished.release()
        else:
            send(slot)

    for slot in range(concurrency):
        send(slot)
    time.sleep(warmup)
    with lock:
        state["measuring"] = True
    start = time.perf_counter()
    time.sleep(duration)
    with lock:
        state["measuring"] = False
        state["stop"] = True
    elapsed = time.perf_counter() - start
    for _ in range(concurrency):
        finished.acquire(timeout=30)
    done = state["done"]
    return {
        "requests": done,
        "seconds": elapsed,
        "rps": done / elapsed,
        "mean_latency_ms": state["latency_ns"] / max(done, 1) / 1e6,
        "errors": state["errors"] + state["bad"],
    }


def drive_h2load(port: int, payload: bytes, concurrency: int, channels: int,
                 warmup: float, duration: float) -> dict[str, Any]:
    framed = b"\x00" + len(payload).to_bytes(4, "big") + payload
    with tempfile.NamedTemporaryFile(suffix=".grpc", delete=False) as handle:
        handle.write(framed)
        data_file = handle.name
    try:
        clients = max(1, min(channels, concurrency))
        streams = max(1, concurrency // clients)
        command = [
            *pin(CLIENT_CPUS), "h2load", "-c", str(clients), "-m", str(streams), "-t", "1",
            "--warm-up-time", f"{int(warmup * 1000)}ms", "-D", f"{int(duration * 1000)}ms",
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", data_file,
            f"http://127.0.0.1:{port}{INFER_METHOD}",
        ]
        out = subprocess.run(command, capture_output=True, text=True, timeout=duration + warmup + 60)
        text = out.stdout + out.stderr
        rps = re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", text)
        succeeded = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", text)
        if out.returncode != 0 or rps is None or succeeded is None:
            raise RuntimeError(f"h2load failed:\n{text}")
        mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", text)
        return {
            "requests": int(succeeded.group(1)),
            "rps": float(rps.group(1)),
            "mean_latency": mean.group(1) if mean else "",
            "errors": int(succeeded.group(2)) + int(succeeded.group(3)),
        }
    finally:
        os.unlink(data_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per model")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--channels", type=int, default=4, help="TCP connections of the client")
    parser.add_argument("--instances", type=int, default=1, help="instance_group count of both models")
    parser.add_argument("--driver", choices=("grpc", "h2load"), default="grpc")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the two models this many times")
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for fastoip serve")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.driver == "h2load" and shutil.which("h2load") is None:
        parser.error("h2load is not installed")

    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    results: dict[str, list[dict]] = {model: [] for model in MODELS}
    with tempfile.TemporaryDirectory(prefix="fastoip-bench-py-") as tmp:
        server = Server(write_repository(Path(tmp), args.instances), args.server_arg)
        try:
            for model in MODELS:
                check_model(server.port, model, data)
            for _ in range(args.rounds):
                for model in MODELS:
                    payload = request_bytes(model, data)
                    if args.driver == "grpc":
                        found = drive_grpc(server.port, payload, data.tobytes(), args.concurrency, args.channels,
                                           args.warmup, args.duration)
                    else:
                        found = drive_h2load(server.port, payload, args.concurrency, args.channels,
                                             args.warmup, args.duration)
                    results[model].append(found)
                    print(f"{model:14s} {found['rps']:9.0f} req/s  errors {found['errors']}", flush=True)
        finally:
            server.stop()

    best = {model: max(r["rps"] for r in runs) for model, runs in results.items()}
    ratio = best["py_identity"] / best["identity_fp32"]
    extra_us = (1 / best["py_identity"] - 1 / best["identity_fp32"]) * 1e6
    difference = f"{extra_us:.0f} us more" if extra_us >= 0 else f"{-extra_us:.0f} us less"
    print(f"\npython / onnx throughput: {ratio:.2f}  (the Python model costs {difference} server time per "
          f"request than the ONNX one at concurrency {args.concurrency}; best of {args.rounds} round(s), "
          f"{args.driver} driver)")
    if args.json:
        args.json.write_text(json.dumps({
            "driver": args.driver, "concurrency": args.concurrency, "duration_s": args.duration,
            "instances": args.instances, "machine": platform.platform(), "cpus": os.cpu_count(),
            "results": results, "best_rps": best, "ratio": ratio, "extra_us_per_request": extra_us,
        }, indent=2))
    return 0 if all(r["errors"] == 0 for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: fastoip's native codec against protobuf-python + numpy.

For each workload one "message" is what a server does per inference call
around the model: parse the ModelInferRequest wire bytes, get the input
tensors as numpy arrays, build the ModelInferResponse carrying the same
tensors as outputs (an identity model, so only the codec is measured) and
serialise it.

* protobuf path: ``ModelInferRequest.FromString`` (upb), ``np.frombuffer`` on
  each ``raw_input_contents`` entry, a ``ModelInferResponse`` filled with
  ``tobytes()`` of each array, ``SerializeToString()``.
* codec path: ``decode_infer_request`` (zero-copy views), ``InferResponse``
  of ``InferOutput`` objects, ``encode_infer_response``.

Each path is timed timeit-style: the loop count is calibrated to ~0.1 s per
run, the two paths are run in alternation for several repeats (so both see the
same machine load) and the median per-message time is reported (the minimum
goes to the JSON too).  Run:

    PYTHONPATH=src python benchmarks/bench_codec.py [--repeat 7] [--json out.json]

``--against OTHER/_codec*.so`` also times another build of the codec (say the
previous commit's) in alternation with this one, in the same process, and
prints this build's time over the other's: an A/B of a codec change that the
machine's load cannot skew.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import timeit
from collections.abc import Callable
from functools import partial
from types import ModuleType

import numpy as np
from google.protobuf.internal import api_implementation
from tritonclient.grpc import service_pb2 as pb

from fastoip import _codec
from fastoip._codec import decode_infer_request, encode_infer_response
from fastoip.datatypes import NUMPY_DTYPES
from fastoip.types import InferOutput, InferResponse


def make_request(inputs: list[tuple[str, str, list[int], np.ndarray]], outputs: list[str]) -> bytes:
    """ModelInferRequest bytes as tritonclient sends them (raw_input_contents)."""
    req = pb.ModelInferRequest(model_name="simple", id="42")
    for name, datatype, shape, array in inputs:
        tensor = req.inputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(shape)
        req.raw_input_contents.append(array.tobytes())
    for name in outputs:
        req.outputs.add().name = name
    return req.SerializeToString()


def protobuf_path(data: bytes, output_names: tuple[str, ...]) -> bytes:
    req = pb.ModelInferRequest.FromString(data)
    arrays = [
        np.frombuffer(raw, dtype=NUMPY_DTYPES[tensor.datatype]).reshape(tuple(tensor.shape))
        for tensor, raw in zip(req.inputs, req.raw_input_contents, strict=True)
    ]
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version=req.model_version, id=req.id)
    for name, tensor, array in zip(output_names, req.inputs, arrays, strict=True):
        out = resp.outputs.add()
        out.name = name
        out.datatype = tensor.datatype
        out.shape.extend(array.shape)
        resp.raw_output_contents.append(array.tobytes())
    return resp.SerializeToString()


def codec_path(data: bytes, output_names: tuple[str, ...]) -> bytes:
    req = decode_infer_request(data)
    outputs = [
        InferOutput(name, tensor.datatype, tensor.shape, tensor.data)
        for name, tensor in zip(output_names, req.inputs, strict=True)
    ]
    return encode_infer_response(
        InferResponse(req.model_name, req.model_version, req.id, None, outputs)
    )


def load_codec(path: str) -> ModuleType:
    """Another build of ``fastoip._codec`` (a compiled file), loaded beside the imported one."""
    spec = importlib.util.spec_from_file_location("fastoip._codec", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against: {path} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def codec_path_of(codec: ModuleType, data: bytes, output_names: tuple[str, ...]) -> bytes:
    """codec_path through the functions of ``codec``."""
    req = codec.decode_infer_request(data)
    outputs = [
        InferOutput(name, tensor.datatype, tensor.shape, tensor.data)
        for name, tensor in zip(output_names, req.inputs, strict=True)
    ]
    response = InferResponse(req.model_name, req.model_version, req.id, None, outputs)
    return bytes(codec.encode_infer_response(response))


def codec_parse_of(codec: ModuleType, data: bytes) -> list[np.ndarray | None]:
    return [tensor.data for tensor in codec.decode_infer_request(data).inputs]


def protobuf_parse(data: bytes) -> list[np.ndarray]:
    req = pb.ModelInferRequest.FromString(data)
    return [
        np.frombuffer(raw, dtype=NUMPY_DTYPES[tensor.datatype]).reshape(tuple(tensor.shape))
        for tensor, raw in zip(req.inputs, req.raw_input_contents, strict=True)
    ]


def codec_parse(data: bytes) -> list[np.ndarray | None]:  # None: a tensor whose data is in shared memory
    return [tensor.data for tensor in decode_infer_request(data).inputs]


def calibrate(fn: Callable[[], object], target: float = 0.1) -> int:
    """Loop count that makes one timed run take about ``target`` seconds."""
    number, elapsed = timeit.Timer(fn).autorange()
    return max(1, int(number * target / max(elapsed, 1e-9)))


def time_pair(
    fn_a: Callable[[], object], fn_b: Callable[[], object], repeat: int
) -> tuple[list[float], list[float]]:
    """Seconds per call of two functions, timed in alternation so that both see the same load."""
    timer_a, timer_b = timeit.Timer(fn_a), timeit.Timer(fn_b)
    n_a, n_b = calibrate(fn_a), calibrate(fn_b)
    runs_a, runs_b = [], []
    for _ in range(repeat):
        runs_a.append(timer_a.timeit(n_a) / n_a)
        runs_b.append(timer_b.timeit(n_b) / n_b)
    return runs_a, runs_b


def workloads() -> dict[str, tuple[bytes, tuple[str, ...]]]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    simple = make_request(
        [("INPUT0", "INT32", [1, 16], a), ("INPUT1", "INT32", [1, 16], a * 2)],
        ["OUTPUT0", "OUTPUT1"],
    )
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    large = make_request([("INPUT0", "FP32", [1, 3, 224, 224], image)], ["OUTPUT0"])
    return {
        "simple INT32 2x[1,16]": (simple, ("OUTPUT0", "OUTPUT1")),
        "FP32 [1,3,224,224] (602,112 B)": (large, ("OUTPUT0",)),
    }


def check_equivalent(data: bytes, names: tuple[str, ...]) -> None:
    """Both paths must produce the same response message."""
    ours = pb.ModelInferResponse.FromString(codec_path(data, names))
    theirs = pb.ModelInferResponse.FromString(protobuf_path(data, names))
    assert ours == theirs, "codec and protobuf responses differ"
    assert codec_path(data, names) == protobuf_path(data, names), "serialized bytes differ"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="timed repeats per case (median)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--against", metavar="SO", help="another build of fastoip._codec to time beside this one")
    args = parser.parse_args(argv)
    if args.against:
        return compare_builds(load_codec(args.against), args.repeat)

    results = []
    for label, (data, names) in workloads().items():
        check_equivalent(data, names)
        cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("parse+serialise", partial(protobuf_path, data, names), partial(codec_path, data, names)),
            ("parse only", partial(protobuf_parse, data), partial(codec_parse, data)),
        ]
        for what, pb_fn, codec_fn in cases:
            pb_runs, c_runs = time_pair(pb_fn, codec_fn, args.repeat)
            pb_med, pb_min = statistics.median(pb_runs), min(pb_runs)
            c_med, c_min = statistics.median(c_runs), min(c_runs)
            results.append({
                "workload": label,
                "case": what,
                "message_bytes": len(data),
                "protobuf_us": pb_med * 1e6,
                "protobuf_min_us": pb_min * 1e6,
                "codec_us": c_med * 1e6,
                "codec_min_us": c_min * 1e6,
                "speedup": pb_med / c_med,
            })

    header = f"{'workload':32} {'case':16} {'protobuf+numpy µs':>18} {'codec µs':>10} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['workload']:32} {r['case']:16} {r['protobuf_us']:18.2f} {r['codec_us']:10.2f} "
              f"{r['speedup']:7.2f}x")
    print(f"(median of {args.repeat} repeats; python {platform.python_version()}, numpy "
          f"{np.__version__}, protobuf {api_implementation.Type()} backend)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "python": platform.python_version(),
                "numpy": np.__version__,
                "protobuf_backend": api_implementation.Type(),
                "machine": platform.machine(),
                "repeat": args.repeat,
                "results": results,
            }, f, indent=2)
    return 0


def compare_builds(other: ModuleType, repeat: int) -> int:
    """This build against ``other``, case by case, timed in alternation: median time ratio this / other."""
    print(f"this build: {_codec.__file__}\nother build: {other.__file__}")
    header = f"{'workload':32} {'case':16} {'other µs':>10} {'this µs':>10} {'this/other':>11} {'(min)':>7}"
    print(header)
    print("-" * len(header))
    for label, (data, names) in workloads().items():
        assert codec_path_of(other, data, names) == codec_path(data, names), "the two builds answer differently"
        # both through the same Python code, so only the builds differ
        cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("parse+serialise",
             partial(codec_path_of, other, data, names), partial(codec_path_of, _codec, data, names)),
            ("parse only", partial(codec_parse_of, other, data), partial(codec_parse_of, _codec, data)),
        ]
        for what, other_fn, this_fn in cases:
            other_runs, this_runs = time_pair(other_fn, this_fn, repeat)
            other_med, this_med = statistics.median(other_runs), statistics.median(this_runs)
            ratio_min = min(this_runs) / min(other_runs)
            print(f"{label:32} {what:16} {other_med * 1e6:10.2f} {this_med * 1e6:10.2f} {this_med / other_med:10.3f}x "
                  f"{ratio_min:6.3f}x")
    print(f"(median, and min, of {repeat} alternating repeats in one process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (issue "Triton drop-in"): plain gRPC vs streaming vs system shared memory, in one run.

One fastoip on the demo repository, pinned to SERVER_CPUS (default CPU 0); `fastoip bench` pinned to
CLIENT_CPUS (default CPU 1) drives, in turn:

* ``image_identity`` (FP32 [1,3,224,224], 602,112 bytes in and out) at concurrency 1 and 16:
  plain unary ModelInfer, ModelStreamInfer, and unary with inputs and outputs in system shared memory;
* ``simple`` at concurrency 64: unary vs streaming.

Reports requests/s, payload bytes/s (input + output bytes moved per second) and the ratios the issue
targets: shared memory >= 3x plain gRPC in bytes/s at c=16; streaming >= 1.2x unary on simple at c=64.

    python benchmarks/bench_drop_in.py [--window-ms 3000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _harness import Fastoip, fastoip_bench, markdown_table  # noqa: E402

IMAGE_BYTES = 602_112 * 2  # in + out per request


def point(url: str, model: str, concurrency: int, window_ms: int, *extra: str) -> dict:
    result = fastoip_bench(
        url, "-m", model, "--concurrency-range", f"{concurrency}:{concurrency}:1",
        "-p", str(window_ms), "--max-trials", "6", "--warmup-ms", "1000", *extra,
    )
    row = result["results"][0]
    return {
        "req_per_s": row["throughput_req_per_s"],
        "p50_ms": (row["latency_us"]["p50"] or 0) / 1000,
        "p99_ms": (row["latency_us"]["p99"] or 0) / 1000,
        "errors": sum(row["errors"].values()),
        "stable": row["stable"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes = {"plain": (), "streaming": ("--streaming",), "shared memory": ("--shared-memory", "system")}
    results: dict = {"image_identity": {}, "simple": {}}
    with Fastoip(None) as server:
        url = f"grpc://{server.grpc}"
        for concurrency in (1, 16):
            for name, extra in modes.items():
                r = point(url, "image_identity", concurrency, args.window_ms, *extra)
                r["MB_per_s"] = r["req_per_s"] * IMAGE_BYTES / 1e6
                results["image_identity"][f"{name} c={concurrency}"] = r
                print(f"image_identity {name:14s} c={concurrency:<3d} {r['req_per_s']:8.0f} req/s "
                      f"{r['MB_per_s']:8.0f} MB/s p99 {r['p99_ms']:.2f} ms errors {r['errors']}", flush=True)
        for name in ("plain", "streaming"):
            r = point(url, "simple", 64, args.window_ms, *modes[name])
            results["simple"][f"{name} c=64"] = r
            print(f"simple {name:14s} c=64  {r['req_per_s']:8.0f} req/s p99 {r['p99_ms']:.2f} ms "
                  f"errors {r['errors']}", flush=True)
    image = results["image_identity"]
    simple = results["simple"]
    ratios = {
        "shm / plain bytes/s, c=16": image["shared memory c=16"]["MB_per_s"] / image["plain c=16"]["MB_per_s"],
        "shm / plain bytes/s, c=1": image["shared memory c=1"]["MB_per_s"] / image["plain c=1"]["MB_per_s"],
        "streaming / plain, image c=16": image["streaming c=16"]["req_per_s"] / image["plain c=16"]["req_per_s"],
        "streaming / unary, simple c=64": simple["streaming c=64"]["req_per_s"] / simple["plain c=64"]["req_per_s"],
    }
    named = [*((f"image_identity {k}", v) for k, v in image.items()), *((f"simple {k}", v) for k, v in simple.items())]
    rows = [[k, f"{v['req_per_s']:.0f}", f"{v.get('MB_per_s', 0):.0f}", f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f}",
             v["errors"]] for k, v in named]
    print()
    print(markdown_table(["point", "req/s", "MB/s (in+out)", "p50 / p99 ms", "errors"], rows))
    print()
    print(markdown_table(["ratio", "value"], [[k, f"{v:.2f}x"] for k, v in ratios.items()]))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

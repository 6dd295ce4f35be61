#!/usr/bin/env python3
"""OpenAI routes: fastoip against LitServe's OpenAI specs on the same models, one CPU for each server (issue 40).

    python3 benchmarks/bench_openai.py [--duration 30] [--conc 64] [--no-peer]

- Models: the demo's OpenAI examples (``fastoip.demo_openai``): ``tiny_embedder`` (byte tokens -> ONNX encoder,
  mean pooling, unit length) and ``tiny_chat`` (a word generator streaming one word a response).
- fastoip: ``fastoip serve`` on those, pinned to SERVER_CPUS (default 0).
- LitServe: ``OpenAIEmbeddingSpec`` over the same ONNX file with the same tokenisation and pooling (numpy, ONNX
  Runtime), and ``OpenAISpec`` over the same generator, each in a process pinned to SERVER_CPUS; installed into
  ``benchmarks/.work/venv-litserve`` (``pip install litserve onnxruntime numpy``) on first use.
- Load: ``fastoip bench openai`` pinned to CLIENT_CPUS (default 1): ``/v1/embeddings`` (one text a request) and
  streamed ``/v1/chat/completions`` (``max_tokens`` 64) at ``--conc`` connections.
- Reported per server: requests/s, latency p50/p99; chat: time to first token, inter-token latency, tokens/s;
  and the server's CPU milliseconds per request (its processes' utime + stime over the window, /proc), the share
  of a CPU it got, and what it served per second of its CPU (tokens, or requests for embeddings): on a machine
  shared with other work the share varies between runs and servers, the work per CPU-second does not.
- Also fastoip's ``/v2/models/tiny_chat/generate_stream`` with the same prompt and ``max_tokens``: the CPU per
  request of the OpenAI route against it is the translation's cost (issue 40's goal: at most 1.2x).

Results are printed as a markdown table and written to ``benchmarks/.work/results/openai-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from _harness import CLIENT_CPUS, PYTHON, ROOT, SERVER_CPUS, Fastoip, env, markdown_table

WORK = ROOT / "benchmarks" / ".work"
LITSERVE_VENV = WORK / "venv-litserve"

LITSERVE_SERVER = '''"""LitServe's OpenAI specs over fastoip's demo models (written by benchmarks/bench_openai.py)."""
import random
import sys
import zlib

import litserve as ls
import numpy as np
import onnxruntime as ort

WORDS = (WORDS_HERE)


class Embedder(ls.LitAPI):
    def setup(self, device):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(sys.argv[3], options, providers=["CPUExecutionProvider"])

    def predict(self, texts):
        if isinstance(texts, str):  # the spec hands over one input as itself
            texts = [texts]
        tokens = [[1, *(b + 3 for b in t[:256].encode()[:254]), 2] for t in texts]
        length = 8
        while length < max(len(t) for t in tokens):
            length *= 2
        ids = np.zeros((len(tokens), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, t in enumerate(tokens):
            ids[row, : len(t)] = t
            mask[row, : len(t)] = 1
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.tolist()


class Chat(ls.LitAPI):
    def setup(self, device):
        pass

    def predict(self, prompt, context=None):
        text = str(prompt)
        start = zlib.crc32(text.encode())
        rng = random.Random()
        for index in range(64):
            yield (" " if index else "") + rng.choice(WORDS)


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "embeddings":
        server = ls.LitServer(Embedder(spec=ls.OpenAIEmbeddingSpec()), accelerator="cpu")
    else:
        server = ls.LitServer(Chat(spec=ls.OpenAISpec()), accelerator="cpu")
    server.run(port=port, host="127.0.0.1", generate_client_file=False)
'''


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its children still running (its worker processes)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for one in pids:
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bench(kind: str, url: str, model: str, conc: int, duration: float, *extra: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    argv = ["taskset", "-c", CLIENT_CPUS, PYTHON, "-m", "fastoip.cli", "bench", "openai", kind, url, "-m", model,
            "--concurrency-range", str(conc), "--duration", str(duration), "--json", path, *extra]
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=duration + 300)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"fastoip bench openai failed:\n{done.stdout}\n{done.stderr}")
    level = json.loads(Path(path).read_text())["levels"][0]
    os.unlink(path)
    return level


def measured(pid: int, run: Callable[[], dict], duration: float) -> dict:
    """``run()``'s level, with the server's CPU milliseconds per request over it."""
    before = cpu_seconds(pid)
    level = run()
    spent = cpu_seconds(pid) - before
    # the level's own length: its last requests end after ``duration`` (a slow server's later)
    seconds = level.get("seconds") or duration
    level["cpu_ms_per_request"] = 1e3 * spent / max(level["requests_per_s"] * seconds, 1)
    # what one second of the server's CPU serves: on a machine shared with other work, a server's share of its
    # CPU varies from run to run (and between servers), this does not
    level["server_cpu_share"] = spent / seconds
    per_cpu_second = level.get("tokens_per_s") or level["requests_per_s"]
    level["per_cpu_second"] = per_cpu_second / max(level["server_cpu_share"], 1e-9)
    return level


def litserve_python() -> str:
    python = LITSERVE_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITSERVE_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "litserve", "onnxruntime", "numpy"],
                       check=True)
    return str(python)


def start_litserve(kind: str, model_file: Path) -> tuple[subprocess.Popen, str]:
    from fastoip.demo_openai import CHAT_MODEL

    words = CHAT_MODEL.split("WORDS = (", 1)[1].split(").split()", 1)[0] + ").split("
    script = WORK / "litserve_openai.py"
    script.write_text(LITSERVE_SERVER.replace("(WORDS_HERE)", "(" + words + ")"))
    port = free_port()
    # its own process group: LitServe's workers (multiprocessing) outlive a terminated server otherwise, and every
    # run left two servers' worth of them polling on SERVER_CPUS, taking that CPU from the next runs
    proc = subprocess.Popen(["taskset", "-c", SERVER_CPUS, litserve_python(), str(script), kind, str(port),
                             str(model_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError("LitServe did not start")


def stop_group(proc: subprocess.Popen) -> None:
    """End ``proc`` and everything it started (its process group): TERM, then KILL what is left."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)  # anyone left in the group?
            except ProcessLookupError:
                proc.wait(5)
                return
            proc.poll()  # (reap the leader, which would otherwise stay a member as a zombie)
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--conc", type=int, default=64)
    parser.add_argument("--no-peer", action="store_true", help="fastoip only (no LitServe)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from fastoip.demo_openai import write_openai_examples

    repository = write_openai_examples(WORK / "openai-repo")
    results: dict[str, dict] = {}
    server = Fastoip(repository, http=True)
    try:
        url = f"http://{server.http}"
        pid = server.proc.pid  # type: ignore[union-attr]
        results["fastoip embeddings"] = measured(pid, lambda: bench(
            "embeddings", url, "tiny_embedder", args.conc, args.duration), args.duration)
        results["fastoip chat"] = measured(pid, lambda: bench(
            "chat", url, "tiny_chat", args.conc, args.duration), args.duration)
        # the same generation through Triton's generate extension: what the OpenAI translation costs
        results["fastoip generate_stream"] = measured(pid, lambda: bench(
            "generate", url, "tiny_chat", args.conc, args.duration), args.duration)
    finally:
        server.stop()
    if not args.no_peer:
        for kind, key in (("embeddings", "litserve embeddings"), ("chat", "litserve chat")):
            proc, url = start_litserve(kind, repository / "tiny_embedder" / "1" / "model.onnx")
            try:
                model = "tiny_embedder" if kind == "embeddings" else "tiny_chat"
                load = partial(bench, kind, url, model, args.conc, args.duration)
                results[key] = measured(proc.pid, load, args.duration)
            finally:
                stop_group(proc)
    rows = [[name, f"{r['requests_per_s']:.0f}", f"{r['latency_p50_ms']:.1f}", f"{r['latency_p99_ms']:.1f}",
             f"{r.get('tokens_per_s', 0):.0f}", f"{r.get('ttft_p50_ms', 0):.1f}", f"{r.get('itl_p50_ms', 0):.2f}",
             f"{r['cpu_ms_per_request']:.2f}", f"{100 * r['server_cpu_share']:.0f} %", f"{r['per_cpu_second']:.0f}",
             r["errors"] or ""] for name, r in results.items()]
    print(markdown_table(["server", "req/s", "p50 ms", "p99 ms", "tokens/s", "TTFT p50 ms", "ITL p50 ms",
                          "CPU ms/req", "server CPU", "tokens (req) per CPU-s", "errors"], rows))
    out = WORK / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "openai-latest.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

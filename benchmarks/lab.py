#!/usr/bin/env python3
"""fastoip's side-by-side benchmark lab: one run, every server, the same load.

  python benchmarks/lab.py SUITE [--duration 10] [--conc 1,8,64] [--models ...] [--servers ...]
  python benchmarks/lab.py report RESULT.json        # re-render the markdown of a run
  python benchmarks/lab.py list                      # suites, servers, ports

Suites (defaults; --models/--conc/--servers narrow them):
  grpc-e2e         fastoip vs the grpcio sync / aio fixed-response ceilings on simple and
                   image_identity, c=1,8,64 (+ kserve, mlserver, pytriton with --peers; + the C++
                   grpc++ server with --servers ...,grpc-cpp); `--transports grpc,stream` adds
                   fastoip-native's ModelStreamInfer, loaded by `fastoip bench --streaming`
  batching         mlp at c=1,16,64: fastoip with the dynamic batcher off / on (+ fastoip's
                   own simple), pytriton-db, kserve, mlserver-ab (peers off with --no-peers)
  frontend-choice  fastoip serve (sync grpcio) vs benchmarks/aio_frontend.py (grpc.aio +
                   uvloop, same codec + Core) on simple and image_identity, c=1,8,64
  http             wrk: V2 JSON on fastoip, kserve, mlserver; Triton binary extension on
                   fastoip; simple and image_identity, c=1,8,64

For every server in turn the driver starts it pinned to --server-cpus (default 0) in its
own session, waits until it is ready, probes it with the exact bytes the load generator
will send (outputs compared with onnxruntime's), runs a discarded warm-up, then per
concurrency C runs h2load (gRPC, C connections x 1 stream) or wrk (HTTP) pinned to
--client-cpus (default 1) for --duration seconds, verifies the successes, and stops the
server (SIGINT, then SIGTERM / SIGKILL to its process group).  Results (JSON + markdown
with ratios and the suite's targets) go to benchmarks/.work/results/.

The peer servers, the ceilings, the models and the payloads come from the peers lab
(FASTOIP_PEERS_DIR, default <repo>/../shared/peers): this driver calls its scripts,
it does not copy them.  Run benchmarks/setup.sh once first.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, ".work")
BASE_PY = os.path.join(WORK, "venv-base", "bin", "python")


def _ensure_interpreter() -> None:
    """The driver needs numpy, grpcio and tritonclient: re-exec under the lab's base venv."""
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
        from tritonclient.grpc import service_pb2  # noqa: F401
    except ImportError:
        if os.path.exists(BASE_PY) and not os.environ.get("FASTOIP_LAB_REEXEC"):
            os.environ["FASTOIP_LAB_REEXEC"] = "1"
            os.execv(BASE_PY, [BASE_PY, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit(f"lab.py needs numpy, grpcio and tritonclient: run benchmarks/setup.sh (wants {BASE_PY})")


if __name__ == "__main__":
    _ensure_interpreter()

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from types import FrameType  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

import numpy as np  # noqa: E402

if TYPE_CHECKING:
    import grpc


def _repo_root() -> str:
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.path.dirname(HERE)


REPO = _repo_root()
sys.path.insert(0, os.path.join(REPO, "src"))  # the shared launcher (standard library only) from fastoip's tree
from fastoip.launcher import ChildProcess, parse_cpu_list  # noqa: E402

PEERS = os.path.abspath(os.environ.get("FASTOIP_PEERS_DIR") or os.path.join(REPO, "..", "shared", "peers"))
FASTOIP_PY = os.path.join(REPO, ".venv", "bin", "python")
VENV = {k: os.path.join(WORK, f"venv-{k}", "bin", "python") for k in ("base", "mlserver", "triton", "kserve")}
MODELS_DIR = os.path.join(WORK, "models")
PAYLOADS = os.path.join(WORK, "payloads")
BIN_PAYLOADS = os.path.join(WORK, "payloads-binary")
REPOS = os.path.join(WORK, "repos")
RESULTS = os.path.join(WORK, "results")
LOGS = os.path.join(WORK, "logs")
TMP = os.path.join(WORK, "tmp")
WRK_LUA = os.path.join(HERE, "wrk_infer.lua")
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
ALL_MODELS = ["simple", "identity_fp32", "mlp", "image_identity"]
NP_DTYPE = {"INT32": np.int32, "FP32": np.float32, "INT64": np.int64, "FP64": np.float64}
MAX_MSG = 256 << 20
CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


# ===================================================================== preparation
FASTOIP_CONFIGS = {
    # the demo repository's config for `simple` (fastoip.demo.CONFIGS): batchable, no batcher
    "simple": 'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n',
    "mlp-nobatch": ('name: "mlp"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
                    "instance_group [ { count: 1, kind: KIND_CPU } ]\n"),
    "mlp-batch": ('name: "mlp"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
                  "dynamic_batching {\n  max_queue_delay_microseconds: DELAY\n}\n"
                  "instance_group [ { count: 1, kind: KIND_CPU } ]\n"),
}


def run_checked(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def peers_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PEERS_WORK"] = WORK
    return env


def prepare(args: argparse.Namespace) -> None:
    """Models, payloads, binary HTTP bodies and fastoip repositories (idempotent)."""
    for d in (RESULTS, LOGS, TMP, REPOS, BIN_PAYLOADS):
        os.makedirs(d, exist_ok=True)
    if not os.path.isdir(PEERS):
        sys.exit(f"peers lab not found at {PEERS} (set FASTOIP_PEERS_DIR)")
    for tool in ("h2load", "wrk", "taskset", "timeout"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: run benchmarks/setup.sh")
    if not os.path.exists(os.path.join(MODELS_DIR, "manifest.json")):
        log("generating models with the peers' models.py")
        run_checked([VENV["base"], os.path.join(PEERS, "models.py"), "--out", MODELS_DIR], 300, env=peers_env())
    if not os.path.exists(os.path.join(PAYLOADS, "index.b1.json")):
        log("generating payloads with the peers' bench/payloads.py")
        run_checked([VENV["base"], os.path.join(PEERS, "bench", "payloads.py"), "--models-dir", MODELS_DIR,
                     "--out", PAYLOADS, "--batch", "1"], 600, env=peers_env())
    write_binary_bodies()
    write_fastoip_repos(args)


def write_binary_bodies() -> None:
    """Triton binary-extension bodies (JSON header + raw tensors) from the payloads' inputs."""
    manifest = json.load(open(os.path.join(MODELS_DIR, "manifest.json")))
    for model, spec in manifest.items():
        out = os.path.join(BIN_PAYLOADS, f"{model}.b1.bin")
        meta = out + ".json"
        npz = os.path.join(PAYLOADS, f"{model}.b1.npz")
        if os.path.exists(meta) and os.path.getmtime(meta) >= os.path.getmtime(npz):
            continue
        z = np.load(npz)
        inputs, raw = [], []
        for inp in spec["inputs"]:
            a = np.ascontiguousarray(z["in:" + inp["name"]])
            inputs.append({"name": inp["name"], "shape": list(a.shape), "datatype": inp["datatype"],
                           "parameters": {"binary_data_size": a.nbytes}})
            raw.append(a.tobytes())
        header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}},
                            separators=(",", ":")).encode()
        with open(out, "wb") as f:
            f.write(header + b"".join(raw))
        json.dump({"header_length": len(header), "body_bytes": len(header) + sum(map(len, raw))}, open(meta, "w"))


def fastoip_repo(name: str, configs: dict) -> str:
    """A Triton-style repository for fastoip: symlinks to the lab's .onnx files + config.pbtxt."""
    root = os.path.join(REPOS, name)
    for model in ALL_MODELS:
        vdir = os.path.join(root, model, "1")
        os.makedirs(vdir, exist_ok=True)
        link = os.path.join(vdir, "model.onnx")
        target = os.path.join(MODELS_DIR, model, "1", "model.onnx")
        if os.path.islink(link) and os.readlink(link) == target:
            pass
        else:
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(target, link)
        cfg = os.path.join(root, model, "config.pbtxt")
        if model in configs:
            with open(cfg, "w") as f:
                f.write(configs[model])
        elif os.path.exists(cfg):
            os.unlink(cfg)
    return root


def write_fastoip_repos(args: argparse.Namespace) -> None:
    delay = args.mlp_queue_delay_us
    batched = FASTOIP_CONFIGS["mlp-batch"].replace("DELAY", str(delay))
    # std: what `fastoip serve` with the demo repository would configure
    fastoip_repo("std", {"simple": FASTOIP_CONFIGS["simple"], "mlp": batched})
    fastoip_repo("mlp-batch", {"simple": FASTOIP_CONFIGS["simple"], "mlp": batched})
    fastoip_repo("mlp-nobatch", {"simple": FASTOIP_CONFIGS["simple"], "mlp": FASTOIP_CONFIGS["mlp-nobatch"]})
    for vname, model, path in args.variant_configs:
        base = {"simple": FASTOIP_CONFIGS["simple"], "mlp": batched}
        base[model] = open(path).read()
        fastoip_repo("variant-" + vname, base)


# ===================================================================== servers
# Ports are fixed per server, away from the defaults (8000/8001, 8080/8081, 50051) that
# other people's servers on this machine may hold.
PORTS = {
    "fastoip": (18001, 18000), "fastoip-batch": (18003, 18002), "fastoip-nobatch": (18005, 18004),
    "fastoip-native": (18007, 18006),
    "fastoip-aio": (18021, None), "grpcio-sync": (18051, None), "grpcio-aio": (18052, None),
    "grpc-cpp": (18053, None),
    "kserve": (18181, 18180), "mlserver": (18081, 18080), "mlserver-ab": (18081, 18080),
    "pytriton": (18101, 18100), "pytriton-db": (18101, 18100),
}
AUX_PORT = {"mlserver": 18082, "mlserver-ab": 18082, "pytriton": 18102, "pytriton-db": 18102}
NOTES = {
    "fastoip": "fastoip serve (sync grpcio frontend), repository `std` (demo configs)",
    "fastoip-native": "fastoip serve --grpc-frontend native (libnghttp2 on uvloop), repository `std`",
    "fastoip-batch": "fastoip serve, mlp with dynamic_batching (max_batch_size 64, queue delay {delay} us)",
    "fastoip-nobatch": "fastoip serve, mlp without dynamic_batching (max_batch_size 64)",
    "fastoip-aio": "benchmarks/aio_frontend.py: grpc.aio + uvloop, fastoip codec + Core.infer_async",
    "grpcio-sync": "ceiling: grpcio sync server, ThreadPoolExecutor(8), raw bytes, pre-built response (peers)",
    "grpcio-aio": "ceiling: grpc.aio server, raw bytes, pre-built response (peers)",
    "grpc-cpp": "native ceiling: C++ grpc++ completion-queue server, one polling thread, pre-built response (peers)",
    "kserve": "KServe ModelServer + custom kserve.Model on onnxruntime (peers)",
    "mlserver": "MLServer, custom onnxruntime runtime, adaptive batching off, parallel_workers=1 (peers)",
    "mlserver-ab": "MLServer, adaptive batching on mlp (max 32, 2 ms) (peers)",
    "pytriton": "Triton via PyTriton, python backend -> onnxruntime, no dynamic batcher (peers)",
    "pytriton-db": "Triton via PyTriton, dynamic batcher (max 32, queue delay {tdelay} us) (peers)",
}
SERVER_KINDS = {
    "fastoip": "fastoip", "fastoip-batch": "fastoip", "fastoip-nobatch": "fastoip", "fastoip-aio": "fastoip-aio",
    "fastoip-native": "fastoip",
    "grpcio-sync": "ceiling", "grpcio-aio": "ceiling", "grpc-cpp": "cpp", "kserve": "kserve", "mlserver": "mlserver",
    "mlserver-ab": "mlserver", "pytriton": "pytriton", "pytriton-db": "pytriton",
}
PEER_VENV = {"kserve": "kserve", "mlserver": "mlserver", "pytriton": "triton"}


def fastoip_env(tree: str = REPO) -> dict[str, str]:
    env = dict(os.environ)
    src = os.path.join(tree, "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def server_spec(name: str, models: list[str], args: argparse.Namespace, http: bool) -> dict[str, Any]:
    """How to start server `name` serving `models`: argv, env, ports, note."""
    variant = args.variants.get(name)
    kind = "fastoip" if variant is not None else SERVER_KINDS[name]
    grpc_port, http_port = PORTS.get(name, (None, None))
    if variant is not None:
        grpc_port, http_port = variant["ports"]
    spec = dict(name=name, kind=kind, grpc=grpc_port, http=http_port if http else None, models=models,
                note=(variant or {}).get("note") or NOTES.get(name, "").format(
                    delay=args.mlp_queue_delay_us, tdelay=args.triton_queue_delay_us),
                env=peers_env(), cwd=REPO, pre=None, stats=True)
    mlist = ",".join(models)
    if kind == "fastoip":
        repo = {"fastoip": "std", "fastoip-batch": "mlp-batch", "fastoip-nobatch": "mlp-nobatch"}.get(name, "std")
        if variant is not None:
            repo = variant["repo"]
        tree = (variant or {}).get("tree") or REPO
        argv = [os.path.join(tree, ".venv", "bin", "python"), "-m", "fastoip.cli", "serve",
                "--model-repository", os.path.join(REPOS, repo),
                "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
                "--http-port", str(http_port if http else -1), "--metrics-port", "-1", "--exit-timeout", "5",
                "--log-level", "WARNING",
                # every peer runs ORT with one intra-op thread (peers/README.md): fastoip too, explicitly,
                # since its own default is ORT's (one per physical core, as Triton); --fastoip-args may override
                "--ort-threads", "1"] + shlex.split(args.fastoip_args)
        # "fastoip" stays the grpcio frontend it always measured; "fastoip-native" runs beside it.
        frontend = {"fastoip": "grpcio", "fastoip-native": "native"}.get(name)
        if frontend is not None:
            argv += ["--grpc-frontend", frontend]
        if variant is not None:
            argv += variant["args"]
        spec.update(argv=argv, env=fastoip_env(tree), ready_line="fastoip: grpc listening")
    elif kind == "fastoip-aio":
        argv = [FASTOIP_PY, os.path.join(HERE, "aio_frontend.py"), "--model-repository",
                os.path.join(REPOS, "std"), "--port", str(grpc_port), "--loop", args.aio_loop]
        spec.update(argv=argv, env=fastoip_env(), ready_line="fastoip-aio: grpc listening", http=None)
    elif kind == "ceiling":
        argv = [VENV["base"], os.path.join(PEERS, "bench", "grpc_ceiling.py"), "--mode", name.split("-")[1],
                "--port", str(grpc_port), "--payloads", PAYLOADS]
        spec.update(argv=argv, ready_line="CEILING_SERVING", http=None, stats=False)
    elif kind == "cpp":
        # Built by setup.sh (peers' grpc_cpp): says what h2load itself reaches against a native server.
        argv = [os.path.join(WORK, "grpc-cpp", "grpc_cpp_server"), "--mode", "async", "--port", str(grpc_port),
                "--payloads", PAYLOADS]
        spec.update(argv=argv, ready_line="CEILING_SERVING", http=None, stats=False)
    elif kind == "kserve":
        argv = [VENV["kserve"], os.path.join(PEERS, "peers", "kserve", "serve_kserve.py"), "--models-dir",
                MODELS_DIR, "--models", mlist, "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
        spec.update(argv=argv, ready_line=None, stats=False)
    elif kind == "pytriton":
        argv = [VENV["triton"], os.path.join(PEERS, "peers", "pytriton", "serve_pytriton.py"), "--models-dir",
                MODELS_DIR, "--models", mlist, "--batching", "dynamic" if name.endswith("-db") else "none",
                "--queue-delay-us", str(args.triton_queue_delay_us), "--http-port", str(http_port),
                "--grpc-port", str(grpc_port), "--metrics-port", str(AUX_PORT[name])]
        spec.update(argv=argv, ready_line=None, cwd=PEERS)
    elif kind == "mlserver":
        repo = os.path.join(TMP, f"mlserver-repo-{name}")
        shutil.rmtree(repo, ignore_errors=True)
        pre = [VENV["base"], os.path.join(PEERS, "peers", "mlserver", "make_repo.py"), "--out", repo,
               "--models-dir", MODELS_DIR, "--models", mlist,
               "--adaptive-batching", "mlp" if name.endswith("-ab") else "",
               "--http-port", str(http_port), "--grpc-port", str(grpc_port),
               "--metrics-port", str(AUX_PORT[name]), "--parallel-workers", "1"]
        env = peers_env()
        env["PYTHONPATH"] = os.path.join(PEERS, "peers", "mlserver")
        argv = [os.path.join(os.path.dirname(VENV["mlserver"]), "mlserver"), "start", repo]
        # MLServer always serves both transports; HTTP readiness is what it reports first
        spec.update(argv=argv, env=env, cwd=None, pre=pre, ready_line=None, stats=False,
                    http=http_port, grace=10.0)  # it drains its whole backlog on SIGINT
    else:
        raise ValueError(kind)
    return spec


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


class Server:
    """A server process in its own session (pid == pgid), pinned to `cpus`: the shared launcher
    (fastoip.launcher) starts and stops it; its output goes to LOGS/<name>.log."""

    def __init__(self, spec: dict, cpus: str):
        self.spec = spec
        self.name = spec["name"]
        for port in (spec["grpc"], spec.get("http"), AUX_PORT.get(self.name)):
            if port and not port_free(port):
                raise RuntimeError(f"port {port} is already in use: cannot start {self.name}")
        if spec.get("pre"):
            run_checked(spec["pre"], 120, env=peers_env())
        self.log_path = os.path.join(LOGS, f"{self.name}.log")
        self.argv = spec["argv"]
        self.started = time.time()
        # readiness is wait_ready's (gRPC/HTTP probes), not the listening lines: peers print none
        self.child = ChildProcess(self.argv, want=(), env=spec["env"], cwd=spec.get("cwd"),
                                  cpus=parse_cpu_list(cpus), log_path=self.log_path, keep_lines=1000)
        self.child.start()
        assert self.child.proc is not None
        self.p = self.child.proc

    def alive(self) -> bool:
        return self.child.alive()

    def group_pids(self) -> list:
        return self.child.group_pids()

    def cpu_seconds(self) -> float:
        return self.child.cpu_seconds(group=True) or 0.0

    def affinity(self) -> list:
        out = set()
        for pid in self.group_pids():
            try:
                out.add(tuple(sorted(os.sched_getaffinity(pid))))
            except OSError:
                pass
        return sorted(out)

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_idle(self, max_s: float = 60.0, below: float = 0.15, step: float = 0.5) -> float:
        """Wait until the server burns less than `below` of a core (a backlog drained)."""
        t0 = time.time()
        while time.time() - t0 < max_s:
            c0 = self.cpu_seconds()
            time.sleep(step)
            if (self.cpu_seconds() - c0) / step < below:
                break
        return round(time.time() - t0, 1)

    def stop(self, grace: float = 20.0) -> list[int]:
        """SIGINT to the server, then SIGTERM, then SIGKILL to its process group; returns the pids left."""
        self.child.stop(grace, first_signal=signal.SIGINT, group=True)
        return self.group_pids()


LIVE_SERVERS: list = []


# ===================================================================== clients
def grpc_channel(target: str) -> grpc.Channel:
    import grpc
    return grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_MSG),
                                                  ("grpc.max_send_message_length", MAX_MSG),
                                                  ("grpc.enable_http_proxy", 0)])


def wait_ready(server: Server, spec: dict, timeout: float) -> float:
    """Ready = (the server's ready line printed, if it has one) + gRPC ServerReady and
    ModelReady for every model (+ HTTP /v2/health/ready when HTTP is measured)."""
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg
    t0 = time.time()
    last = ""
    while time.time() - t0 < timeout:
        if not server.alive():
            raise RuntimeError(f"{server.name} exited with {server.p.returncode} while starting:\n"
                               f"{server.log_tail()}")
        if spec.get("ready_line") and spec["ready_line"] not in server.log_tail(20000):
            time.sleep(0.2)
            continue
        try:
            ch = grpc_channel(f"127.0.0.1:{spec['grpc']}")
            try:
                stub = pbg.GRPCInferenceServiceStub(ch)
                ok = stub.ServerReady(pb.ServerReadyRequest(), timeout=2).ready and all(
                    stub.ModelReady(pb.ModelReadyRequest(name=m), timeout=2).ready for m in spec["models"])
            finally:
                ch.close()
            if ok and spec.get("http"):
                st, _, _, _ = http_raw(f"127.0.0.1:{spec['http']}", "GET", "/v2/health/ready", timeout=2)
                ok = st == 200
            if ok:
                return round(time.time() - t0, 1)
        except Exception as e:  # noqa: BLE001
            last = f"{type(e).__name__}: {str(e)[:200]}"
        time.sleep(0.3)
    raise RuntimeError(f"{server.name} not ready after {timeout}s ({last}):\n{server.log_tail()}")


def http_raw(hostport: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             timeout: float = 30.0) -> tuple[int, dict[str, str], bytes, int | None]:
    """One HTTP/1.1 exchange on a fresh socket.  Returns (status, headers, body, bytes on the wire)."""
    host, port = hostport.rsplit(":", 1)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {hostport}"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before the response headers")
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        hlines = head.decode("latin-1").split("\r\n")
        status = int(hlines[0].split()[1])
        hdrs = {}
        for line in hlines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        wire = len(head) + 4
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            while len(rest) < n:
                chunk = s.recv(max(65536, n - len(rest)))
                if not chunk:
                    break
                rest += chunk
            return status, hdrs, rest[:n], wire + n
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            data, raw = b"", rest
            while True:
                while b"\r\n" not in raw:
                    raw += s.recv(65536)
                size_line, raw = raw.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(raw) < size + 2:
                    raw += s.recv(65536)
                data += raw[:size]
                raw = raw[size + 2:]
                if size == 0:
                    break
            return status, hdrs, data, None  # wire size of chunked answers: not checked
        return status, hdrs, rest, None


def expected_outputs(model: str) -> dict:
    z = np.load(os.path.join(PAYLOADS, f"{model}.b1.npz"))
    return {k[4:]: z[k] for k in z.files if k.startswith("out:")}


def compare(got: dict[str, np.ndarray], exp: dict[str, np.ndarray]) -> str | None:
    for name, e in exp.items():
        if name not in got:
            return f"missing output {name} (got {sorted(got)})"
        g = np.asarray(got[name])
        if g.size != e.size:
            return f"{name}: {g.size} values, expected {e.size}"
        g = g.reshape(e.shape)
        if e.dtype.kind == "f":
            if not np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-4, atol=1e-5):
                return f"{name}: values differ from onnxruntime (max abs diff {np.max(np.abs(g - e)):.3g})"
        elif not np.array_equal(g.astype(np.int64), e.astype(np.int64)):
            return f"{name}: values differ from onnxruntime"
    return None


def decode_grpc(raw: bytes) -> dict:
    from tritonclient.grpc import service_pb2 as pb
    r = pb.ModelInferResponse.FromString(raw)
    out = {}
    for i, o in enumerate(r.outputs):
        if i < len(r.raw_output_contents):
            out[o.name] = np.frombuffer(r.raw_output_contents[i], dtype=NP_DTYPE[o.datatype])
        elif o.datatype in ("INT32", "INT64"):
            out[o.name] = np.array(o.contents.int_contents or o.contents.int64_contents)
        else:
            out[o.name] = np.array(o.contents.fp32_contents or o.contents.fp64_contents)
    return out


def decode_http(hdrs: dict, body: bytes) -> dict:
    hlen = hdrs.get("inference-header-content-length")
    if hlen is None:
        j = json.loads(body)
        return {o["name"]: np.array(o["data"]).reshape(-1) for o in j["outputs"]}
    n = int(hlen)
    j = json.loads(body[:n])
    out, off = {}, n
    for o in j["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[o["name"]] = np.array(o["data"]).reshape(-1)
        else:
            out[o["name"]] = np.frombuffer(body[off:off + size], dtype=NP_DTYPE[o["datatype"]])
            off += size
    return out


def probe(spec: dict, model: str, transport: str, n: int = 3) -> dict:
    """Send the exact bytes the load generator will send; check the tensors; learn the
    response size on the wire (for the byte accounting of the load run)."""
    exp = expected_outputs(model)
    sizes: set[int | None] = set()  # None: an HTTP answer whose wire size is not checked (chunked)
    try:
        if transport == "grpc":
            import grpc
            ch = grpc_channel(f"127.0.0.1:{spec['grpc']}")
            try:
                call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
                    GRPC_PATH, request_serializer=None, response_deserializer=None)
                msg = open(os.path.join(PAYLOADS, f"{model}.b1.pb"), "rb").read()
                for _ in range(n):
                    raw = call(msg, timeout=60)
                    err = compare(decode_grpc(raw), exp)
                    if err:
                        return dict(ok=False, error=err)
                    sizes.add(len(raw) + 5)  # + gRPC frame header
            except grpc.RpcError as e:
                return dict(ok=False, error=f"grpc {e.code().name}: {e.details()}")
            finally:
                ch.close()
            return dict(ok=True, response_bytes=sorted(sizes))
        path, hdrs = body_for(model, transport)
        body = open(path, "rb").read()
        for _ in range(n):
            st, rh, rb, wire = http_raw(f"127.0.0.1:{spec['http']}", "POST", f"/v2/models/{model}/infer", body, hdrs)
            if st != 200:
                return dict(ok=False, error=f"HTTP {st}: {rb[:300]!r}")
            err = compare(decode_http(rh, rb), exp)
            if err:
                return dict(ok=False, error=err)
            sizes.add(wire)
        return dict(ok=True, response_bytes=sorted(s for s in sizes if s is not None) or None)
    except Exception as e:  # noqa: BLE001
        return dict(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")


def body_for(model: str, transport: str) -> tuple[str, dict[str, str]]:
    """(body file, extra headers) for an HTTP transport: http = V2 JSON, http-bin = binary extension."""
    if transport == "http-bin":
        path = os.path.join(BIN_PAYLOADS, f"{model}.b1.bin")
        meta = json.load(open(path + ".json"))
        return path, {"Content-Type": "application/octet-stream",
                      "Inference-Header-Content-Length": str(meta["header_length"])}
    return os.path.join(PAYLOADS, f"{model}.b1.json"), {"Content-Type": "application/json"}


def model_stats(spec: dict[str, Any], model: str) -> dict[str, Any] | None:
    """Server-side counters via gRPC ModelStatistics (fastoip, Triton); None if not offered."""
    if not spec.get("stats"):
        return None
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg
    ch = grpc_channel(f"127.0.0.1:{spec['grpc']}")
    try:
        r = pbg.GRPCInferenceServiceStub(ch).ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10)
        s = r.model_stats[0]
        return dict(success=s.inference_stats.success.count, fail=s.inference_stats.fail.count,
                    inference_count=s.inference_count, execution_count=s.execution_count,
                    queue_ns=s.inference_stats.queue.ns)
    except Exception:  # noqa: BLE001
        return None
    finally:
        ch.close()


# ===================================================================== load
def proc_ticks() -> dict:
    snap = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            st = open(d + "/stat").read()
            f = st[st.rindex(")") + 2:].split()
            snap[int(d[6:])] = (int(f[2]), int(f[11]) + int(f[12]))
        except (OSError, ValueError, IndexError):
            pass
    return snap


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[7] if len(v) > 7 else 0


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """subprocess.run for the load generators: own session, killed as a group on timeout,
    Ctrl-C or --deadline, so no h2load/wrk outlives the driver."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def pctl(vals: Sequence[float], q: float) -> float | None:
    return float(np.percentile(vals, q)) if len(vals) else None


def run_h2load(target: str, model: str, conc: int, duration: int, cpus: str) -> dict:
    logp = os.path.join(TMP, "h2load-latency.log")
    if os.path.exists(logp):
        os.unlink(logp)  # h2load appends
    argv = ["timeout", "-k", "5", str(duration + 60), "taskset", "-c", cpus, "h2load", "-t", "1",
            "-c", str(conc), "-m", "1", "-D", str(duration), "-d", os.path.join(PAYLOADS, f"{model}.b1.grpc"),
            "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", logp,
            f"http://{target}{GRPC_PATH}"]
    t0 = time.time()
    r = run_bounded(argv, duration + 90)
    res = dict(tool="h2load", argv=" ".join(argv[5:]), rc=r.returncode, wall_s=round(time.time() - t0, 2))
    out = r.stdout
    mt = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", out)
    mr = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                   r"(\d+) errored, (\d+) timeout", out)
    md = re.search(r"traffic: .*?\((\d+)\) total, .*?\((\d+)\) headers.*?, .*?\((\d+)\) data", out)
    if not (mt and mr and md):
        res["error"] = "h2load output not understood: " + (out[-500:] + r.stderr[-500:]).strip()
        return res
    res.update(secs=float(mt.group(1)), rps=float(mt.group(2)), done=int(mr.group(3)), succeeded=int(mr.group(4)),
               failed=int(mr.group(5)), errored=int(mr.group(6)), timeouts=int(mr.group(7)),
               bytes_data=int(md.group(3)))
    lat = []
    try:
        with open(logp) as f:
            for line in f:
                p = line.split("\t")
                if len(p) >= 3 and p[1] == "200":
                    lat.append(int(p[2]))
    except OSError:
        pass
    res.update(lat_samples=len(lat), p50_us=pctl(lat, 50), p90_us=pctl(lat, 90), p99_us=pctl(lat, 99))
    return res


def run_fastoip_stream(target: str, model: str, conc: int, duration: int, cpus: str) -> dict:
    """ModelStreamInfer load: `fastoip bench --streaming` (its native client: C streams, each sending its next
    request when the answer to the last is in) pinned to `cpus`, one window of `duration` seconds with no warm-up
    of its own (the lab warms up before the point, as for h2load), every answer checked (--verify)."""
    fd, out_json = tempfile.mkstemp(prefix="fastoip-stream-", suffix=".json")
    os.close(fd)
    argv = ["timeout", "-k", "5", str(duration + 90), "taskset", "-c", cpus, FASTOIP_PY, "-m", "fastoip.cli",
            "bench", f"grpc://{target}", "-m", model, "--streaming", "--concurrency-range", str(conc),
            "-p", str(duration * 1000), "--max-trials", "1", "--warmup-ms", "0", "--verify", "--no-pin",
            "--quiet", "--json", out_json]
    t0 = time.time()
    r = run_bounded(argv, duration + 120, env=fastoip_env())  # this tree's fastoip bench, as its server
    res = dict(tool="fastoip bench --streaming", argv=" ".join(argv[5:]), rc=r.returncode,
               wall_s=round(time.time() - t0, 2))
    try:
        with open(out_json) as f:
            doc = json.load(f)
        row = doc["results"][0]
    except (OSError, ValueError, KeyError, IndexError):
        os.unlink(out_json)
        res["error"] = f"fastoip bench gave no result (rc {r.returncode}): " + (r.stdout[-400:] + r.stderr[-400:])
        return res
    lat = row["latency_us"]
    res.update(secs=row["duration_s"], rps=row["throughput_req_per_s"], done=row["requests"],
               errors=sum(row["errors"].values()), error_counts=row["errors"], client=row["client"],
               connections=doc["client"].get("channels"), p50_us=lat["p50"], p90_us=lat["p90"], p99_us=lat["p99"],
               bench_client_cpu_pct=row.get("client_cpu_percent"))
    if doc.get("error"):
        res["error"] = f"fastoip bench: {doc['error']}"
    os.unlink(out_json)
    return res


def run_wrk(target: str, model: str, transport: str, conc: int, duration: int, cpus: str) -> dict:
    path, hdrs = body_for(model, transport)
    extra = [hdrs["Inference-Header-Content-Length"]] if transport == "http-bin" else []
    argv = ["timeout", "-k", "5", str(duration + 60), "taskset", "-c", cpus, "wrk", "-t", "1", "-c", str(conc),
            "-d", f"{duration}s", "--timeout", "30s", "-s", WRK_LUA, f"http://{target}/v2/models/{model}/infer",
            "--", path] + extra
    t0 = time.time()
    r = run_bounded(argv, duration + 90)
    res = dict(tool="wrk", argv=" ".join(argv[5:]), rc=r.returncode, wall_s=round(time.time() - t0, 2))
    m = re.search(r"LAB_WRK (\{.*\})", r.stdout)
    if not m:
        res["error"] = "wrk output not understood: " + (r.stdout[-500:] + r.stderr[-500:]).strip()
        return res
    j = json.loads(m.group(1))
    secs = j["duration_us"] / 1e6
    errors = sum(j[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
    res.update(secs=secs, done=j["requests"], rps=j["requests"] / secs if secs else 0.0, errors=errors,
               err_status=j["err_status"], bytes_read=j["bytes"], p50_us=float(j["lat_p50_us"]),
               p90_us=float(j["lat_p90_us"]), p99_us=float(j["lat_p99_us"]))
    return res


def verify(r: dict[str, Any], pr: dict[str, Any], transport: str, conc: int) -> tuple[bool, str]:
    """Did every counted request succeed?  gRPC: h2load says 200 even for grpc-status != 0,
    but an error answer is trailers-only (no DATA), so DATA bytes must be done x the framed
    response size (+ at most the responses in flight when h2load stopped).  HTTP: no
    non-2xx/socket errors, and bytes read = requests x the response's wire size (same slack)."""
    sizes = pr.get("response_bytes") or []
    if "rps" not in r:
        return False, r.get("error", "no result")
    if not r.get("done"):
        return False, "no request completed within the point"
    if transport == "stream":
        if r.get("error") or r["errors"]:
            return False, r.get("error") or f"fastoip bench errors: {r['error_counts']}"
        return True, "no errors, every answer checked by fastoip bench --verify"
    if transport == "grpc":
        if not sizes:
            return False, "no probe size"
        lo, hi = r["done"] * min(sizes), (r["done"] + conc) * max(sizes)
        ok_bytes = lo * 0.999 <= r["bytes_data"] <= hi
        r["data_bytes_per_done"] = round(r["bytes_data"] / max(1, r["done"]), 1)
        if not ok_bytes:
            return False, (f"DATA bytes {r['bytes_data']} outside [{lo}, {hi}]: "
                           f"~{max(0, r['done'] - r['bytes_data'] // max(sizes))} requests without a response body")
        if r["failed"] or r["errored"] or r["timeouts"]:
            return False, f"h2load failed={r['failed']} errored={r['errored']} timeout={r['timeouts']}"
        if r["lat_samples"] < r["done"] * 0.99:
            return False, f"latency samples {r['lat_samples']} < done {r['done']}"
        return True, "grpc DATA bytes = done x response"
    if r["errors"]:
        return False, f"wrk errors: {r['errors']} (non-2xx {r['err_status']})"
    if sizes:
        lo, hi = r["done"] * min(sizes), (r["done"] + conc) * max(sizes)
        if not lo * 0.999 <= r["bytes_read"] <= hi:
            return False, f"bytes read {r['bytes_read']} outside [{lo}, {hi}]"
        return True, "no errors, bytes read = requests x response"
    return True, "no errors (response size not checked)"


def measure(server: Server, spec: dict[str, Any], model: str, transport: str, conc: int, pr: dict[str, Any],
            args: argparse.Namespace) -> dict[str, Any]:
    idle = server.wait_idle()
    st0 = model_stats(spec, model)
    s0, c0, snap0, steal0 = server.cpu_seconds(), children_cpu(), proc_ticks(), steal_ticks()
    t0 = time.time()
    if transport == "grpc":
        r = run_h2load(f"127.0.0.1:{spec['grpc']}", model, conc, args.duration, args.client_cpus)
    elif transport == "stream":
        r = run_fastoip_stream(f"127.0.0.1:{spec['grpc']}", model, conc, args.duration, args.client_cpus)
    else:
        r = run_wrk(f"127.0.0.1:{spec['http']}", model, transport, conc, args.duration, args.client_cpus)
    window = time.time() - t0
    s1, c1, snap1, steal1 = server.cpu_seconds(), children_cpu(), proc_ticks(), steal_ticks()
    st1 = model_stats(spec, model)
    pgrp = server.p.pid
    me = os.getpid()
    other = 0
    for pid, (grp, ticks) in snap1.items():
        if pid == me or grp == pgrp:
            continue
        other += ticks - snap0[pid][1] if pid in snap0 else ticks
    r.update(server=spec["name"], model=model, transport=transport, conc=conc, idle_wait_s=idle,
             server_cpu_pct=round(100 * (s1 - s0) / window, 1), client_cpu_pct=round(100 * (c1 - c0) / window, 1),
             other_cpu_pct=round(100 * other / CLK / window, 1),
             steal_pct=round(100 * (steal1 - steal0) / CLK / window, 1))
    r["disturbed"] = r["other_cpu_pct"] > args.noise_other_pct or r["steal_pct"] > args.noise_steal_pct
    if transport == "stream" and r.get("bench_client_cpu_pct") is not None:
        # the bench's own CPU over its window (its process start-up, which rusage would add, left out)
        r["client_cpu_pct"] = round(r["bench_client_cpu_pct"], 1)
    if r.get("done"):
        # server CPU per request: much less sensitive to other load on the machine than req/s
        r["server_cpu_us_per_req"] = round(1e6 * (s1 - s0) / r["done"], 1)
    if st0 and st1:
        d = {k: st1[k] - st0[k] for k in st0}
        if d["execution_count"]:
            d["avg_batch"] = round(d["inference_count"] / d["execution_count"], 2)
        r["server_stats"] = d
        if transport == "stream" and d["success"]:
            # the bench counts its window only; the server also served its drain: per request it served
            r["server_cpu_us_per_req"] = round(1e6 * (s1 - s0) / d["success"], 1)
    ok, why = verify(r, pr, transport, conc)
    served = (r.get("server_stats") or {}).get("success")
    if ok and transport == "stream" and served is not None and served < r["done"]:
        ok, why = False, f"the server counted {served} successes, fewer than the client's {r['done']}"
    fails = (r.get("server_stats") or {}).get("fail", 0)
    if ok and fails > conc:  # up to `conc` calls in flight are cancelled when the load generator stops
        ok, why = False, f"server counted {fails} failed requests (more than the {conc} in flight at stop)"
    if not server.alive():
        ok, why = False, "server died during the run"
    r["verified"], r["verify"] = ok, why
    return r


def bench_session(name: str, plan: list[Any], args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Start server `name`, measure every (model, transport, [conc]) of `plan`, stop it."""
    models = sorted({m for m, _, _ in plan}, key=ALL_MODELS.index)
    http = any(t not in ("grpc", "stream") for _, t, _ in plan)
    spec = server_spec(name, models, args, http)
    info = result["servers"].setdefault(name, dict(note=spec["note"], sessions=[]))
    sess: dict[str, Any] = dict(models=models)
    info["sessions"].append(sess)
    try:
        server = Server(spec, args.server_cpus)
    except Exception as e:  # noqa: BLE001
        sess["error"] = f"{type(e).__name__}: {e}"
        log(f"[{name}] NOT STARTED: {sess['error']}")
        for m, t, concs in plan:
            for c in concs:
                result["points"].append(dict(server=name, model=m, transport=t, conc=c, verified=False,
                                             error="server not started: " + sess["error"][:300]))
        return
    LIVE_SERVERS.append(server)
    sess["argv"] = " ".join(server.argv)
    log(f"[{name}] started pid {server.p.pid} on CPUs {args.server_cpus}: {sess['argv']}")
    try:
        sess["ready_s"] = wait_ready(server, spec, args.ready_timeout)
        sess["affinity"] = server.affinity()
        sess["processes"] = len(server.group_pids())
        log(f"[{name}] ready in {sess['ready_s']} s, {sess['processes']} process(es), affinity {sess['affinity']}")
        for model, transport, concs in plan:
            pr = probe(spec, model, "grpc" if transport == "stream" else transport)
            if not pr["ok"]:
                log(f"[{name}] {model} {transport}: PROBE FAILED: {pr['error']}")
                for c in concs:
                    result["points"].append(dict(server=name, model=model, transport=transport, conc=c,
                                                 verified=False, probe=pr, error="probe failed: " + pr["error"]))
                continue
            if args.warmup > 0:
                warm = (run_h2load(f"127.0.0.1:{spec['grpc']}", model, min(8, max(concs)), args.warmup,
                                   args.client_cpus) if transport == "grpc" else
                        run_fastoip_stream(f"127.0.0.1:{spec['grpc']}", model, min(8, max(concs)), args.warmup,
                                           args.client_cpus) if transport == "stream" else
                        run_wrk(f"127.0.0.1:{spec['http']}", model, transport, min(8, max(concs)), args.warmup,
                                args.client_cpus))
                if "rps" not in warm:
                    log(f"[{name}] warm-up problem: {warm.get('error')}")
            for conc in concs:
                attempts = []
                for attempt in range(1 + args.retries):
                    r = measure(server, spec, model, transport, conc, pr, args)
                    r["attempt"] = attempt + 1
                    attempts.append(r)
                    if not r["disturbed"] or not r["verified"] or not server.alive():
                        break
                    if attempt < args.retries:
                        log(f"[{name}]   disturbed (other {r['other_cpu_pct']}%, steal {r['steal_pct']}%): retry")
                good = [a for a in attempts if a["verified"]] or attempts
                best = min(good, key=lambda a: a["other_cpu_pct"] + a["steal_pct"])
                best["probe"] = pr
                if len(attempts) > 1:
                    best["attempts"] = [dict(rps=a.get("rps"), other_cpu_pct=a["other_cpu_pct"],
                                             steal_pct=a["steal_pct"], verified=a["verified"]) for a in attempts]
                result["points"].append(best)
                print_point(best)
                if not server.alive():
                    raise RuntimeError(f"{name} died:\n{server.log_tail()}")
    except Exception as e:  # noqa: BLE001  (KeyboardInterrupt passes through; the finally stops the server)
        sess["error"] = f"{type(e).__name__}: {e}"
        log(f"[{name}] FAILED: {sess['error']}")
        done = {(p["model"], p["transport"], p["conc"]) for p in result["points"] if p["server"] == name}
        for m, t, concs in plan:
            for c in concs:
                if (m, t, c) not in done:
                    result["points"].append(dict(server=name, model=m, transport=t, conc=c, verified=False,
                                                 error=sess["error"][:400]))
    finally:
        sess["exit"] = None
        left = server.stop(grace=spec.get("grace", 20.0))
        LIVE_SERVERS.remove(server)
        sess["exit"] = server.p.returncode
        sess["leftover_pids"] = left
        log(f"[{name}] stopped (exit {server.p.returncode}); leftover pids: {left or 'none'}")


def print_point(r: dict) -> None:
    p50, p99 = r.get("p50_us"), r.get("p99_us")
    log(f"[{r['server']}] {r['model']:14s} {r['transport']:8s} c={r['conc']:<3d} {r.get('rps', 0):9.1f} req/s  "
        f"p50 {fmt_ms(p50):>7s} ms  p99 {fmt_ms(p99):>7s} ms  srv {r.get('server_cpu_pct')}% "
        f"({r.get('server_cpu_us_per_req')} us/req)  "
        f"cli {r.get('client_cpu_pct')}%  other {r.get('other_cpu_pct')}%  steal {r.get('steal_pct')}%  "
        f"verified={r.get('verified')} ({r.get('verify', r.get('error', ''))})"
        + (f"  stats={json.dumps(r['server_stats'])}" if r.get("server_stats") else "")
        + ("  DISTURBED" if r.get("disturbed") else ""))


# ===================================================================== suites
PEER_SERVERS = {"kserve", "mlserver", "mlserver-ab", "pytriton", "pytriton-db"}


def suite_plan(args: argparse.Namespace) -> dict[str, Any]:
    """suite -> dict(entries=[(server, models, transports)], subjects, targets, default models/conc)."""
    return {
        "grpc-e2e": dict(
            conc=[1, 8, 64], models=["simple", "image_identity"],
            entries=[("fastoip", None, ["grpc"]), ("fastoip-native", None, ["grpc", "stream"]),
                     ("grpcio-sync", None, ["grpc"]),
                     ("grpcio-aio", None, ["grpc"]), ("grpc-cpp", None, ["grpc"]),
                     ("kserve", None, ["grpc"]), ("mlserver", None, ["grpc"]), ("pytriton", None, ["grpc"])],
            peers_default=False,
            subjects=[("fastoip", "grpc"), ("fastoip-native", "grpc"), ("fastoip-native", "stream")],
            targets=[("ceiling", "fastoip", "simple", 64, 0.70), ("ceiling", "fastoip", "image_identity", 1, 0.60),
                     ("ceiling", "fastoip-native", "simple", 64, 1.5),
                     ("ceiling", "fastoip-native", "image_identity", 1, 1.5),
                     # issue 24: ModelStreamInfer >= the C++ grpc++ server's unary figure, same run
                     ("cross", "fastoip-native", "stream", "grpc-cpp", "grpc", "simple", 64, 1.0)]),
        "batching": dict(
            conc=[1, 16, 64], models=["mlp", "simple"],
            entries=[("fastoip-nobatch", ["mlp"], ["grpc"]), ("fastoip-batch", ["mlp", "simple"], ["grpc"]),
                     ("pytriton-db", ["mlp"], ["grpc"]), ("kserve", ["mlp"], ["grpc"]),
                     ("mlserver-ab", ["mlp"], ["grpc"])],
            peers_default=True, subjects=[("fastoip-batch", "grpc")],
            targets=[("peer", "fastoip-batch", "pytriton-db", 64, 1.5), ("peer", "fastoip-batch", "kserve", 64, 2.5),
                     ("self", "fastoip-batch", "simple", 64, 0.80)]),
        "frontend-choice": dict(
            conc=[1, 8, 64], models=["simple", "image_identity"],
            entries=[("fastoip", None, ["grpc"]), ("fastoip-aio", None, ["grpc"]),
                     ("grpcio-sync", None, ["grpc"]), ("grpcio-aio", None, ["grpc"])],
            peers_default=False, subjects=[("fastoip", "grpc"), ("fastoip-aio", "grpc")], targets=[]),
        "http": dict(
            conc=[1, 8, 64], models=["simple", "image_identity"],
            entries=[("fastoip", None, ["http", "http-bin"]), ("kserve", None, ["http"]),
                     ("mlserver", None, ["http"])],
            peers_default=True, subjects=[("fastoip", "http"), ("fastoip", "http-bin")], targets=[]),
    }


def build_sessions(suite: str, args: argparse.Namespace) -> tuple[Any, ...]:
    sp = suite_plan(args)[suite]
    concs = args.conc or sp["conc"]
    models = args.models or sp["models"]
    peers = sp["peers_default"] if args.peers is None else args.peers
    entries = list(sp["entries"])
    if suite == "frontend-choice" and not args.ceilings:
        entries = [e for e in entries if not e[0].startswith("grpcio")]
    for vname in args.variants:  # fastoip variants run everything fastoip's main entry runs
        main = next((e for e in entries if e[0].startswith("fastoip") and e[0] != "fastoip-aio"), None)
        if main:
            entries.insert(1, (vname, main[1], main[2]))
    chosen = []
    for server, smodels, transports in entries:
        if server == "grpc-cpp" and not (args.servers and server in args.servers):
            continue  # the native ceiling runs only when named (--servers grpc-cpp)
        if server in PEER_SERVERS and not peers:
            continue
        if args.servers and server not in args.servers:
            continue
        if server in PEER_SERVERS and not os.path.exists(VENV[PEER_VENV[SERVER_KINDS[server]]]):
            log(f"skipping {server}: {VENV[PEER_VENV[SERVER_KINDS[server]]]} missing (benchmarks/setup.sh)")
            continue
        if args.transports:
            transports = [t for t in transports if t in args.transports]
        else:  # ModelStreamInfer (fastoip bench --streaming) runs only when named (--transports grpc,stream)
            transports = [t for t in transports if t != "stream"]
        ms = [m for m in (smodels or models) if m in models]
        if ms and transports:
            chosen.append((server, ms, transports))
    sessions = []  # (server, [(model, transport, concs)])
    if args.order == "server":
        for server, ms, trs in chosen:
            sessions.append((server, [(m, t, concs) for m in ms for t in trs]))
    elif args.order == "model":
        for m in models:
            for server, ms, trs in chosen:
                if m in ms:
                    sessions.append((server, [(m, t, concs) for t in trs]))
    else:  # point: a fresh server for every model x concurrency
        for m in models:
            for c in concs:
                for server, ms, trs in chosen:
                    if m in ms:
                        sessions.append((server, [(m, t, [c]) for t in trs]))
    return sessions, sp


# ===================================================================== report
def fmt_ms(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1000:.2f}" if us < 100000 else f"{us / 1000:.0f}"


def find(points: list[dict[str, Any]], server: str, model: str, transport: str, conc: int) -> dict[str, Any] | None:
    for p in points:
        if (p["server"], p["model"], p["transport"], p["conc"]) == (server, model, transport, conc) and "rps" in p:
            return p
    return None


def ratio_str(a: dict[str, Any] | None, b: dict[str, Any] | None, metric: str = "rps") -> str:
    if metric == "cpu":
        if not a or not b or not a.get("server_cpu_us_per_req") or not b.get("server_cpu_us_per_req"):
            return "-"
        s = f"{b['server_cpu_us_per_req'] / a['server_cpu_us_per_req']:.2f}"
    else:
        if not a or not b or not b.get("rps"):
            return "-"
        s = f"{a['rps'] / b['rps']:.2f}"
    if not (a.get("verified") and b.get("verified")):
        s += " (!)"
    return s


def evaluate_targets(result: dict) -> list:
    pts = result["points"]
    out = []
    for t in result.get("targets", []):
        kind, subj = t[0], t[1]
        if kind == "cross":
            _, _, subj_transport, other, other_transport, model, conc, need = t
            if not any(p["server"] == subj and p["transport"] == subj_transport for p in pts):
                continue  # that transport was not asked for in this run
            a, b = find(pts, subj, model, subj_transport, conc), find(pts, other, model, other_transport, conc)
            text = f"{subj} ({subj_transport}) >= {need}x {other} ({other_transport}), {model} c={conc}"
        elif kind == "ceiling":
            _, _, model, conc, need = t
            a = find(pts, subj, model, "grpc", conc)
            ceil = [p for p in (find(pts, c, model, "grpc", conc) for c in ("grpcio-sync", "grpcio-aio")) if p]
            b = max(ceil, key=lambda p: p["rps"]) if ceil else None
            text = f"{subj} >= {need:.0%} of the faster ceiling, {model} c={conc}"
        elif kind == "peer":
            _, _, peer, conc, need = t
            a, b = find(pts, subj, "mlp", "grpc", conc), find(pts, peer, "mlp", "grpc", conc)
            text = f"{subj} >= {need}x {peer}, mlp c={conc}, p99 no worse"
        else:
            _, _, ref_model, conc, need = t
            a, b = find(pts, subj, "mlp", "grpc", conc), find(pts, subj, ref_model, "grpc", conc)
            text = f"{subj} mlp >= {need:.0%} of {subj} {ref_model}, c={conc}"
        if not a or not b:
            out.append(dict(target=text, status="not measured"))
            continue
        ratio = a["rps"] / b["rps"]
        ok = ratio >= need
        detail = f"{a['rps']:.0f} / {b['rps']:.0f} ({b['server']} {b['model']}) = {ratio:.2f}"
        if kind == "peer":
            p99ok = (a.get("p99_us") or 0) <= (b.get("p99_us") or 0)
            ok = ok and p99ok
            detail += f"; p99 {fmt_ms(a.get('p99_us'))} vs {fmt_ms(b.get('p99_us'))} ms"
        if a.get("server_cpu_us_per_req") and b.get("server_cpu_us_per_req"):
            detail += (f"; server CPU/request {a['server_cpu_us_per_req']:.0f} vs {b['server_cpu_us_per_req']:.0f} us "
                       f"(efficiency ratio {b['server_cpu_us_per_req'] / a['server_cpu_us_per_req']:.2f})")
        status = "PASS" if ok else "FAIL"
        if not (a.get("verified") and b.get("verified")):
            status += " (unverified point)"
        if a.get("disturbed") or b.get("disturbed"):
            status += " (disturbed)"
        out.append(dict(target=text, status=status, detail=detail, ratio=round(ratio, 3)))
    return out


def render(result: dict) -> str:
    pts = result["points"]
    a = result["args"]
    L = [f"# {result['suite']}: {result['started']}", "",
         f"Server pinned to CPU {a['server_cpus']}, load generator (and driver) to CPU {a['client_cpus']}; "
         f"{a['duration']} s per point after a {a['warmup']} s warm-up; gRPC = h2load, C connections x 1 stream, "
         f"pre-encoded ModelInferRequest (raw_input_contents); stream = `fastoip bench --streaming` "
         f"(ModelStreamInfer, native client, C streams, next request on each answer, every answer checked); "
         f"HTTP = wrk, C keep-alive connections "
         f"(`http` = V2 JSON, `http-bin` = Triton binary extension). Batch 1 per request. "
         f"Latencies in ms. Host: {result['host'].get('cpu')} x {result['host'].get('nproc')}, "
         f"load average at start {result['host'].get('loadavg')}.", ""]
    if result.get("smoke"):
        L += ["**Smoke run: figures are not measurements** (short points, shared machine).", ""]
    for name, info in result["servers"].items():
        errs = "; ".join(s["error"][:160] for s in info["sessions"] if s.get("error"))
        L.append(f"- **{name}**: {info['note']}" + (f" -- ERROR: {errs}" if errs else ""))
    L += ["", "| server | transport | model | c | req/s | p50 | p99 | srv CPU% | srv CPU us/req | cli CPU% "
          "| other CPU% | steal% | verified | server stats |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    order = {m: i for i, m in enumerate(ALL_MODELS)}
    for p in sorted(pts, key=lambda p: (order.get(p["model"], 9), p["transport"], p["conc"], -(p.get("rps") or 0))):
        if "rps" not in p:
            L.append(f"| {p['server']} | {p['transport']} | {p['model']} | {p['conc']} | - | - | - | | | | | | "
                     f"NO: {p.get('error', '')[:120].replace('|', '/')} | |")
            continue
        ss = p.get("server_stats") or {}
        sst = ""
        if ss:
            cancelled = " (cancelled at stop)" if 0 < ss["fail"] <= p["conc"] else ""
            sst = (f"ok={ss['success']} fail={ss['fail']}" + cancelled
                   + (f" avg batch {ss['avg_batch']}" if ss.get("avg_batch") else ""))
        ver = "yes" if p["verified"] else f"NO: {p.get('verify', '')[:100]}"
        if p.get("disturbed"):
            ver += " (disturbed)"
        L.append(f"| {p['server']} | {p['transport']} | {p['model']} | {p['conc']} | {p['rps']:.0f} | "
                 f"{fmt_ms(p.get('p50_us'))} | {fmt_ms(p.get('p99_us'))} | {p['server_cpu_pct']} | "
                 f"{p.get('server_cpu_us_per_req', '')} | "
                 f"{p['client_cpu_pct']} | {p['other_cpu_pct']} | {p['steal_pct']} | {ver.replace('|', '/')} | {sst} |")
    # ratios: each subject vs every other measured row with the same model and concurrency
    L += ["", "## Ratios", "",
          "Throughput: req/s of the subject / req/s of the other. CPU efficiency: server CPU per request of the "
          "other / of the subject (> 1 = the subject spends less CPU per request; less sensitive to other load "
          "on the machine than req/s). (!) = a point not verified.", ""]
    for (subj, str_), metric in [(s_, m_) for s_ in result.get("subjects", []) for m_ in ("rps", "cpu")]:
        others = []
        for p in pts:
            key = (p["server"], p["transport"])
            if key != (subj, str_) and key not in others and "rps" in p:
                others.append(key)
        rows = []
        for model in sorted({p["model"] for p in pts}, key=lambda m: order.get(m, 9)):
            for conc in sorted({p["conc"] for p in pts}):
                a_ = find(pts, subj, model, str_, conc)
                if not a_:
                    continue
                cells = [ratio_str(a_, find(pts, s, model, t, conc), metric) for s, t in others]
                if any(c != "-" for c in cells):
                    own = f"{a_['rps']:.0f}" if metric == "rps" else str(a_.get("server_cpu_us_per_req", "-"))
                    rows.append(f"| {model} | {conc} | {own} | " + " | ".join(cells) + " |")
        if not rows:
            continue
        title = "throughput" if metric == "rps" else "CPU efficiency"
        L += [f"**{subj} ({str_}): {title}**", "",
              f"| model | c | {'req/s' if metric == 'rps' else 'CPU us/req'} | "
              + " | ".join(f"vs {s} ({t})" for s, t in others) + " |",
              "|---|---:|---:|" + "---:|" * len(others)] + rows + [""]
    if result.get("target_results"):
        L += ["## Targets", ""]
        for t in result["target_results"]:
            L.append(f"- {t['target']}: **{t['status']}**" + (f" -- {t['detail']}" if t.get("detail") else ""))
        L.append("")
    return "\n".join(L) + "\n"


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = dict(nproc=os.cpu_count(), kernel=platform.release(), python=platform.python_version())
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = None
    try:
        info["loadavg"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    try:
        info["fastoip_commit"] = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True, timeout=10).stdout.strip()
        info["fastoip_dirty"] = bool(subprocess.run(["git", "-C", REPO, "status", "--porcelain", "src"],
                                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    for tool in ("h2load", "wrk"):
        try:
            r = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10)
            info[tool] = ((r.stdout + r.stderr).strip().splitlines() or [""])[0]
        except (OSError, subprocess.TimeoutExpired):
            info[tool] = None
    return info


def write_result(result: dict) -> str:
    stamp = result["started"].replace(":", "").replace("-", "")
    base = os.path.join(RESULTS, f"{result['suite']}-{stamp}")
    json.dump(result, open(base + ".json", "w"), indent=1, default=str)
    md = render(result)
    open(base + ".md", "w").write(md)
    for ext in (".json", ".md"):
        shutil.copyfile(base + ext, os.path.join(RESULTS, f"{result['suite']}-latest{ext}"))
    return base


# ===================================================================== main
def cleanup_all() -> None:
    for s in list(LIVE_SERVERS):
        try:
            left = s.stop(grace=5)
            log(f"[{s.name}] stopped on exit; leftover pids: {left or 'none'}")
        except Exception:  # noqa: BLE001
            pass


class Deadline(BaseException):
    """--deadline reached: like KeyboardInterrupt, it passes the per-server `except Exception`."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["grpc-e2e", "batching", "frontend-choice", "http", "report", "list"])
    ap.add_argument("result_json", nargs="?", help="for `report`: the JSON of a run")
    ap.add_argument("--duration", type=int, default=10, help="seconds per measured point (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="discarded warm-up seconds per server/model/transport")
    ap.add_argument("--conc", type=lambda s: [int(c) for c in s.split(",") if c], default=None,
                    help="concurrencies (default: the suite's)")
    ap.add_argument("--models", type=lambda s: [m for m in s.split(",") if m], default=None)
    ap.add_argument("--servers", type=lambda s: [m for m in s.split(",") if m], default=None,
                    help="only these servers of the suite (e.g. fastoip,grpcio-sync)")
    ap.add_argument("--transports", type=lambda s: [m for m in s.split(",") if m], default=None,
                    help="only these transports (grpc, stream, http, http-bin); stream (ModelStreamInfer by "
                         "fastoip bench --streaming, grpc-e2e on fastoip-native) runs only when named here")
    ap.add_argument("--peers", dest="peers", action="store_true", default=None,
                    help="include the peer servers (default: on for batching/http, off for grpc-e2e)")
    ap.add_argument("--no-peers", dest="peers", action="store_false")
    ap.add_argument("--ceilings", action="store_true", help="frontend-choice: add the grpcio ceilings")
    ap.add_argument("--order", choices=["model", "server", "point"], default="model",
                    help="model (default): per model, each server in turn; server: each server once for "
                         "everything; point: a fresh server per model x concurrency")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="an extra fastoip server with extra `fastoip serve` args, e.g. "
                         "'fastoip-w8=--grpc-workers 8' (repeatable)")
    ap.add_argument("--variant-tree", action="append", default=[], metavar="NAME=PATH[ ARGS]",
                    help="an extra fastoip server run from another checkout (its .venv and src), e.g. "
                         "'fastoip-main=/work/main' for a before/after in one run (repeatable)")
    ap.add_argument("--variant-config", action="append", default=[], metavar="NAME:MODEL=FILE",
                    help="config.pbtxt override for MODEL in variant NAME's repository")
    ap.add_argument("--fastoip-args", default="", help="extra args for every `fastoip serve`")
    ap.add_argument("--mlp-queue-delay-us", type=int, default=0,
                    help="fastoip's mlp dynamic_batching max_queue_delay_microseconds (default 0, as the demo)")
    ap.add_argument("--triton-queue-delay-us", type=int, default=500)
    ap.add_argument("--aio-loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--retries", type=int, default=2, help="re-measure a disturbed point up to N times")
    ap.add_argument("--noise-other-pct", type=float, default=10.0)
    ap.add_argument("--noise-steal-pct", type=float, default=15.0)
    ap.add_argument("--ready-timeout", type=int, default=180)
    ap.add_argument("--deadline", type=int, default=3 * 3600, help="abort the whole run after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="mark the result as a smoke run (not a measurement)")
    args = ap.parse_args()

    if args.suite == "report":
        if not args.result_json:
            ap.error("report needs RESULT.json")
        result = json.load(open(args.result_json))
        out = os.path.splitext(args.result_json)[0] + ".md"
        open(out, "w").write(render(result))
        print(render(result))
        return 0
    if args.suite == "list":
        for s, sp in suite_plan(args).items():
            print(f"{s}: conc {sp['conc']} models {sp['models']}")
            for e in sp["entries"]:
                print(f"    {e[0]:16s} models={e[1] or 'suite'} transports={e[2]}")
        print("ports (grpc, http):", json.dumps(PORTS))
        return 0

    args.variants = {}
    for i, v in enumerate(args.variant):
        name, _, rest = v.partition("=")
        if not name.startswith("fastoip") or name in SERVER_KINDS:
            ap.error(f"--variant name must start with 'fastoip' and be new: {name}")
        args.variants[name] = dict(args=shlex.split(rest), repo="std", ports=(18031 + 2 * i, 18030 + 2 * i),
                                   note=f"fastoip serve {rest}")
    for v in args.variant_tree:
        name, _, rest = v.partition("=")
        tree, *extra = shlex.split(rest)
        if not name.startswith("fastoip") or name in SERVER_KINDS or name in args.variants:
            ap.error(f"--variant-tree name must start with 'fastoip' and be new: {name}")
        if not os.path.exists(os.path.join(tree, ".venv", "bin", "python")):
            ap.error(f"--variant-tree {name}: no {tree}/.venv/bin/python (run make venv there)")
        i = len(args.variants)
        args.variants[name] = dict(args=extra, repo="std", ports=(18031 + 2 * i, 18030 + 2 * i),
                                   tree=os.path.abspath(tree), note=f"fastoip serve from {tree} {' '.join(extra)}")
    args.variant_configs = []
    for v in args.variant_config:
        name, _, rest = v.partition(":")
        model, _, path = rest.partition("=")
        if name not in args.variants:
            ap.error(f"--variant-config for unknown variant {name}")
        args.variant_configs.append((name, model, os.path.abspath(path)))
        args.variants[name]["repo"] = "variant-" + name
        args.variants[name]["note"] += f" + {model} config {path}"

    prepare(args)
    sessions, sp = build_sessions(args.suite, args)
    if not sessions:
        sys.exit("nothing to run (check --servers/--models/--transports)")
    try:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    except (OSError, ValueError):
        pass

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Deadline(f"--deadline {args.deadline}s reached")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.deadline)
    result = dict(suite=args.suite, started=time.strftime("%Y-%m-%dT%H:%M:%S"), smoke=args.smoke,
                  args={k: v for k, v in vars(args).items() if k not in ("variants",)}, host=host_info(),
                  servers={}, points=[], subjects=list(sp["subjects"]) + [(v, "grpc") for v in args.variants],
                  targets=sp["targets"])
    log(f"suite {args.suite}: {len(sessions)} server session(s): "
        + ", ".join(f"{s}[{'/'.join(sorted({m for m, _, _ in p}))}]" for s, p in sessions))
    code = 0
    try:
        for name, plan in sessions:
            bench_session(name, plan, args, result)
    except (KeyboardInterrupt, Deadline) as e:
        log(f"interrupted ({type(e).__name__}: {e}); stopping servers")
        result["interrupted"] = f"{type(e).__name__}: {e}"
        code = 130
    finally:
        signal.alarm(0)
        cleanup_all()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    result["target_results"] = evaluate_targets(result)
    base = write_result(result)
    print()
    print(render(result))
    log(f"wrote {base}.json and {base}.md (also {args.suite}-latest.*)")
    return code


if __name__ == "__main__":
    sys.exit(main())

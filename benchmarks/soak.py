"""Soak: a real ``fastoip serve`` under mixed load for minutes, with reloads, RSS sampling and a SIGTERM at the end.

What it does (issue 15, "Tests and figures"):

* writes the demo repository (``fastoip demo-repository DIR``) unless ``--repository`` names one, and starts
  ``python -m fastoip.cli serve --model-control-mode explicit --load-model '*'`` on ephemeral ports, pinned to
  ``--server-cpus`` (default CPU 0) with ``taskset`` where there are two CPUs or more;
* drives it from client processes pinned to ``--client-cpus`` (default CPU 1), ``--clients-per-kind`` of each kind:
  gRPC and HTTP (tritonclient), small (``simple``, INT32 [1,16], JSON over HTTP) and 602 KB (``image_identity``,
  FP32 [1,3,224,224], binary over HTTP); every answer is checked against the input;
* reloads a model every ``--reload-interval`` seconds (``load_model`` of a model that is already loaded, in turn
  ``mlp``, ``simple``, ``image_identity``) and samples the server's RSS (VmRSS of /proc/PID/status) every
  ``--rss-interval`` seconds;
* after ``--duration`` seconds sends SIGTERM while the load still runs and counts every request sent against its
  outcome. A request refused after the listeners closed (gRPC UNAVAILABLE because the connection or stream was
  refused, HTTP 503, connection refused) is retryable, so not lost; CANCELLED, an UNAVAILABLE for a call the server
  had taken (e.g. "Cancelling all calls"), any other error, or no answer at all is lost.

Checks (exit status 1 when one fails, 2 when the server does not start): no error before SIGTERM (wrong answers
and failed reloads included), every kind answered, the last window's mean RSS within 10% of the second window's
(windows of ``min(60 s, duration / 3)``: for 10 minutes, the last minute against the second), zero requests lost at
shutdown, server exit status 0.  Writes a JSON file and a markdown report (``--json``, ``--markdown``, default under
``benchmarks/.work/results/``) and prints the markdown.

    .venv/bin/python benchmarks/soak.py             # 10 minutes
    .venv/bin/python benchmarks/soak.py --quick     # 60 s smoke run (reload every 15 s)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LISTEN = re.compile(r"fastoip: (grpc|http) listening on ([\d.]+):(\d+)")
#: client kinds: name -> (transport, model)
KINDS: dict[str, tuple[str, str]] = {
    "grpc-simple": ("grpc", "simple"),
    "grpc-image": ("grpc", "image_identity"),
    "http-simple": ("http", "simple"),
    "http-image": ("http", "image_identity"),
}
RELOAD_MODELS = ("mlp", "simple", "image_identity")
IMAGE_SHAPE = (1, 3, 224, 224)
# Slots of each client's shared counter array: requests sent, and every outcome by phase (before/after SIGTERM).
SENT, OK_BEFORE, ERR_BEFORE, OK_AFTER, REFUSED_AFTER, LOST_AFTER = range(6)
RSS_BOUND = 0.10


# ---------------------------------------------------------------- the server


class Server:
    """``fastoip serve`` in explicit model-control mode on ephemeral ports; ports read from its stdout."""

    def __init__(self, repository: Path, cpus: str | None, log_path: Path, extra: list[str]) -> None:
        argv = [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(repository),
                "--model-control-mode", "explicit", "--load-model", "*", "--grpc-port", "0", "--http-port", "0",
                "--metrics-port", "-1", "--shutdown-grace", "1", *extra]
        if cpus is not None:
            argv = ["taskset", "-c", cpus, *argv]  # taskset execs, so the PID stays the server's
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.argv = argv
        self.log_path = log_path
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.ports: dict[str, int] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(180) or set(self.ports) != {"grpc", "http"}:
            self.kill()
            raise RuntimeError("fastoip did not start; its log: " + log_path.read_text()[-4000:])

    def _pump(self) -> None:
        """Copy the server's output to the log (so its pipe never fills) and pick up the two ports."""
        assert self.proc.stdout is not None
        with self.log_path.open("w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                match = LISTEN.search(line)
                if match:
                    self.ports[match.group(1)] = int(match.group(3))
                    if set(self.ports) == {"grpc", "http"}:
                        self._ready.set()
        self._ready.set()

    def url(self, transport: str) -> str:
        return f"127.0.0.1:{self.ports[transport]}"

    def rss_bytes(self) -> int | None:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return int(match.group(1)) * 1024 if match else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# ---------------------------------------------------------------- the clients (one process each)


#: gRPC UNAVAILABLE texts of a request the server never took (closed listener, refused stream). Any other UNAVAILABLE,
#: e.g. "Cancelling all calls" (the server aborting calls it had accepted) or "Socket closed", counts as lost.
REFUSED_TEXTS = ("failed to connect", "connection refused", "refused_stream", "error code 7")


def classify(exc: BaseException) -> tuple[bool, str]:
    """(refused before the server took it, so safely retryable?, message) for a failed request."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        status, text = str(exc.status() or ""), str(exc.message())
        refused = status == "503" or (
            status == "StatusCode.UNAVAILABLE" and any(marker in text.lower() for marker in REFUSED_TEXTS))
        return refused, f"{status}: {text}"[:200]
    return isinstance(exc, ConnectionRefusedError), f"{type(exc).__name__}: {exc}"[:200]


def make_request(transport: str, model: str, url: str, timeout: float) -> Callable[[int], bool]:
    """A function that sends request number ``n`` and says whether the answer is right."""
    if transport == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib
    if transport == "grpc":
        client = client_lib.InferenceServerClient(url)
    else:
        client = client_lib.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
    binary = {} if transport == "grpc" else {"binary_data": model != "simple"}  # HTTP: JSON small, binary large

    def infer(inputs: list[Any], outputs: list[str]) -> Any:
        requested = [client_lib.InferRequestedOutput(name, **binary) for name in outputs]
        if transport == "grpc":
            return client.infer(model, inputs, outputs=requested, client_timeout=timeout)
        return client.infer(model, inputs, outputs=requested)

    if model == "simple":
        base = np.arange(16, dtype=np.int32).reshape(1, 16)

        def simple(n: int) -> bool:
            a, b = base + (n % 1000), np.full((1, 16), n % 7, dtype=np.int32)
            inputs = [client_lib.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a, **binary)
            inputs[1].set_data_from_numpy(b, **binary)
            result = infer(inputs, ["OUTPUT0", "OUTPUT1"])
            return bool(np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                        and np.array_equal(result.as_numpy("OUTPUT1"), a - b))

        return simple
    image = np.random.default_rng(0).random(IMAGE_SHAPE, dtype=np.float32)
    image_input = client_lib.InferInput("INPUT0", list(IMAGE_SHAPE), "FP32")
    image_input.set_data_from_numpy(image, **binary)

    def identity(n: int) -> bool:
        return bool(np.array_equal(infer([image_input], ["OUTPUT0"]).as_numpy("OUTPUT0"), image))

    return identity


def client_main(kind: str, url: str, counters: Any, sigterm_sent: Any, stop: Any,
                messages: Any, timeout: float) -> None:
    """Closed loop of one kind until ``stop``; outcomes go to ``counters`` by phase, error texts to ``messages``."""
    transport, model = KINDS[kind]
    seen: Counter[tuple[str, str]] = Counter()
    try:
        request = make_request(transport, model, url, timeout)
        n = 0
        while not stop.is_set():
            counters[SENT] += 1
            try:
                refused, text = (False, "") if request(n) else (False, "wrong answer")
            except Exception as exc:  # every failure is an outcome to count, not a crash
                refused, text = classify(exc)
            after = sigterm_sent.is_set()
            if not text:
                counters[OK_AFTER if after else OK_BEFORE] += 1
                n += 1
                continue
            phase = "after SIGTERM, refused" if after and refused else "after SIGTERM, lost" if after else "before"
            counters[(REFUSED_AFTER if refused else LOST_AFTER) if after else ERR_BEFORE] += 1
            seen[(phase, text)] += 1
            time.sleep(0.05)  # a refused or failing server is not hammered in a tight loop
    finally:
        messages.put((kind, [[phase, text, count] for (phase, text), count in seen.items()]))


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    """Everything measured; written out as JSON."""

    options: dict[str, Any]
    rss: list[dict[str, float]] = field(default_factory=list)
    reloads: list[dict[str, Any]] = field(default_factory=list)
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[list[Any]] = field(default_factory=list)
    shutdown: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)


def reload_loop(url: str, interval: float, t0: float, stop: threading.Event, run: Run) -> None:
    """``load_model`` of an already-loaded model every ``interval`` seconds, models in turn; each must stay ready."""
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(url)
    turn = 0
    while not stop.wait(t0 + interval * (turn + 1) - time.monotonic()):
        model = RELOAD_MODELS[turn % len(RELOAD_MODELS)]
        start = time.monotonic()
        try:
            client.load_model(model)
            error = "" if client.is_model_ready(model) else "not ready after reload"
        except Exception as exc:  # a failed reload is a finding, recorded and checked
            error = str(exc)[:200]
        run.reloads.append({"t": round(start - t0, 1), "model": model, "seconds": round(time.monotonic() - start, 3),
                            "error": error})
        turn += 1


def rss_window_check(samples: list[dict[str, float]], duration: float) -> dict[str, Any]:
    """The last window's mean RSS against the second window's (window = min(60 s, duration / 3))."""
    window = min(60.0, duration / 3)
    second = [s["rss_mib"] for s in samples if window <= s["t"] < 2 * window]
    last = [s["rss_mib"] for s in samples if s["t"] >= duration - window]
    name = f"RSS: mean of last {window:.0f} s within 10% of mean of [{window:.0f}, {2 * window:.0f}) s"
    check: dict[str, Any] = {"name": name, "bound": f"ratio in [{1 - RSS_BOUND:g}, {1 + RSS_BOUND:g}]"}
    if not second or not last:
        return {**check, "value": "too few samples", "passed": False}
    ratio = statistics.fmean(last) / statistics.fmean(second)
    return {**check, "value": f"{statistics.fmean(second):.1f} -> {statistics.fmean(last):.1f} MiB "
                              f"(ratio {ratio:.3f})", "ratio": ratio, "passed": abs(ratio - 1) <= RSS_BOUND}


def soak(args: argparse.Namespace, run: Run, workdir: Path) -> Run:
    """Write the repository (unless given), start the server pinned, drive it, and make sure it is gone after."""
    repository = args.repository
    if repository is None:
        repository = workdir / "repository"
        subprocess.run([sys.executable, "-m", "fastoip.cli", "demo-repository", str(repository)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL)
    pin = args.pin and shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
    run.options["pinned"] = f"server CPUs {args.server_cpus}, clients CPUs {args.client_cpus}" if pin else "no"
    server = Server(repository, args.server_cpus if pin else None, args.json.with_suffix(".server.log"),
                    args.server_arg)
    run.options["server_argv"] = server.argv
    run.options["server_log"] = str(server.log_path)
    if pin:  # the client processes inherit this
        os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cpus.split(",")})
    try:
        return drive(args, run, server)
    finally:
        server.kill()  # only if something went wrong: a finished run has seen it exit


def drive(args: argparse.Namespace, run: Run, server: Server) -> Run:
    """Load, reloads and RSS samples for ``args.duration`` seconds, then SIGTERM under load; fills ``run``."""
    ctx = mp.get_context("spawn")  # children start clean: no inherited grpc state
    sigterm_sent, stop, messages = ctx.Event(), ctx.Event(), ctx.Queue()
    clients: list[tuple[str, Any, Any]] = []
    for kind, (transport, _) in KINDS.items():
        for _ in range(args.clients_per_kind if kind in args.kinds else 0):
            counters = ctx.RawArray("q", 6)
            proc = ctx.Process(target=client_main, daemon=True, args=(
                kind, server.url(transport), counters, sigterm_sent, stop, messages, args.request_timeout))
            proc.start()
            clients.append((kind, proc, counters))

    def answered() -> dict[str, int]:
        totals: Counter[str] = Counter()
        for kind, _, counters in clients:
            totals[kind] += counters[OK_BEFORE]
        return dict(totals)

    # Warm-up: every client has one right answer before the clock starts.
    deadline = time.monotonic() + 120
    while any(c[OK_BEFORE] == 0 for _, _, c in clients) and time.monotonic() < deadline and server.proc.poll() is None:
        if any(c[ERR_BEFORE] for _, _, c in clients):
            break
        time.sleep(0.1)
    base = answered()
    t0 = time.monotonic()
    stop_reloads = threading.Event()
    reloader = threading.Thread(target=reload_loop, args=(server.url("grpc"), args.reload_interval, t0,
                                                          stop_reloads, run), daemon=True)
    reloader.start()
    previous = base
    sample = 0
    died_early = False
    while True:
        due = t0 + min(sample * args.rss_interval, args.duration)
        while (left := due - time.monotonic()) > 0 and server.proc.poll() is None:
            time.sleep(min(left, 0.5))
        if server.proc.poll() is not None:
            died_early = True
            break
        now, rss = answered(), server.rss_bytes() or 0
        run.rss.append({"t": round(time.monotonic() - t0, 1), "rss_mib": round(rss / 2**20, 1),
                        "answered": sum(now[k] - previous.get(k, 0) for k in now)})
        previous = now
        sample += 1
        if due >= t0 + args.duration:
            break
    stop_reloads.set()
    reloader.join(60)

    # SIGTERM under load: mark the phase first, so every outcome a client sees afterwards counts as "after".
    sigterm_sent.set()
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        exit_status: int | None = server.proc.wait(120)
    except subprocess.TimeoutExpired:
        exit_status = None
        server.kill()
    exited = time.monotonic()
    time.sleep(0.5)  # clients meet the closed listeners at least once
    stop.set()
    # Each client sends its error texts once, on its way out; drain them while waiting (a full pipe blocks exit).
    pending, deadline = len(clients), time.monotonic() + args.request_timeout + 10
    error_texts: Counter[tuple[str, str, str]] = Counter()
    while pending and time.monotonic() < deadline:
        try:
            kind, seen = messages.get(timeout=0.5)
        except queue.Empty:
            continue
        error_texts.update({(kind, phase, text): count for phase, text, count in seen})
        pending -= 1
    for _, proc, _ in clients:
        proc.join(5)
    run.errors = [[kind, phase, text, count] for (kind, phase, text), count in sorted(error_texts.items())]
    hung = [proc for _, proc, _ in clients if proc.is_alive()]
    for proc in hung:
        proc.kill()
        proc.join(10)

    seconds = signalled - t0
    for kind, (transport, model) in KINDS.items():
        totals = [sum(c[slot] for k, _, c in clients if k == kind) for slot in range(6)]
        outcomes = sum(totals[OK_BEFORE:])
        run.kinds[kind] = {
            "transport": transport, "model": model, "clients": args.clients_per_kind,
            "request_bytes": 128 if model == "simple" else int(np.prod(IMAGE_SHAPE)) * 4,
            "sent": totals[SENT], "answered_before_sigterm": totals[OK_BEFORE],
            "per_second": round((totals[OK_BEFORE] - base.get(kind, 0)) / seconds, 1),
            "errors_before_sigterm": totals[ERR_BEFORE], "answered_after_sigterm": totals[OK_AFTER],
            "refused_after_sigterm": totals[REFUSED_AFTER],
            "lost_after_sigterm": totals[LOST_AFTER], "no_answer": totals[SENT] - outcomes,
        }
    run.shutdown = {"exit_status": exit_status, "server_died_before_sigterm": died_early,
                    "seconds_to_exit": round(exited - signalled, 2), "hung_clients": len(hung)}

    errors = sum(k["errors_before_sigterm"] for k in run.kinds.values())
    failed_reloads = sum(1 for r in run.reloads if r["error"])
    lost = sum(k["lost_after_sigterm"] + k["no_answer"] for k in run.kinds.values())
    idle = [kind for kind, k in run.kinds.items() if k["answered_before_sigterm"] == 0 and kind in args.kinds]
    run.checks = [
        {"name": "errors before SIGTERM (wrong answers included)", "value": errors, "bound": "0",
         "passed": errors == 0 and not died_early},
        {"name": "failed reloads", "value": f"{failed_reloads} of {len(run.reloads)}", "bound": "0",
         "passed": failed_reloads == 0 and bool(run.reloads)},
        {"name": "every kind answered", "value": ", ".join(idle) or "all", "bound": "all", "passed": not idle},
        rss_window_check(run.rss, args.duration),
        {"name": "requests lost at shutdown (CANCELLED, other errors, no answer)", "value": lost, "bound": "0",
         "passed": lost == 0},
        {"name": "server exit status after SIGTERM", "value": exit_status, "bound": "0", "passed": exit_status == 0},
    ]
    return run


# ---------------------------------------------------------------- the report


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def markdown(run: Run) -> str:
    o = run.options
    parts = [f"## Soak: {o['duration']:g} s{' (smoke run)' if o['quick'] else ''}, {o['date']}",
             f"{o['machine']}; pinned: {o['pinned']}; {o['clients_per_kind']} client process(es) per kind; "
             f"reload every {o['reload_interval']:g} s; RSS every {o['rss_interval']:g} s; shutdown grace 1 s.", ""]
    parts.append(table(
        ["kind", "model", "bytes/request", "sent", "answered before SIGTERM", "req/s", "errors",
         "answered after SIGTERM", "refused after SIGTERM", "lost"],
        [[kind, k["model"], k["request_bytes"], k["sent"], k["answered_before_sigterm"], k["per_second"],
          k["errors_before_sigterm"], k["answered_after_sigterm"], k["refused_after_sigterm"],
          k["lost_after_sigterm"] + k["no_answer"]] for kind, k in run.kinds.items()]))
    reload_seconds = [r["seconds"] for r in run.reloads] or [0.0]
    parts += ["", f"Reloads: {len(run.reloads)} ({', '.join(sorted({r['model'] for r in run.reloads}))}), "
                  f"median {statistics.median(reload_seconds):.2f} s, max {max(reload_seconds):.2f} s. "
                  f"Shutdown: exit status {run.shutdown['exit_status']}, "
                  f"{run.shutdown['seconds_to_exit']} s after SIGTERM.", ""]
    parts.append(table(["t (s)", "RSS (MiB)", "answered in interval"],
                       [[s["t"], s["rss_mib"], s["answered"]] for s in run.rss]))
    if run.errors:
        parts += ["", table(["kind", "phase", "error", "count"], [[k, p, t.replace("|", "/"), c]
                                                                for k, p, t, c in run.errors])]
    parts += ["", table(["check", "value", "bound", "passed"],
                        [[c["name"], c["value"], c["bound"], "yes" if c["passed"] else "**NO**"] for c in run.checks])]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load before SIGTERM (600)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 s, a reload every 15 s")
    parser.add_argument("--reload-interval", type=float, default=None, help="seconds between reloads (30)")
    parser.add_argument("--rss-interval", type=float, default=10.0, help="seconds between RSS samples (10)")
    parser.add_argument("--clients-per-kind", type=int, default=2, help="client processes per kind (2)")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds a request may take (30)")
    parser.add_argument("--kinds", default=",".join(KINDS), type=lambda text: text.split(","),
                        help=f"client kinds to run, comma-separated (default all: {','.join(KINDS)}); "
                             "the others get no client, to attribute a finding to one transport or size")
    parser.add_argument("--repository", type=Path, default=None, help="model repository (default: the demo one)")
    parser.add_argument("--server-cpus", default=os.environ.get("SERVER_CPUS", "0"))
    parser.add_argument("--client-cpus", default=os.environ.get("CLIENT_CPUS", "1"))
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more `fastoip serve` argument, after the soak's own (repeatable; "
                             "e.g. --server-arg=--shutdown-grace=0 to see the shutdown check fail)")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server and clients")
    results = ROOT / "benchmarks" / ".work" / "results"
    parser.add_argument("--json", type=Path, default=results / "soak-latest.json")
    parser.add_argument("--markdown", type=Path, default=results / "soak-latest.md")
    args = parser.parse_args(argv)
    if unknown := set(args.kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if args.quick:
        args.duration = 60.0
        args.reload_interval = args.reload_interval or 15.0
    args.reload_interval = args.reload_interval or 30.0

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    run = Run(options={
        "duration": args.duration, "quick": args.quick, "reload_interval": args.reload_interval,
        "rss_interval": args.rss_interval, "clients_per_kind": args.clients_per_kind,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    })
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fastoip-soak-") as tmp:
        try:
            soak(args, run, Path(tmp))
        except RuntimeError as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return 2
    args.json.write_text(json.dumps(run.__dict__, indent=2, default=str) + "\n")
    report = markdown(run)
    args.markdown.write_text(report)
    print(report)
    print(f"soak: wrote {args.json} and {args.markdown}")
    return 0 if all(check["passed"] for check in run.checks) else 1


if __name__ == "__main__":
    sys.exit(main())

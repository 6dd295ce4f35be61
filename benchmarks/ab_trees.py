#!/usr/bin/env python3
"""Same-run A/B of two fastoip checkouts over native gRPC, rounds interleaved (A B, B A, A B, ...).

On a shared, busy machine the lab's one-server-after-the-other runs drift with the load of the moment; here
both servers are up at once (pinned to the same CPU), and short h2load rounds alternate between them, so
each pair of rounds sees about the same machine.  Reports per-round and median req/s and server CPU time
per request (from /proc), and the ratios B/A.

    python3 benchmarks/ab_trees.py --a main=/work/main --b native=/work/wt/native --rounds 10

Needs the lab (``benchmarks/setup.sh``: h2load, the ``std`` repository and payloads under ``--work``) and
each checkout's native extensions built; both run with the Python given by ``--python``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    """Page faults served without I/O (a freed heap page touched again, a fresh mapping) so far."""
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            status = open(f"/proc/{pid}/task/{task}/status").read()
        except OSError:
            continue  # the thread ended
        total += sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", status, re.M))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, metavar="NAME=PATH", help="the baseline checkout")
    ap.add_argument("--b", required=True, metavar="NAME=PATH", help="the checkout compared with it")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=4, help="h2load seconds per round")
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--model", default="simple")
    ap.add_argument("--work", default=os.path.join(HERE, ".work"), help="the lab's work folder")
    ap.add_argument("--python", default=os.path.join(HERE, "..", ".venv", "bin", "python"))
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--serve-args", default="", help="more `fastoip serve` arguments for both (e.g. --ort-threads 1)")
    args = ap.parse_args()

    trees = dict(spec.split("=", 1) for spec in (args.a, args.b))
    names = list(trees)
    servers: dict[str, tuple[subprocess.Popen[str], int]] = {}
    try:
        for name, tree in trees.items():
            port = free_port()
            env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"))
            argv = ["taskset", "-c", args.server_cpus, args.python, "-m", "fastoip.cli", "serve",
                    "--model-repository", os.path.join(args.work, "repos", "std"), "--host", "127.0.0.1",
                    "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1",
                    "--grpc-frontend", "native", "--log-level", "WARNING", *args.serve_args.split()]
            servers[name] = (subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              text=True), port)
        for name, (proc, port) in servers.items():
            deadline = time.monotonic() + 120
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"{name} did not start: {proc.stderr.read() if proc.stderr else ''}") from None
                    time.sleep(0.2)

        def load(name: str, seconds: int) -> tuple[float, float, float, float]:
            proc, port = servers[name]
            before = cpu_seconds(proc.pid)
            switches = context_switches(proc.pid)
            faults = minor_faults(proc.pid)
            out = subprocess.run(
                ["taskset", "-c", args.client_cpus, "h2load", "-t", "1", "-c", str(args.conc), "-m", "1",
                 "-D", str(seconds), "-d", os.path.join(args.work, "payloads", f"{args.model}.b1.grpc"),
                 "-H", "content-type: application/grpc", "-H", "te: trailers",
                 f"http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer"],
                capture_output=True, text=True, timeout=seconds + 60).stdout
            spent = cpu_seconds(proc.pid) - before
            switches = context_switches(proc.pid) - switches
            faults = minor_faults(proc.pid) - faults
            rate = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
            done = re.search(r"(\d+) succeeded, (\d+) failed", out)
            if rate is None or done is None or int(done.group(2)):
                raise SystemExit(f"h2load against {name} failed:\n{out}")
            count = max(int(done.group(1)), 1)
            return float(rate.group(1)), spent / count * 1e6, switches / count, faults / count

        for name in names:
            load(name, 2)  # warm-up
        results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                rate, cpu, switches, faults = load(name, args.seconds)
                results[name].append((rate, cpu, switches, faults))
                print(f"round {round_:2d} {name:10s} {rate:9.1f} req/s {cpu:7.1f} us server CPU/request "
                      f"{switches:5.2f} context switches/request {faults:6.1f} page faults/request", flush=True)
        medians = {name: tuple(statistics.median(row[i] for row in rows) for i in range(4))
                   for name, rows in results.items()}
        for name, (rate, cpu, switches, faults) in medians.items():
            print(f"median   {name:10s} {rate:9.1f} req/s {cpu:7.1f} us server CPU/request "
                  f"{switches:5.2f} context switches/request {faults:6.1f} page faults/request")
        a, b = names
        ratios = [rb[0] / ra[0] for ra, rb in zip(results[a], results[b], strict=True)]
        print(f"{b}/{a}: throughput {medians[b][0] / medians[a][0]:.3f} (median of per-round ratios "
              f"{statistics.median(ratios):.3f}), server CPU per request {medians[b][1] / medians[a][1]:.3f}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()

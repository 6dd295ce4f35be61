"""HTTP abuse figures: what a big header, many headers, slowloris and idle connections cost a real server.

Starts ``python -m fastoip.cli serve`` (from ``--src``, default this checkout's ``src``: pass another checkout's
``src`` to compare) on the demo repository with default HTTP settings, then, in turn:

* **big header**: one header value of up to ``--header-mb`` MB, sent in 64 KiB steps until the server answers or
  closes; reports the bytes sent before that, the answer's status line, and the server's peak RSS growth;
* **many headers**: ``--header-count`` header fields in one request; reports the answer's status line;
* **slowloris and idle**: ``--connections`` connections trickling header lines (one every 2 s, never ending the
  head) and as many that never send a byte; reports how many of each the server still holds open after
  ``--slow-hold`` and ``--idle-hold`` seconds (defaults: just over the 30 s header and 75 s keep-alive timeouts);
* a good request at the end (``GET /v2/health/ready``).

    .venv/bin/python benchmarks/http_abuse.py                        # this checkout
    .venv/bin/python benchmarks/http_abuse.py --src /path/to/other/src
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else 0.0


def start_server(src: Path, repository: Path) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(repository), "--grpc-port", "0",
            "--http-port", "0", "--metrics-port", "-1", "--shutdown-grace", "0"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = re.search(r"http listening on .*:(\d+)", line)
        if match:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
            return proc, int(match.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the server did not start")


def first_line(sock: socket.socket) -> str:
    sock.settimeout(10)
    try:
        data = sock.recv(4096)
    except OSError as exc:
        return f"({type(exc).__name__})"
    return data.split(b"\r\n", 1)[0].decode("latin-1") if data else "(closed without an answer)"


def big_header(port: int, pid: int, megabytes: int) -> dict:
    peak = [rss_mb(pid)]
    before = peak[0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    step = b"a" * 65536
    limit = megabytes * 1024 * 1024
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            while sent < limit:
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(step)
                sent += len(step)
            else:
                sock.sendall(b"\r\n\r\n")
        except OSError:
            pass
        answer = first_line(sock)
    time.sleep(0.5)
    done.set()
    sampler.join()
    return {"sent_mb": sent / 2**20, "answer": answer, "rss_growth_mb": peak[0] - before}


def many_headers(port: int, count: int) -> str:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(count))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        except OSError:
            pass
        return first_line(sock)


async def held_connections(port: int, count: int, slow_hold: float, idle_hold: float) -> dict:
    async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", port)

    slow = [await open_one() for _ in range(count)]
    idle = [await open_one() for _ in range(count)]

    def still_open(pair: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bool:
        reader, writer = pair
        return not reader.at_eof() and not writer.is_closing()

    async def trickle(pair: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        reader, writer = pair
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
        reading = asyncio.ensure_future(reader.read())
        line = 0
        while not reading.done():
            try:
                writer.write(b"X-%d: y\r\n" % line)
                await writer.drain()
            except ConnectionError:
                break
            line += 1
            await asyncio.wait([reading], timeout=2.0)
        reading.cancel()

    async def watch_idle(pair: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        try:
            await pair[0].read()
        except ConnectionError:
            pass

    tasks = [asyncio.ensure_future(trickle(pair)) for pair in slow] + [asyncio.ensure_future(watch_idle(pair))
                                                                       for pair in idle]
    start = time.monotonic()
    await asyncio.sleep(slow_hold)
    slow_open = sum(still_open(pair) for pair in slow)
    await asyncio.sleep(max(0.0, idle_hold - (time.monotonic() - start)))
    idle_open = sum(still_open(pair) for pair in idle)
    for task in tasks:
        task.cancel()
    for _, writer in slow + idle:
        writer.close()
    return {"slowloris_open": slow_open, "idle_open": idle_open}


def good_request(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        return first_line(sock)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the fastoip source tree to serve")
    parser.add_argument("--header-mb", type=int, default=200)
    parser.add_argument("--header-count", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--slow-hold", type=float, default=35.0)
    parser.add_argument("--idle-hold", type=float, default=80.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "fastoip.cli", "demo-repository", tmp], check=True,
                       env={**os.environ, "PYTHONPATH": str(args.src)}, stdout=subprocess.DEVNULL)
        proc, port = start_server(args.src, Path(tmp))
        try:
            rss = rss_mb(proc.pid)
            big = big_header(port, proc.pid, args.header_mb)
            many = many_headers(port, args.header_count)
            held = asyncio.run(held_connections(port, args.connections, args.slow_hold, args.idle_hold))
            good = good_request(port)
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"server: {args.src}  (RSS at start {rss:.0f} MB)")
    print(f"big header ({args.header_mb} MB offered): sent {big['sent_mb']:.2f} MB, answer '{big['answer']}', "
          f"peak RSS growth {big['rss_growth_mb']:.0f} MB")
    print(f"{args.header_count} headers: answer '{many}'")
    print(f"{args.connections} slowloris connections still open after {args.slow_hold:g} s: {held['slowloris_open']}")
    print(f"{args.connections} idle connections still open after {args.idle_hold:g} s: {held['idle_open']}")
    print(f"good request afterwards: '{good}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``fastoip bench openai embeddings|chat|completions URL -m MODEL``: load OpenAI's routes, closed loop.

Each of C connections (HTTP/1.1 keep-alive, httptools' parser: no hand-written HTTP framing) sends its next
request when the previous answer ends, for ``--duration`` seconds per concurrency level:

- ``embeddings``: ``POST /v1/embeddings`` with ``--inputs`` texts of ``--text`` each; requests/s, inputs/s and
  latency percentiles.
- ``chat`` / ``completions``: streamed (``stream: true``) ``POST /v1/chat/completions`` / ``/v1/completions``
  with ``max_tokens`` ``--max-tokens``; time to first token (the first content event), inter-token latency (the
  gaps between content events), output tokens/s (content events: one per model response, a token for models
  that stream one token a response) and requests/s.
- ``generate``: the same generation through Triton's generate extension (``/v2/models/{m}/generate_stream``,
  ``text_input`` and ``sampling_parameters``), to compare what the OpenAI translation costs.

Errors are counted by HTTP status or ``CONNECTION_ERROR``; an answer that is not 200 ends that request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson

ROUTES = {"embeddings": "/v1/embeddings", "chat": "/v1/chat/completions", "completions": "/v1/completions",
          "generate": "/v2/models/{model}/generate_stream"}


@dataclass
class Level:
    """What one concurrency level measured."""

    concurrency: int
    seconds: float
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    tokens: int = 0

    def summary(self, inputs: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "concurrency": self.concurrency, "seconds": self.seconds, "requests_per_s": self.requests / self.seconds,
            "latency_p50_ms": _percentile(self.latencies_ms, 50), "latency_p99_ms": _percentile(self.latencies_ms, 99),
            "errors": self.errors,
        }
        if self.ttft_ms:
            out.update({"ttft_p50_ms": _percentile(self.ttft_ms, 50), "ttft_p99_ms": _percentile(self.ttft_ms, 99),
                        "itl_p50_ms": _percentile(self.itl_ms, 50), "itl_p99_ms": _percentile(self.itl_ms, 99),
                        "tokens_per_s": self.tokens / self.seconds})
        else:
            out["inputs_per_s"] = self.requests * inputs / self.seconds
        return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class _Client(asyncio.Protocol):
    """One keep-alive connection sending ``payload`` again and again until ``stop_at``."""

    def __init__(self, payload: bytes, level: Level, stop_at: float, done: asyncio.Future[None]) -> None:
        self.payload = payload
        self.level = level
        self.stop_at = stop_at
        self.done = done
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.sent = self.first = self.last = 0.0
        self.pending = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        if time.perf_counter() >= self.stop_at:
            self.transport.close()
            return
        self.sent, self.first, self.last, self.pending = time.perf_counter(), 0.0, 0.0, b""
        self.transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._error("BAD_RESPONSE")
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        # Server-Sent Events: the time of each content event (role, usage and [DONE] events carry none)
        now = time.perf_counter()
        events = (self.pending + body).split(b"\n\n")
        self.pending = events.pop()
        for event in events:
            if not event.startswith(b"data: {") or (b'"content":"' not in event and b'"text":"' not in event
                                                     and b'"text_output":"' not in event):
                continue
            if b'"content":""' in event or b'"text":""' in event or b'"text_output":""' in event:
                continue
            if self.first == 0.0:
                self.first = now
                self.level.ttft_ms.append((now - self.sent) * 1e3)
            else:
                self.level.itl_ms.append((now - self.last) * 1e3)
            self.last = now
            self.level.tokens += 1

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status == 200:
            self.level.requests += 1
            self.level.latencies_ms.append((time.perf_counter() - self.sent) * 1e3)
        else:
            self._error(str(status))
        self._send()

    def _error(self, kind: str) -> None:
        self.level.errors[kind] = self.level.errors.get(kind, 0) + 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def request_body(kind: str, model: str, text: str, inputs: int, max_tokens: int) -> bytes:
    if kind == "embeddings":
        return orjson.dumps({"model": model, "input": [text] * inputs if inputs > 1 else text})
    if kind == "generate":
        return orjson.dumps({"text_input": text, "sampling_parameters": orjson.dumps({"max_tokens": max_tokens})
                             .decode(), "stream": True})
    if kind == "chat":
        return orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
                             "max_tokens": max_tokens})
    return orjson.dumps({"model": model, "prompt": text, "stream": True, "max_tokens": max_tokens})


async def run_level(host: str, port: int, path: str, body: bytes, concurrency: int, seconds: float) -> Level:
    loop = asyncio.get_running_loop()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    level = Level(concurrency, seconds)
    stop_at = time.perf_counter() + seconds
    finished = []
    for _ in range(concurrency):
        done: asyncio.Future[None] = loop.create_future()
        try:
            await loop.create_connection(partial(_Client, head + body, level, stop_at, done), host, port)
        except OSError:
            level.errors["CONNECTION_ERROR"] = level.errors.get("CONNECTION_ERROR", 0) + 1
            continue
        finished.append(done)
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*finished), timeout=seconds + 120)
    level.seconds = time.perf_counter() - started
    return level


def main(argv: list[str]) -> int:
    """``fastoip bench openai ...`` (argv after ``openai``)."""
    p = argparse.ArgumentParser(prog="fastoip bench openai", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(ROUTES))
    p.add_argument("url", help="http://HOST:PORT (the API at /v1: the HTTP port, or --openai-port) or "
                   "http://HOST:PORT/ROOT (e.g. /openai/v1)")
    p.add_argument("-m", "--model-name", required=True)
    p.add_argument("--concurrency-range", default="1", metavar="START[:END[:STEP]]",
                   help="levels; STEP multiplies (1:64:4 is 1, 4, 16, 64)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level (default 10)")
    p.add_argument("--text", default="The quick brown fox jumps over the lazy dog.",
                   help="each input text (embeddings) or the prompt")
    p.add_argument("--inputs", type=int, default=1, help="texts per embeddings request (default 1)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of a generation (default 64)")
    p.add_argument("--json", metavar="PATH.json", help="write the levels as JSON")
    args = p.parse_args(argv)
    url = urlsplit(args.url if "://" in args.url else f"http://{args.url}")
    if url.scheme != "http" or url.hostname is None:
        p.error("the URL must be http://HOST:PORT")
    parts = [int(x) for x in args.concurrency_range.split(":")]
    start, end, step = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else 2
    levels_wanted = []
    level = start
    while level <= end:
        levels_wanted.append(level)
        level = level * step if step > 1 else level + 1
    body = request_body(args.kind, args.model_name, args.text, args.inputs, args.max_tokens)
    # http://HOST:PORT means /v1; a URL with a path (http://HOST:PORT/openai/v1) names the API's root
    if args.kind == "generate":
        path = ROUTES["generate"].format(model=args.model_name)
    else:
        path = (url.path.rstrip("/") or "/v1") + ROUTES[args.kind].removeprefix("/v1")
    results = []
    for concurrency in levels_wanted:
        measured = asyncio.run(run_level(url.hostname, url.port or 80, path, body, concurrency, args.duration))
        summary = measured.summary(args.inputs)
        results.append(summary)
        print(" ".join(f"{key}={value:.1f}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in summary.items()), flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"kind": args.kind, "model": args.model_name, "levels": results}, file, indent=1)
    return 0 if all(not r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Results: the documented schema, the rich table, JSON, CSV and ``compare``.

JSON (``--json PATH``), schema version 1::

    {
      "tool": "fastoip bench",            # str
      "schema": 1,                        # int
      "version": "0.1.0",                 # str, fastoip's version
      "url": "grpc://127.0.0.1:8001",     # str
      "protocol": "grpc",                 # "grpc" | "http"
      "model": "simple",                  # str, or null when several models were measured
      "models": ["simple"],               # list[str]
      "batch_size": 1,                    # int
      "server": {"name", "version", "extensions"} | null,
      "local_server": {"pid", "cpus", "client_cpus"} | null,   # set when bench started the server
      "client": {"kind", "processes", "channels"},
      "settings": {"window_ms", "warmup_ms", "max_trials", "stability_pct", "percentile"},
      "error": {"stage", "status", "message"} | null,          # a failure that stopped the run
      "results": [ROW, ...]
    }

    ROW = {
      "model": str, "target": "server" | "ceiling",
      "client": "native" | "future" | "aio" | "native-stream" | "aio-stream" | "http",   # the load generator used
      "mode": "concurrency" | "request_rate",
      "concurrency": int | null,          # set in concurrency mode
      "request_rate": float | null,       # set in request-rate mode (requests/s asked for)
      "batch_size": int,
      "throughput_infer_per_s": float,    # successful requests/s x batch size
      "throughput_req_per_s": float,
      "latency_us": {"avg", "p50", "p90", "p95", "p99"},   # float | null each (null: no success)
      "errors": {STATUS: int},            # gRPC status name, HTTP code, or CONNECTION_REFUSED,
                                          # CONNECTION_ERROR, TIMEOUT, BAD_RESPONSE, CANCELLED
      "requests": int,                    # successful requests in the reported windows
      "stable": bool, "windows": int, "window_ms": int, "duration_s": float,
      "send_rate_per_s": float, "late_sends": int,
      "client_cpu_percent": float | null, "server_cpu_percent": float | null,  # 100 = one core
      "other_cpu_percent": float | null,  # CPU of every other process on this machine (Linux
                                          # /proc/stat minus client and started server): noise
      "server": {                         # null unless the server has the "statistics" extension
        "requests", "failures", "inference_count", "execution_count": int,
        "request_us", "queue_us", "compute_input_us", "compute_infer_us",
        "compute_output_us", "avg_batch_size": float | null   # per request averages
      } | null
    }

CSV (``-f PATH``): one row per ROW, columns :data:`CSV_COLUMNS`; ``latency_us``
becomes ``latency_avg_us`` ... ``latency_p99_us``, ``server`` becomes
``server_*`` columns, ``errors`` becomes ``errors_total`` plus ``errors`` as
``STATUS=count`` pairs joined by ``;``.  Empty cells are nulls.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # rich is imported where a table is drawn: `fastoip bench --json` does without
    from rich.console import JustifyMethod

SCHEMA_VERSION = 1
#: Above this other_cpu_percent a level is flagged as measured on a busy machine.
BUSY_OTHER_PERCENT = 25.0
TOOL = "fastoip bench"
LATENCY_KEYS = ("avg", "p50", "p90", "p95", "p99")
SERVER_KEYS = (
    "requests",
    "failures",
    "inference_count",
    "execution_count",
    "request_us",
    "queue_us",
    "compute_input_us",
    "compute_infer_us",
    "compute_output_us",
    "avg_batch_size",
)
#: Top-level keys and their types (None in a tuple: may be null).
TOP_LEVEL_TYPES: dict[str, tuple] = {
    "tool": (str,),
    "schema": (int,),
    "version": (str,),
    "url": (str,),
    "protocol": (str,),
    "model": (str, type(None)),
    "models": (list,),
    "batch_size": (int,),
    "server": (dict, type(None)),
    "local_server": (dict, type(None)),
    "client": (dict,),
    "settings": (dict,),
    "error": (dict, type(None)),
    "results": (list,),
}
#: Result row keys and their types.
ROW_TYPES: dict[str, tuple] = {
    "model": (str,),
    "target": (str,),
    "client": (str,),
    "mode": (str,),
    "concurrency": (int, type(None)),
    "request_rate": (float, int, type(None)),
    "batch_size": (int,),
    "throughput_infer_per_s": (float, int),
    "throughput_req_per_s": (float, int),
    "latency_us": (dict,),
    "errors": (dict,),
    "requests": (int,),
    "stable": (bool,),
    "windows": (int,),
    "window_ms": (int,),
    "duration_s": (float, int),
    "send_rate_per_s": (float, int),
    "late_sends": (int,),
    "client_cpu_percent": (float, int, type(None)),
    "server_cpu_percent": (float, int, type(None)),
    "other_cpu_percent": (float, int, type(None)),
    "server": (dict, type(None)),
}
CSV_COLUMNS = tuple(
    [
        "model",
        "target",
        "client",
        "mode",
        "concurrency",
        "request_rate",
        "batch_size",
        "throughput_infer_per_s",
        "throughput_req_per_s",
    ]
    + [f"latency_{k}_us" for k in LATENCY_KEYS]
    + [
        "requests",
        "errors_total",
        "errors",
        "stable",
        "windows",
        "window_ms",
        "duration_s",
        "send_rate_per_s",
        "late_sends",
        "client_cpu_percent",
        "server_cpu_percent",
        "other_cpu_percent",
    ]
    + [f"server_{k}" for k in SERVER_KEYS]
)


def validate(document: dict) -> list[str]:
    """Problems of a JSON document against the schema (empty list: valid)."""
    problems = []

    def check(obj: dict, types: dict[str, tuple], where: str) -> None:
        for key, allowed in types.items():
            if key not in obj:
                problems.append(f"{where}: missing '{key}'")
            elif not isinstance(obj[key], allowed) or (bool not in allowed and isinstance(obj[key], bool)):
                problems.append(f"{where}: '{key}' is {type(obj[key]).__name__}")

    check(document, TOP_LEVEL_TYPES, "top level")
    for index, row in enumerate(document.get("results", [])):
        where = f"results[{index}]"
        check(row, ROW_TYPES, where)
        latency = row.get("latency_us", {})
        for key in LATENCY_KEYS:
            if key not in latency or not isinstance(latency[key], (float, int, type(None))):
                problems.append(f"{where}: latency_us.{key} missing or not a number")
        for status, count in row.get("errors", {}).items():
            if not isinstance(status, str) or not isinstance(count, int):
                problems.append(f"{where}: errors[{status!r}] must map str -> int")
        server = row.get("server")
        if isinstance(server, dict):
            for key in SERVER_KEYS:
                if key not in server:
                    problems.append(f"{where}: server.{key} missing")
        if row.get("mode") == "concurrency" and not isinstance(row.get("concurrency"), int):
            problems.append(f"{where}: concurrency mode without an int 'concurrency'")
        if row.get("mode") == "request_rate" and row.get("request_rate") is None:
            problems.append(f"{where}: request_rate mode without 'request_rate'")
    return problems


# --------------------------------------------------------------------------- files
def write_json(document: dict, path: str) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


def csv_row(row: dict) -> dict[str, Any]:
    flat: dict[str, Any] = {key: row.get(key) for key in CSV_COLUMNS if key in row}
    for key in LATENCY_KEYS:
        flat[f"latency_{key}_us"] = row["latency_us"].get(key)
    flat["errors_total"] = sum(row["errors"].values())
    flat["errors"] = ";".join(f"{status}={count}" for status, count in row["errors"].items())
    server = row.get("server") or {}
    for key in SERVER_KEYS:
        flat[f"server_{key}"] = server.get(key)
    return {key: ("" if flat.get(key) is None else flat[key]) for key in CSV_COLUMNS}


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow(csv_row(row))


# --------------------------------------------------------------------------- table
def _ms(us: float | None) -> str:
    if us is None:
        return "-"
    ms = us / 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _level(row: dict) -> str:
    return f"c={row['concurrency']}" if row["mode"] == "concurrency" else f"r={row['request_rate']:g}/s"


def _errors(errors: dict) -> str:
    return ", ".join(f"{status}:{count}" for status, count in errors.items()) or "0"


#: Width of the default table: an 80-column terminal or CI log shows it whole.
COMPACT_WIDTH = 80


def render_table(document: dict, out: TextIO | None = None, wide: bool = False) -> None:
    """The final results table (rich): compact (80 columns) by default, every column with ``wide``."""
    stream = out or sys.stdout
    if not wide:
        _render_compact(document, stream)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream, width=None if stream.isatty() else 240, soft_wrap=False)
    rows = document["results"]
    show_server = any(r.get("server") for r in rows)
    show_cpu = any(r.get("server_cpu_percent") is not None for r in rows)
    title = f"fastoip bench  {document['url']}  batch {document['batch_size']}"
    table = Table(title=title, title_justify="left")
    for name in (
        "model",
        "target",
        "level",
        "infer/s",
        "req/s",
        "avg ms",
        "p50 ms",
        "p90 ms",
        "p95 ms",
        "p99 ms",
        "errors",
        "stable",
    ):
        justify: JustifyMethod = "left" if name in ("model", "target", "level", "errors", "stable") else "right"
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("cli cpu%", justify="right")
    if show_cpu:
        table.add_column("srv cpu%", justify="right")
    if show_server:
        for name in ("queue µs", "in µs", "infer µs", "out µs", "batch"):
            table.add_column(name, justify="right")
    for row in rows:
        latency = row["latency_us"]
        cells = [
            row["model"],
            row["target"],
            _level(row),
            f"{row['throughput_infer_per_s']:.0f}",
            f"{row['throughput_req_per_s']:.0f}",
            *[_ms(latency[k]) for k in LATENCY_KEYS],
            _errors(row["errors"]),
            "yes" if row["stable"] else "NO",
            "-" if row["client_cpu_percent"] is None else f"{row['client_cpu_percent']:.0f}",
        ]
        if show_cpu:
            cells.append("-" if row.get("server_cpu_percent") is None else f"{row['server_cpu_percent']:.0f}")
        if show_server:
            server = row.get("server") or {}
            cells += [
                _us(server.get("queue_us")),
                _us(server.get("compute_input_us")),
                _us(server.get("compute_infer_us")),
                _us(server.get("compute_output_us")),
                "-" if server.get("avg_batch_size") is None else f"{server['avg_batch_size']:.1f}",
            ]
        table.add_row(*cells)
    console.print(table)
    _notes(console, document)


def _render_compact(document: dict, stream: TextIO) -> None:
    """level, infer/s and perf_analyzer's percentiles (p50/p90/p95/p99) in at most 80 columns; the model is
    a column only when several were measured, the target only when the ceiling was."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream, width=COMPACT_WIDTH if not stream.isatty() else None, soft_wrap=False)
    rows = document["results"]
    models = sorted({r["model"] for r in rows})
    targets = {r["target"] for r in rows}
    title = (f"{document['url']}  batch {document['batch_size']}" + (f"  model {models[0]}" if len(models) == 1 else "")
             + "  latency in ms")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0),
                  caption="* not stable; --wide: req/s, avg, errors by status, CPU, server split",
                  caption_justify="left")
    columns = [*(["model"] if len(models) > 1 else []), *(["target"] if len(targets) > 1 else []),
               "level", "infer/s", "p50", "p90", "p95", "p99", "errors"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("model", "target", "level", "errors") else "right",
                         no_wrap=True, overflow="ellipsis", max_width=14 if name == "model" else None)
    for row in rows:
        latency = row["latency_us"]
        cells = [*([row["model"]] if len(models) > 1 else []), *([row["target"]] if len(targets) > 1 else []),
                 _level(row), f"{row['throughput_infer_per_s']:.0f}" + ("" if row["stable"] else "*"),
                 *[_ms(latency[k]) for k in ("p50", "p90", "p95", "p99")], str(sum(row["errors"].values()))]
        table.add_row(*cells)
    console.print(table)
    _notes(console, document)


def _notes(console: Any, document: dict) -> None:
    rows = document["results"]
    unstable = [r for r in rows if not r["stable"]]
    if unstable:
        console.print(
            f"[yellow]{len(unstable)} level(s) not stable within {document['settings']['stability_pct']:g}% "
            f"after {document['settings']['max_trials']} windows (reported: the last 3 windows).[/yellow]"
        )
    busy = [r["other_cpu_percent"] for r in rows if (r.get("other_cpu_percent") or 0) > BUSY_OTHER_PERCENT]
    if busy:
        console.print(
            f"[yellow]Other processes used up to {max(busy):.0f}% of a core during {len(busy)} level(s): "
            f"the machine was busy, expect disturbed numbers.[/yellow]"
        )


# --------------------------------------------------------------------------- compare
def _key(row: dict) -> tuple:
    level = row["concurrency"] if row["mode"] == "concurrency" else row["request_rate"]
    return (row["model"], row.get("target", "server"), row["mode"], level)


def compare(path_a: str, path_b: str, out: TextIO | None = None) -> int:
    """Per-level ratios B/A of throughput and p99 for rows present in both files."""
    from rich.console import Console
    from rich.table import Table

    docs = []
    for path in (path_a, path_b):
        try:
            docs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            print(f"fastoip bench compare: {path}: {exc}", file=sys.stderr)
            return 1
    rows_a = {_key(r): r for r in docs[0].get("results", [])}
    rows_b = {_key(r): r for r in docs[1].get("results", [])}
    common = [k for k in rows_a if k in rows_b]
    stream = out or sys.stdout
    console = Console(file=stream, width=None if stream.isatty() else 200, soft_wrap=False)
    if not common:
        console.print("no common levels (model, target, mode, level) between the two files")
        return 1
    table = Table(title=f"B/A  A={path_a}  B={path_b}", title_justify="left")
    for name in (
        "model",
        "target",
        "level",
        "A infer/s",
        "B infer/s",
        "throughput B/A",
        "A p99 ms",
        "B p99 ms",
        "p99 B/A",
    ):
        table.add_column(name, justify="left" if name in ("model", "target", "level") else "right", no_wrap=True)

    def ratio(b: float | None, a: float | None) -> str:
        return f"{b / a:.2f}x" if a and b is not None else "-"

    for key in common:
        a, b = rows_a[key], rows_b[key]
        pa, pb = a["latency_us"]["p99"], b["latency_us"]["p99"]
        table.add_row(
            key[0],
            key[1],
            _level(a),
            f"{a['throughput_infer_per_s']:.0f}",
            f"{b['throughput_infer_per_s']:.0f}",
            ratio(b["throughput_infer_per_s"], a["throughput_infer_per_s"]),
            _ms(pa),
            _ms(pb),
            ratio(pb, pa),
        )
    console.print(table)
    return 0

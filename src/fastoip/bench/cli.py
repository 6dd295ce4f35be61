"""``fastoip bench [URL] ...`` and ``fastoip bench compare A.json B.json``.

Flags follow perf_analyzer's names where it has one.  Without a URL the bench
starts a fastoip on the built-in demo repository (pinned apart from the
client where the machine has 2+ CPUs), measures a short default sweep
(models simple and mlp at concurrency 1, 8, 64, 1 s windows), prints the
table and stops the server.

Exit status: 0 measured without errors; 3 measured, but some requests
failed (see the errors column); 1 a failure before or between measurements
(unknown model, server down, bad flags ...), with a message on stderr and an
``"error"`` object in the JSON; 2 usage errors; 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .target import BenchError, Target
from .tls import tls_from_args

LOCAL_MODELS = ["simple", "mlp"]
LOCAL_LEVELS = [1, 8, 64]


# --------------------------------------------------------------------------- arguments
def parse_range(text: str, kind: Callable[[str], Any], flag: str) -> list:
    """``start:end:step`` (perf_analyzer), ``start:end`` (step 1), ``N``, or a list ``1,8,64``."""
    try:
        if "," in text:
            values = [kind(v) for v in text.split(",") if v.strip()]
        else:
            parts = text.split(":")
            if len(parts) > 3:
                raise ValueError
            start = kind(parts[0])
            end = kind(parts[1]) if len(parts) > 1 and parts[1] else start
            step = kind(parts[2]) if len(parts) > 2 and parts[2] else kind("1")
            if step <= 0 or end < start:
                raise ValueError
            values, value = [], start
            while value <= end + 1e-9 and len(values) <= 1000:
                values.append(value)
                value += step
    except ValueError:
        raise BenchError(
            f"{flag} {text!r}: expected start:end:step, start:end, N or a list a,b,c", stage="args"
        ) from None
    if not values or any(v <= 0 for v in values) or len(values) > 1000:
        raise BenchError(f"{flag} {text!r}: levels must be > 0 (at most 1000 of them)", stage="args")
    return values


def build_parser() -> argparse.ArgumentParser:
    from .load import DEFAULT_GRPC_CLIENT

    p = argparse.ArgumentParser(
        prog="fastoip bench",
        # perf_analyzer's flags are taken whole: a prefix never stands for a longer flag
        allow_abbrev=False,
        description="Throughput and latency of any Open Inference Protocol (KServe V2 / Triton) server. "
        "As perf_analyzer: HTTP unless -i grpc or a grpc:// URL; without a URL, localhost:8000 (HTTP) or "
        "localhost:8001 (gRPC). --local-server instead starts a private fastoip on the demo repository and runs a "
        "short default sweep.",
        epilog="Also: fastoip bench compare A.json B.json  (per-level ratios B/A of throughput and p99); "
        "fastoip bench openai embeddings|chat|completions URL -m MODEL  (OpenAI's routes: TTFT, inter-token "
        "latency, tokens/s)",
    )
    p.add_argument("url", nargs="?", help="grpc://HOST:PORT, http://HOST:PORT or HOST:PORT (protocol from -i); "
                   "default localhost:8000, or localhost:8001 with -i grpc")
    p.add_argument("-u", "--url", dest="url_option", metavar="URL", help="same as the positional URL")
    p.add_argument(
        "-m",
        "--model-name",
        dest="models",
        action="append",
        metavar="MODEL",
        help="model to measure (repeat or comma-separate for several); required with a URL",
    )
    p.add_argument(
        "-x", "--model-version", default="", metavar="VERSION", help="model version (default: the server's choice)"
    )
    p.add_argument(
        "-i", "--protocol", type=str.lower, choices=("grpc", "http"),
        help="default: from the URL, else http (perf_analyzer's default)",
    )
    p.add_argument("--local-server", action="store_true",
                   help="start a private fastoip on the demo repository (gRPC unless -i http), measure it, stop it; "
                        "default models and levels: a short sweep")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="batch size of every request (default 1)")
    p.add_argument(
        "--concurrency-range",
        metavar="START:END:STEP",
        help="closed loop: C requests outstanding (default 1; without a URL 1,8,64)",
    )
    p.add_argument("--request-rate-range", metavar="START:END:STEP", help="open loop: requests per second")
    p.add_argument(
        "--request-distribution",
        choices=("constant", "poisson"),
        default="constant",
        help="request-rate mode schedule (default constant)",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2",
        help="dims of an input with variable (-1) dims, without the batch dim (repeatable)",
    )
    p.add_argument(
        "--input-data",
        default="random",
        metavar="zero|random|FILE.json",
        help='tensor contents (default random); FILE.json in perf_analyzer\'s {"data": [...]} format',
    )
    p.add_argument("--string-length", type=int, default=128, help="length of generated BYTES elements (default 128)")
    p.add_argument(
        "--streaming", action="store_true", help="use ModelStreamInfer (bidirectional streams) instead of ModelInfer"
    )
    p.add_argument(
        "--shared-memory",
        choices=("none", "system", "cuda"),
        default="none",
        help="inputs (and fixed-size outputs) in system or CUDA (GPU 0, cudaIPC) shared memory regions",
    )
    p.add_argument(
        "-p",
        "--measurement-interval",
        dest="window_ms",
        type=int,
        metavar="MS",
        help="measurement window in ms (default 5000; without a URL 1000)",
    )
    p.add_argument(
        "--percentile", type=int, help="stability and headline on this latency percentile instead of the average"
    )
    p.add_argument(
        "-s",
        "--stability-percentage",
        dest="stability",
        type=float,
        default=10.0,
        help="allowed spread of the last 3 windows, in %% (default 10)",
    )
    p.add_argument("-r", "--max-trials", type=int, help="most windows per level (default 10; without a URL 5)")
    p.add_argument(
        "--warmup-ms", type=int, help="load before the first window, discarded (default 1000; without a URL 500)"
    )
    p.add_argument("-f", "--latency-report-file", dest="csv", metavar="PATH.csv",
                   help="write the results as perf_analyzer's CSV (one model; --fastoip-csv: fastoip's columns)")
    p.add_argument("--verbose-csv", action="store_true",
                   help="perf_analyzer's extra CSV columns: Avg latency, request/response, response wait (+ GPU)")
    p.add_argument("--fastoip-csv", action="store_true",
                   help="-f writes fastoip's richer columns (every model and level, server split) instead")
    p.add_argument("--json", metavar="PATH.json", help="write the results as JSON (schema in fastoip/bench/report.py)")
    _perf_analyzer_flags(p)
    p.add_argument("--processes", type=int, default=1, help="client processes sharing the load (default 1)")
    p.add_argument(
        "--grpc-client",
        choices=("auto", "native", "future", "aio"),
        default=DEFAULT_GRPC_CLIENT,
        help="gRPC client: native (nghttp2 driven from C, closed-loop unary plaintext uncompressed load only), "
        "grpcio future callbacks or grpc.aio (default auto: native wherever it can carry the load and is built; "
        "else future below concurrency 8, aio from 8, in request-rate mode and for --streaming)",
    )
    p.add_argument(
        "--grpc-channels",
        type=int,
        default=0,
        help="gRPC connections per client process (default: min(C, 4) for the grpcio clients; native: one per "
        "100 calls or streams in flight, or for requests of 64 KiB or more one per unary call up to 16 and "
        "min(C, 4) for streams)",
    )
    p.add_argument(
        "--http-binary",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="HTTP bodies with Triton's binary tensor extension (default on); --no-http-binary: V2 JSON",
    )
    p.add_argument("--request-timeout", type=float, default=30.0, help="seconds before a request counts as failed")
    p.add_argument("--max-outstanding", type=int, default=4096, help="request-rate mode: cap on requests in flight")
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also measure a fixed-response server with the same load: the client's own limit",
    )
    p.add_argument("--verify", action="store_true", help="check outputs of the demo models against reference values")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress display and no notes (the table is still printed)"
    )
    p.add_argument(
        "--wide", action="store_true",
        help="the full results table (req/s, avg, stability, CPU, the server's queue/compute split, batch); "
        "default: a table that fits 80 columns"
    )
    p.add_argument("--no-pin", action="store_true", help="without a URL: do not pin server and client to separate CPUs")
    return p


class _Refuse(argparse.Action):
    """A perf_analyzer flag fastoip bench cannot honour: refused by name, with the reason."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from .perf_analyzer import REFUSED

        reason = REFUSED[str(option_string)]
        parser.error(f"perf_analyzer's {option_string} is not supported by fastoip bench: {reason}")


def _perf_analyzer_flags(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's flags that scripts pass: honoured here, or refused by name (perf_analyzer.REFUSED)."""
    from .perf_analyzer import REFUSED

    mode = p.add_mutually_exclusive_group()
    # fastoip's generators keep C requests outstanding whichever way perf_analyzer would issue them.
    mode.add_argument("-a", "--async", dest="async_mode", action="store_true",
                      help="perf_analyzer's asynchronous API: C requests outstanding (fastoip bench always does so)")
    mode.add_argument("--sync", dest="sync_mode", action="store_true",
                      help="perf_analyzer's synchronous API: C requests outstanding, the same closed loop")
    p.add_argument("-H", dest="headers", action="append", default=[], metavar="HEADER:VALUE",
                   help="an HTTP header, or gRPC metadata (name lower-cased), on every request (repeatable)")
    p.add_argument("--measurement-mode", choices=("time_windows", "count_windows"), default="time_windows",
                   help="windows of -p milliseconds, or of --measurement-request-count requests")
    p.add_argument("--measurement-request-count", type=int, default=50,
                   help="count_windows: completed requests per window (default 50)")
    p.add_argument("--request-count", type=int, default=0,
                   help="measure one window of this many completed requests (no stability rule)")
    p.add_argument("--warmup-request-count", type=int, default=0,
                   help="warm up with this many completed requests instead of --warmup-ms")
    p.add_argument("--collect-metrics", action="store_true",
                   help="scrape the server's GPU metrics (nv_gpu_*) during each level, as perf_analyzer")
    p.add_argument("--metrics-url", help="default localhost:8002/metrics (needs --collect-metrics)")
    p.add_argument("--metrics-interval", type=int, default=1000, metavar="MS", help="between scrapes (default 1000)")
    p.add_argument("--grpc-compression-algorithm", choices=("none", "gzip", "deflate"), default="none",
                   help="compress gRPC requests")
    p.add_argument("--request-parameter", action="append", default=[], metavar="NAME:VALUE:TYPE",
                   help="a request parameter (TYPE string, int or bool) on every request (repeatable)")
    p.add_argument("--string-data", help="this string in every element of BYTES inputs")
    p.add_argument("--profile-export-file", metavar="PATH.json",
                   help="perf_analyzer's profile export: send and response time of each successful request of "
                        "the reported windows (request_inputs and response_outputs left empty)")
    p.add_argument("--data-directory", metavar="DIR",
                   help="a file per input named after it: raw little-endian values, or one BYTES element a line")
    _tls_flags(p)
    for flag in sorted(REFUSED):
        p.add_argument(flag, nargs="?", action=_Refuse, help=argparse.SUPPRESS)


def _tls_flags(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's TLS flags (fastoip.bench.tls); HTTPS itself is asked for with an https:// URL."""
    from ..triton_flags import parse_bool

    p.add_argument("--ssl-grpc-use-ssl", nargs="?", const=True, default=False, type=parse_bool, metavar="BOOL",
                   help="gRPC over TLS (the bare switch, or =true)")
    p.add_argument("--ssl-grpc-root-certifications-file", metavar="PEM",
                   help="CA certificates the server's certificate must chain to (default: gRPC's roots)")
    p.add_argument("--ssl-grpc-private-key-file", metavar="PEM", help="the client's key (mutual TLS)")
    p.add_argument("--ssl-grpc-certificate-chain-file", metavar="PEM", help="the client's certificate chain")
    p.add_argument("--ssl-https-verify-peer", type=int, choices=(0, 1), default=None,
                   help="https:// URL: check the server's certificate (curl's meaning; default 1)")
    p.add_argument("--ssl-https-verify-host", type=int, choices=(0, 1, 2), default=None,
                   help="https:// URL: check the certificate's name against the host (0 off; default 2)")
    p.add_argument("--ssl-https-ca-certificates-file", metavar="PEM", help="https:// URL: CA bundle")
    p.add_argument("--ssl-https-client-certificate-file", metavar="PEM", help="https:// URL: client certificate")
    p.add_argument("--ssl-https-client-certificate-type", metavar="PEM|DER", default=None,
                   help="PEM only (DER is refused)")
    p.add_argument("--ssl-https-private-key-file", metavar="PEM", help="https:// URL: the client certificate's key")
    p.add_argument("--ssl-https-private-key-type", metavar="PEM|DER", default=None, help="PEM only (DER is refused)")


@dataclass
class Settings:
    """The parsed and defaulted command line."""

    target: Target | None
    models: list[str]
    version: str
    protocol: str
    batch_size: int
    mode: str
    levels: list
    shapes: dict[str, list[int]]
    args: argparse.Namespace
    window_ms: int
    warmup_ms: int
    max_trials: int
    local: bool = False
    notes: list[str] = field(default_factory=list)
    #: --request-parameter, typed; -H as (name, value).
    request_parameters: dict[str, Any] = field(default_factory=dict)
    headers: list[tuple[str, str]] = field(default_factory=list)


def parse_request_parameter(text: str) -> tuple[str, Any]:
    """perf_analyzer's ``name:value:type`` (type string, int or bool)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise BenchError(f"--request-parameter {text!r}: expected NAME:VALUE:TYPE", stage="args")
    name, value, kind = parts[0], parts[1], parts[2].lower()
    if kind == "string":
        return name, value
    if kind == "int":
        try:
            return name, int(value)
        except ValueError:
            raise BenchError(f"--request-parameter {text!r}: {value!r} is not an int", stage="args") from None
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise BenchError(f"--request-parameter {text!r}: a bool is true or false", stage="args")
        return name, value.lower() == "true"
    raise BenchError(f"--request-parameter {text!r}: TYPE must be string, int or bool", stage="args")


def parse_header(text: str) -> tuple[str, str]:
    """perf_analyzer's ``-H Header:Value`` (the value is everything after the first colon)."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise BenchError(f"-H {text!r}: expected HEADER:VALUE", stage="args")
    if any(c in text for c in "\r\n\0"):
        raise BenchError(f"-H {text!r}: a header holds no line breaks or NUL", stage="args")
    return name.strip(), value.strip()  # RFC 9110: whitespace around a field value is not part of it


def stream_kind(rows: list[dict]) -> str:
    """The streaming client of a run: the one its levels used (aio-stream before any level ran)."""
    return str(rows[0].get("client", "aio-stream")) if rows else "aio-stream"


def settings_from(args: argparse.Namespace) -> Settings:
    from .inputs import parse_shape_arg

    if args.url and args.url_option and args.url != args.url_option:
        raise BenchError("give the URL once (positional or -u)", stage="args")
    url = args.url or args.url_option
    local = bool(args.local_server)
    if local and url:
        raise BenchError("--local-server measures a server it starts itself: give no URL", stage="args")
    if not local and url is None:
        url = "localhost"  # perf_analyzer's default: localhost:8000 for HTTP, localhost:8001 for gRPC
    target = Target.parse(url, args.protocol) if url else None
    protocol = target.protocol if target else (args.protocol or "grpc")
    https = target is not None and target.tls is not None
    tls = tls_from_args(args, protocol, https, local)
    if target is not None:
        target = dataclasses.replace(target, tls=tls)
    if tls is not None and args.ceiling:
        raise BenchError("--ceiling measures a local plaintext server: not with TLS", stage="args")
    models = [m for item in (args.models or []) for m in item.split(",") if m]
    if not models:
        if not local:
            raise BenchError("-m MODEL is required (as perf_analyzer's -m); or --local-server to measure a private "
                             "fastoip on the demo repository", stage="args")
        models = list(LOCAL_MODELS)
    if args.concurrency_range and args.request_rate_range:
        raise BenchError("--concurrency-range and --request-rate-range are exclusive", stage="args")
    if args.request_rate_range:
        mode, levels = "request_rate", parse_range(args.request_rate_range, float, "--request-rate-range")
    elif args.concurrency_range:
        mode, levels = "concurrency", parse_range(args.concurrency_range, int, "--concurrency-range")
    else:
        mode, levels = "concurrency", list(LOCAL_LEVELS if local else [1])
    if args.streaming and mode != "concurrency":
        raise BenchError("--streaming supports concurrency mode only", stage="args")
    if args.streaming and protocol != "grpc":
        raise BenchError("--streaming needs gRPC (-i grpc)", stage="args")
    if args.grpc_client == "native" and protocol == "grpc":
        from .nativeload import native_available

        if not native_available():
            raise BenchError("--grpc-client native: fastoip.bench._h2client is not built (no libnghttp2 headers "
                             "when fastoip was built); use auto, future or aio", stage="args")
        if mode != "concurrency" or tls is not None or args.grpc_compression_algorithm != "none":
            raise BenchError("--grpc-client native carries closed-loop load over plaintext without "
                             "compression only (not --request-rate-range, TLS or "
                             "--grpc-compression-algorithm); use auto, future or aio", stage="args")
    if args.percentile is not None and not 1 <= args.percentile <= 99:
        raise BenchError("--percentile must be in 1..99", stage="args")
    if args.processes < 1 or args.batch_size < 1 or args.string_length < 0:
        raise BenchError("--processes and -b must be >= 1, --string-length >= 0", stage="args")
    shapes = dict(parse_shape_arg(s) for s in args.shape)
    window_ms = args.window_ms if args.window_ms is not None else (1000 if local else 5000)
    warmup_ms = args.warmup_ms if args.warmup_ms is not None else (500 if local else 1000)
    max_trials = args.max_trials if args.max_trials is not None else (5 if local else 10)
    if window_ms < 10 or max_trials < 1 or warmup_ms < 0:
        raise BenchError("-p must be >= 10 ms, --max-trials >= 1, --warmup-ms >= 0", stage="args")
    if args.measurement_request_count < 1 or args.request_count < 0 or args.warmup_request_count < 0:
        raise BenchError(
            "--measurement-request-count must be >= 1, --request-count and --warmup-request-count >= 0", stage="args"
        )
    if args.metrics_url and not args.collect_metrics:
        raise BenchError("--metrics-url needs --collect-metrics", stage="args")
    if args.metrics_interval < 10:
        raise BenchError("--metrics-interval must be >= 10 ms", stage="args")
    sources = [flag for flag, given in (("--input-data", args.input_data not in ("zero", "random")),
                                        ("--string-data", args.string_data is not None),
                                        ("--data-directory", args.data_directory is not None)) if given]
    if len(sources) > 1:
        raise BenchError(f"{' and '.join(sources)} are exclusive: give the inputs one way", stage="args")
    if args.csv and not args.fastoip_csv and len(models) > 1:
        raise BenchError("-f writes perf_analyzer's layout, which has no model column: give one -m, "
                         "or add --fastoip-csv", stage="args")
    settings = Settings(
        target,
        models,
        args.model_version,
        protocol,
        args.batch_size,
        mode,
        levels,
        shapes,
        args,
        window_ms,
        warmup_ms,
        max_trials,
        local,
    )
    settings.request_parameters = dict(parse_request_parameter(p) for p in args.request_parameter)
    settings.headers = [parse_header(h) for h in args.headers]
    return settings


# --------------------------------------------------------------------------- the run
class Run:
    """One invocation: set up, measure every model x level (x ceiling), report."""

    def __init__(self, settings: Settings) -> None:
        from .measure import MeasureOptions

        self.s = settings
        self.args = settings.args
        self.options = MeasureOptions(
            window_ms=settings.window_ms,
            warmup_ms=settings.warmup_ms,
            max_trials=settings.max_trials,
            stability_pct=self.args.stability,
            percentile=self.args.percentile,
            measurement_mode=self.args.measurement_mode,
            measurement_request_count=self.args.measurement_request_count,
            request_count=self.args.request_count,
            warmup_request_count=self.args.warmup_request_count,
        )
        self.rows: list[dict] = []
        self.server_info: dict | None = None
        self.local_info: dict | None = None
        self.error: BenchError | None = None
        self.local: Any = None
        self.client_cpus: set[int] | None = None
        self.server_cpus: set[int] | None = None
        self.target: Target | None = settings.target
        self.metrics: Any = None  # --collect-metrics: a perf_analyzer.MetricsCollector
        #: --profile-export-file: one entry per measured level; wall clock = now_ns() + this offset.
        self.experiments: list[dict] = []
        self.wall_offset_ns = time.time_ns() - time.perf_counter_ns()

    def note(self, message: str) -> None:
        if not self.args.quiet:
            print(f"fastoip bench: {message}", file=sys.stderr, flush=True)

    # -- lifecycle ---------------------------------------------------------------------
    def execute(self) -> int:
        from .progress import Progress

        try:
            if self.s.local:
                self._start_local()
            with Progress(not self.args.quiet) as progress:
                self._measure_all(progress)
        except BenchError as exc:
            self.error = exc
        finally:
            self._stop_local()
        return self._finish()

    def _start_local(self) -> None:
        from .local import cpu_split, fastoip_server, pin_current_process

        if not self.args.no_pin:
            self.server_cpus, self.client_cpus = cpu_split()
        self.local = fastoip_server(self.s.protocol, self.server_cpus)
        self.note("starting a local fastoip on the demo repository ...")
        self.local.start()
        port = self.local.ports[self.s.protocol]
        self.target = Target(self.s.protocol, "127.0.0.1", port)
        if self.client_cpus:
            pin_current_process(self.client_cpus)
        self.local_info = {
            "pid": self.local.pid,
            "cpus": sorted(self.server_cpus) if self.server_cpus else None,
            "client_cpus": sorted(self.client_cpus) if self.client_cpus else None,
        }
        pinning = (
            f"server on CPU {sorted(self.server_cpus)}, client on CPUs {sorted(self.client_cpus)}"
            if self.server_cpus and self.client_cpus
            else "not pinned"
        )
        self.note(f"local fastoip pid {self.local.pid} on {self.target.url} ({pinning})")

    def _stop_local(self) -> None:
        if self.local is not None:
            code = self.local.stop()
            self.note(f"local fastoip pid {self.local.pid} stopped (exit code {code})")

    # -- measuring -----------------------------------------------------------------------
    def _measure_all(self, progress: Any) -> None:
        from .control import connect

        assert self.target is not None
        control = connect(self.target, timeout=10.0)
        try:
            control.wait_ready(60.0 if self.s.local else 5.0)
            self.server_info = control.server_metadata()
            extensions = set(self.server_info.get("extensions", []))
            self._check_transport_flags(extensions)
            self.metrics = self._metrics_collector()
            for model in self.s.models:
                self._measure_model(control, model, "statistics" in extensions, progress)
        finally:
            control.close()

    def _check_transport_flags(self, extensions: set[str]) -> None:
        memory = self.args.shared_memory
        if memory != "none":
            wanted = f"{memory}_shared_memory"
            if wanted not in extensions:
                raise BenchError(
                    f"--shared-memory {memory}: the server does not list the '{wanted}' extension "
                    f"(it lists: {', '.join(sorted(extensions)) or 'none'})",
                    stage="server",
                    status="UNIMPLEMENTED",
                )

    def _measure_model(self, control: Any, model: str, has_stats: bool, progress: Any) -> None:
        from .inputs import encode_grpc, encode_http, make_requests, plan_model
        from .probe import probe
        from .verify import ResponseCheck

        assert self.target is not None
        version = self.s.version
        try:
            metadata = control.model_metadata(model, version)
        except BenchError as exc:
            if exc.status in ("NOT_FOUND", "404"):
                raise BenchError(
                    f"model '{model}' not found on {self.target.url}: {exc}", stage="metadata", status=exc.status
                ) from None
            raise
        config = control.model_config(model, version)
        plan = plan_model(metadata, config, self.s.batch_size, self.s.shapes, version)
        if config is None:
            self.note(
                f"model '{model}': no ModelConfig from the server; batch rule from the metadata "
                f"({'leading dim is the batch' if plan.batched else 'no batch dim'})"
            )
        tensors = make_requests(
            plan, self.args.input_data, self.args.string_length, self.args.string_data, self.args.data_directory
        )
        regions = None
        if self.args.shared_memory != "none":
            from .shm import SharedRegions

            regions = SharedRegions(control, plan, tensors, self.args.shared_memory)
        try:
            placements = regions.placements if regions is not None else [None] * len(tensors)
            if self.target.protocol == "grpc":
                requests = [
                    encode_grpc(plan, t, p, self.s.request_parameters) for t, p in zip(tensors, placements, strict=True)
                ]
            else:
                requests = [
                    encode_http(
                        plan, t, self.target.address, self.args.http_binary, p, self.s.request_parameters,
                        self.s.headers,
                    )
                    for t, p in zip(tensors, placements, strict=True)
                ]
            found = probe(
                self.target,
                plan,
                requests,
                tensors,
                verify=self.args.verify,
                streaming=self.args.streaming,
                timeout=self.args.request_timeout,
                regions=regions,
            )
            for message in found.notes:
                self.note(message)
            kind = "grpc-stream" if self.args.streaming else self.target.protocol
            elsewhere = frozenset(regions.shm_outputs) if regions is not None else frozenset()
            check = ResponseCheck(kind, found.lengths, plan.outputs, elsewhere=elsewhere)
            stats = (lambda: control.model_statistics(model, version)) if has_stats else None
            server_cpu = self.local.cpu_seconds if self.local is not None else None
            self._sweep(model, "server", self.target, requests, check, stats, server_cpu, progress)
            if self.args.ceiling:
                self._ceiling(model, requests, found, check, progress)
        finally:
            if regions is not None:
                regions.close()

    def _ceiling(self, model: str, requests: list[bytes], found: Any, check: Any, progress: Any) -> None:
        import os

        from .ceiling import ceiling_argv, write_response_file
        from .local import ChildServer
        from .verify import ResponseCheck

        assert self.target is not None
        protocol = self.target.protocol
        response_file = write_response_file(found.response)
        server = ChildServer(ceiling_argv(protocol, response_file), self.server_cpus, want=(protocol,))
        try:
            server.start(timeout=60)
            target = Target(protocol, "127.0.0.1", server.ports[protocol])
            self.note(f"ceiling server pid {server.pid} on {target.url}")
            kind = "grpc-stream" if self.args.streaming else protocol
            if protocol == "http":
                body_length = len(found.response) - found.response.find(b"\r\n\r\n") - 4
                ceiling_check = ResponseCheck(kind, {body_length}, check.expected, elsewhere=check.elsewhere)
            elif self.args.streaming:
                ceiling_check = ResponseCheck(kind, set(), check.expected, elsewhere=check.elsewhere)
            else:
                ceiling_check = ResponseCheck(kind, {len(found.response)}, check.expected, elsewhere=check.elsewhere)
            self._sweep(model, "ceiling", target, [requests[0]], ceiling_check, None, server.cpu_seconds, progress)
        finally:
            server.stop()
            os.unlink(response_file)

    def _spec(self, target: Target, requests: list[bytes], check: Any) -> Any:
        from .load import LoadSpec

        args = self.args
        return LoadSpec(
            protocol=target.protocol,
            host=target.host,
            port=target.port,
            requests=requests,
            check=check,
            client=args.grpc_client,
            streaming=args.streaming,
            channels=args.grpc_channels,
            timeout_s=args.request_timeout,
            max_outstanding=args.max_outstanding,
            distribution=args.request_distribution,
            metadata=tuple((name.lower(), value) for name, value in self.s.headers),
            compression=args.grpc_compression_algorithm,
            tls=target.tls,
        )

    def _sweep(
        self,
        model: str,
        role: str,
        target: Target,
        requests: list[bytes],
        check: Any,
        stats: Callable | None,
        server_cpu: Callable | None,
        progress: Any,
    ) -> None:
        from .generators import make_generator, resolve_client
        from .measure import measure_level
        from .procs import ProcessLoad

        spec = self._spec(target, requests, check)
        metrics = self.metrics if role == "server" else None
        shared = ProcessLoad(spec, self.args.processes, self.client_cpus) if self.args.processes > 1 else None
        try:
            for index, level in enumerate(self.s.levels, 1):
                generator = shared or make_generator(spec, self.s.mode, level)
                label = f"level {index} of {len(self.s.levels)}: {model} [{role}] " + (
                    f"c={level}" if self.s.mode == "concurrency" else f"r={level:g}/s")
                if metrics is not None:
                    metrics.start()
                try:
                    result = measure_level(
                        generator,
                        self.s.mode,
                        level,
                        self.s.batch_size,
                        self.options,
                        stats,
                        server_cpu,
                        partial(progress.level, label, percentile=self.args.percentile),
                    )
                finally:
                    if shared is None:
                        generator.close()
                    summary = metrics.stop() if metrics is not None else None
                row = {
                    "model": model,
                    "target": role,
                    "client": resolve_client(spec, self.s.mode, level),
                    **result.to_dict(),
                }
                if summary is not None:
                    row["metrics"] = summary
                self.rows.append(row)
                if self.args.profile_export_file and role == "server":
                    from .perf_analyzer import experiment

                    self.experiments.append(experiment(self.s.mode, level, result.reported, self.wall_offset_ns))
        finally:
            if shared is not None:
                shared.close()

    def _metrics_collector(self) -> Any:
        """--collect-metrics: a scraper of the server's /metrics (checked once before measuring)."""
        if not self.args.collect_metrics:
            return None
        from .perf_analyzer import MetricsCollector

        url = self.args.metrics_url
        if url is None:
            local_port = self.local.ports.get("metrics") if self.local is not None else None
            url = f"127.0.0.1:{local_port}/metrics" if local_port else "localhost:8002/metrics"
        collector = MetricsCollector(url, self.args.metrics_interval)
        collector.check()
        return collector

    # -- reporting -----------------------------------------------------------------------
    def document(self) -> dict:
        from .. import __version__
        from .load import auto_channels
        from .report import SCHEMA_VERSION, TOOL

        target = self.target or Target(self.s.protocol, "127.0.0.1", 0)
        return {
            "tool": TOOL,
            "schema": SCHEMA_VERSION,
            "version": __version__,
            "url": target.url,
            "protocol": target.protocol,
            "model": self.s.models[0] if len(self.s.models) == 1 else None,
            "models": list(self.s.models),
            "batch_size": self.s.batch_size,
            "server": self.server_info,
            "local_server": self.local_info,
            "client": {
                "kind": "http"
                if target.protocol == "http"
                # --streaming: the stream client that carried it (native-stream or aio-stream)
                else (stream_kind(self.rows) if self.args.streaming else self.args.grpc_client),
                "processes": self.args.processes,
                "channels": self.args.grpc_channels
                or f"auto (min(C, {auto_channels(10**6)}); native: 1 per 100 calls or streams, 1 per unary call up "
                "to 16 for requests of 64 KiB or more)",
            },
            "settings": {
                "window_ms": self.s.window_ms,
                "warmup_ms": self.s.warmup_ms,
                "max_trials": self.s.max_trials,
                "stability_pct": self.args.stability,
                "percentile": self.args.percentile,
            },
            "error": self.error.as_dict() if self.error else None,
            "results": self.rows,
        }

    def _finish(self) -> int:
        from .report import render_table, write_csv, write_json

        document = self.document()
        if self.args.json:
            write_json(document, self.args.json)
        if self.args.profile_export_file:
            import json

            from .. import __version__
            from .perf_analyzer import profile_document

            with open(self.args.profile_export_file, "w") as handle:
                json.dump(profile_document(self.experiments, f"fastoip bench {__version__}"), handle)
        if self.args.csv and self.args.fastoip_csv:
            write_csv(self.rows, self.args.csv)
        elif self.args.csv:
            from .perf_analyzer import write_csv as write_perf_analyzer_csv

            rows = [row for row in self.rows if row["target"] == "server"]
            write_perf_analyzer_csv(rows, self.args.csv, self.args.verbose_csv, self.args.percentile,
                                    self.args.collect_metrics)
        if self.rows:
            render_table(document, wide=self.args.wide)
        if self.error is not None:
            print(f"fastoip bench: error: {self.error}", file=sys.stderr, flush=True)
            return 1
        if any(row["errors"] for row in self.rows):
            return 3
        return 0


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """Entry point of ``fastoip bench`` (argv without the word ``bench``)."""
    argv = list(argv)
    if argv and argv[0] == "compare":
        from .report import compare

        if len(argv) != 3 or any(a.startswith("-") for a in argv[1:]):
            print("usage: fastoip bench compare A.json B.json", file=sys.stderr)
            return 2
        return compare(argv[1], argv[2])
    if argv and argv[0] == "openai":
        from .openai import main as openai_main

        return openai_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
    except BenchError as exc:
        parser.error(str(exc))
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        pass
    run = Run(settings)
    try:
        return run.execute()
    except KeyboardInterrupt:
        print("fastoip bench: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        time.sleep(0)

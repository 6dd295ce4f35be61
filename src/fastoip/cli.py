"""``fastoip serve | mlserver start | health | demo-repository``: the command line."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, serve_help, triton_flags

if TYPE_CHECKING:
    from .server.app import ServeOptions
    from .server.grpc.native_options import NativeGrpcOptions
    from .server.http.protocol import HttpLimits
    from .server.http.server import HttpTls
    from .server.restricted import RestrictedFeatures

if TYPE_CHECKING:
    pass


def _env(name: str, default: str) -> str:
    return os.environ.get(f"FASTOIP_{name}", default)


def _default_body_bytes_in_flight() -> int:
    """A quarter of the machine's memory, at most 2 GiB: Triton's QA sends 1 GiB binary bodies, which then pass on
    a machine of 4 GiB or more, while large bodies together can never take most of the memory."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 2 * 1024**3
    return min(2 * 1024**3, physical // 4)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .shared_memory import REGION_LIMIT, REGION_LIMIT_CEILING, REGION_LIMIT_PER_CLIENT

    p = sub.add_parser("serve", help="serve a model repository over gRPC (and HTTP)",
                       usage="fastoip serve [--model-repository DIR] [options]",
                       formatter_class=serve_help.DefaultsFormatter)
    p.add_argument("--model-repository", "--model-store", type=str, action="append",
                   default=None, metavar="DIR",
                   help="the models: DIR/<model>/<version>/model.onnx (or model.py), optional DIR/<model>/config.pbtxt "
                        "(default: $FASTOIP_MODEL_REPOSITORY, else the built-in demo repository), or object storage: "
                        "s3://bucket/path, s3://[https://]host:port/bucket/path, gs://bucket/path, "
                        "as://account/container/path; --model-store is Triton's older name, --model-repository "
                        "preferred")
    p.add_argument("--host", default=_env("HOST", "127.0.0.1"),
                   help="bind address of gRPC, and of HTTP and metrics unless --http-address / --metrics-address "
                        "say otherwise (default 127.0.0.1; 0.0.0.0 for all interfaces)")
    p.add_argument("--grpc-port", type=int, default=int(_env("GRPC_PORT", "8001")), help="0 picks a free port")
    p.add_argument("--grpc-workers", type=int, default=int(_env("GRPC_WORKERS", "16")),
                   help="gRPC handler threads: bounds calls in progress (an open stream holds one); "
                        "16 measured best on 2 cores for small and batched models alike")
    _native_grpc_flags(p)
    p.add_argument("--http-host", default=os.environ.get("FASTOIP_HTTP_HOST"),
                   help="HTTP bind address (default: --host)")
    p.add_argument("--http-port", type=int, default=int(_env("HTTP_PORT", "8000")),
                   help="0 picks a free port, -1 turns HTTP off")
    p.add_argument("--openai-port", type=int, default=int(_env("OPENAI_PORT", "-1")),
                   help="OpenAI's API (/v1/models, /v1/embeddings, /v1/completions, /v1/chat/completions) alone on "
                        "this port, as Triton's OpenAI frontend; it is on the HTTP port too, under /v1 and "
                        "/openai/v1 (default -1: no port of its own; 0 picks a free port)")
    p.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                   metavar=("<apis>", "<key>", "<value>"),
                   help="Triton's OpenAI frontend's restriction of the --openai-port: these comma-separated groups "
                        "(inference, model-repository, metrics, health) answer 401 unless the request has header "
                        "<key> with <value> (repeatable; default: --http-restricted-api's)")
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8002")),
                   help="Prometheus /metrics with Triton's nv_inference_* names (on the HTTP bind address); "
                        "0 picks a free port, -1 turns it off")
    p.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                   help="Triton's response cache: 'local,size=N' keeps up to N bytes of responses for models whose "
                        "config says response_cache { enable: true }")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="Triton's metrics settings (repeatable): summary_latencies=true, histogram_latencies=true, "
                        "counter_latencies=false, summary_quantiles=0.5:0.05,0.99:0.001")
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024,
                   help="largest HTTP request body in bytes (default 64 MB, like Triton); with the binary "
                        "extension (Inference-Header-Content-Length) the JSON part's, as Triton")
    p.add_argument("--http-max-binary-input-size", type=int, default=2**31 - 1, metavar="BYTES",
                   help="largest binary tensor data after an HTTP infer request's JSON part (default 2 GiB, "
                        "gRPC's message limit; Triton has no bound)")
    p.add_argument("--http-max-body-bytes-in-flight", type=int, default=_default_body_bytes_in_flight(),
                   metavar="BYTES",
                   help="bytes all HTTP bodies larger than --http-max-input-size may hold at once, server-wide; "
                        "past it such a body is answered 503 with Retry-After (default: a quarter of the "
                        "machine's memory, at most 2 GiB)")
    p.add_argument("--http-thread-count", type=int, default=2, metavar="N",
                   help="processes that decode JSON inference requests of 2 MiB and more, off the HTTP event loop "
                        "(Triton's flag: its HTTP threads; fastoip's HTTP is one event loop; default 2; "
                        "0: on the loop)")
    _http_connection_flags(p)
    p.add_argument("--grpc-max-message-size", type=int, default=2**31 - 1, help="bytes, both directions")
    p.add_argument("--python-shm-pool", type=int, default=int(_env("PYTHON_SHM_POOL", str(16 * 1024 * 1024))),
                   metavar="BYTES",
                   help="the most shared memory each Python model's worker keeps in reusable tensor segments, each "
                        "way (the server's to it, its own to the server); idle ones go after a second, larger "
                        "tensors take one-shot segments (default 16 MiB; 0: no pool)")
    p.add_argument("--python-shm-pool-total", type=int,
                   default=int(_env("PYTHON_SHM_POOL_TOTAL", str(256 * 1024 * 1024))), metavar="BYTES",
                   help="the most shared memory the tensor segments of all Python models' workers take together "
                        "(memfd objects the server makes: none in /dev/shm); a tensor that would pass it, once "
                        "free segments are given back, fails its request with RESOURCE_EXHAUSTED and the server "
                        "goes on (default 256 MiB; fastoip only)")
    p.add_argument("--shared-memory-max-regions", type=int,
                   default=int(_env("SHARED_MEMORY_MAX_REGIONS", str(REGION_LIMIT))), metavar="N",
                   help=f"system and CUDA shared-memory regions registered at once, all clients together; past it "
                        f"a registration is refused with RESOURCE_EXHAUSTED (HTTP 429) (default {REGION_LIMIT}, "
                        f"at most {REGION_LIMIT_CEILING}: the SIGBUS guard's table; fastoip only)")
    p.add_argument("--shared-memory-max-regions-per-client", type=int,
                   default=int(_env("SHARED_MEMORY_MAX_REGIONS_PER_CLIENT", str(REGION_LIMIT_PER_CLIENT))),
                   metavar="N",
                   help=f"the same for one client (its address), so one client cannot take every slot "
                        f"(default {REGION_LIMIT_PER_CLIENT}; fastoip only)")
    p.add_argument("--mlserver-grpc-stream", action="store_true",
                   help="ModelStreamInfer answers models from model-settings.json as MLServer does (bare "
                        "ModelInferResponse messages, MLServer's dataplane.proto; an error ends the stream), so "
                        "MLServer's gRPC stub can read them; Triton's stream clients then fail on those models "
                        "(other models keep Triton's messages); `fastoip mlserver start` turns it on")
    p.add_argument("--max-inflated-request-bytes", type=int, default=128 * 1024 * 1024, metavar="BYTES",
                   help="decompressed bytes all compressed requests being inflated may hold at once (gRPC and HTTP "
                        "together); past it the request holding the most is refused: RESOURCE_EXHAUSTED, HTTP 503 "
                        "with Retry-After (413 when it alone passes it) (default 128 MiB; fastoip only)")
    p.add_argument("--strict-readiness", type=triton_flags.parse_bool, default=True,
                   help="server ready only when every model is ready (default true)")
    p.add_argument("--model-control-mode", choices=("none", "poll", "explicit"),
                   default=_env("MODEL_CONTROL_MODE", "none"),
                   help="Triton's meaning: none loads everything once; poll reloads changed models; "
                        "explicit loads only --load-model and what the repository API asks for")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="with explicit mode: a model to load at start-up (repeatable; '*' for all)")
    p.add_argument("--model-control-allow-code", action="store_true",
                   default=_env("MODEL_CONTROL_ALLOW_CODE", "0") in ("1", "true", "yes"),
                   help="SECURITY: let the load API load Python code a client uploads (.py files, Python models "
                        "made of uploaded files), i.e. let any API client run code inside the server (default off: "
                        "such loads are refused; the repository's own Python models load by name, as in Triton)")
    p.add_argument("--onnx-max-tensor-bytes", type=int, default=int(_env("ONNX_MAX_TENSOR_BYTES", str(64 << 20))),
                   metavar="BYTES",
                   help="most bytes one tensor of a bounded ONNX graph may take: a graph computing a larger one "
                        "(sized at load by onnx's shape inference) is refused, and a request whose output is "
                        "larger fails with RESOURCE_EXHAUSTED (default 64 MiB; fastoip only: Triton loads any graph)")
    p.add_argument("--onnx-max-tensor-bytes-for", choices=("uploaded", "all", "none"),
                   default=_env("ONNX_MAX_TENSOR_BYTES_FOR", "uploaded"),
                   help="which ONNX models --onnx-max-tensor-bytes bounds: 'uploaded' (graphs a load request "
                        "brought as files; default), 'all' (the repository's too), 'none'")
    p.add_argument("--max-bytes-elements", type=int, default=int(_env("MAX_BYTES_ELEMENTS", str(1 << 24))),
                   help="most BYTES elements one request may carry, all its BYTES inputs together, refused before "
                        "any is decoded; default 16777216")
    p.add_argument("--max-bytes-memory", type=int, default=int(_env("MAX_BYTES_MEMORY", str(256 << 20))),
                   metavar="BYTES",
                   help="most memory the decoded elements of one BYTES tensor may take (each element becomes a "
                        "Python object), charged as they are built; default 268435456 (256 MiB)")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, help="poll mode: seconds between scans")
    p.add_argument("--shutdown-grace", type=float, default=float(_env("SHUTDOWN_GRACE", "5")),
                   help="seconds readiness is false while requests are still served, before the listeners close "
                        "(default 5: load balancers stop routing first; a second SIGTERM/SIGINT skips the rest)")
    p.add_argument("--exit-timeout", type=float, default=30.0, help="seconds in-flight requests get on shutdown")
    p.add_argument("--default-max-batch-size", type=int, default=None,
                   help="max_batch_size auto-complete gives batchable models without a config "
                        "(default 4, as Triton; also --backend-config=default-max-batch-size=N)")
    p.add_argument("--default-dynamic-batching", action="store_true",
                   default=_env("DEFAULT_DYNAMIC_BATCHING", "0") in ("1", "true", "yes"),
                   help="give batchable models whose config has no scheduling block a dynamic batcher")
    p.add_argument("--default-max-queue-delay-microseconds", type=int,
                   default=int(_env("DEFAULT_MAX_QUEUE_DELAY_MICROSECONDS", "0")),
                   help="max_queue_delay_microseconds of that default batcher")
    p.add_argument("--ort-threads", type=int, default=int(_env("ORT_THREADS", "0")),
                   help="onnxruntime intra-op threads per model instance, for models whose config has no "
                        "intra_op_thread_count parameter (default 0: ONNX Runtime's default, one per "
                        "physical core, as Triton)")
    p.add_argument("--cpu-only", action="store_true", help="never use the CUDA execution provider")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))
    triton_flags.add_triton_flags(p)
    serve_help.arrange(p)


def _grpc_frontend_built() -> str:
    """Which gRPC frontend this build serves with, for ``--version`` (found without importing it)."""
    import importlib.util

    if importlib.util.find_spec("fastoip.server.grpc._http2") is not None:
        return "gRPC frontend: native, on libnghttp2"
    return ("gRPC frontend: grpcio; the faster native one was not built: install libnghttp2's headers "
            "(Debian: apt-get install libnghttp2-dev) and reinstall")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastoip", description="Open Inference Protocol server")
    parser.add_argument("--version", action="version", version=f"fastoip {__version__} ({_grpc_frontend_built()})")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("bench", help="throughput and latency of any V2 server (fastoip bench --help)")
    sub.add_parser(
        "mlserver",
        help="fastoip mlserver start FOLDER [serve flags]: serve an MLServer folder as `mlserver start FOLDER` "
             "does (its settings.json, MLSERVER_* variables, ports 8080 HTTP, 8081 gRPC, 8082 metrics)",
        usage="fastoip mlserver start FOLDER [fastoip serve flags, which win over the settings]",
    )
    demo = sub.add_parser("demo-repository", help="write the built-in demo repository to a folder")
    demo.add_argument("out", type=Path)
    demo.add_argument("--openai", action="store_true",
                      help="also write the OpenAI examples: tiny_embedder (/v1/embeddings) and tiny_chat "
                           "(/v1/chat/completions, /v1/completions)")
    health = sub.add_parser("health", help="wait until a server is ready; else say why not (a failed model and its "
                                           "error) and exit 1")
    health.add_argument("--url", default=f"127.0.0.1:{_env('HTTP_PORT', '8000')}",
                        help="the server's HTTP address (default 127.0.0.1:$FASTOIP_HTTP_PORT, else 8000)")
    health.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long for the server to answer and its models to load (default 0: "
                             "look once); a model that failed to load ends the wait at once")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse; a flag nobody takes is an error naming it (and why, for Triton flags fastoip cannot honour),
    with the nearest spelling fastoip takes (argparse suggests only from Python 3.12, and not for options)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = _option_strings(parser, args.command)
        problems = []
        for index, item in enumerate(unknown):
            before = unknown[index - 1] if index else ""
            if not item.startswith("-") and before.startswith("-") and "=" not in before:
                continue  # the value of the unknown flag before it
            hint = _nearest_flag(item, flags)
            problems.append(triton_flags.unknown_flags_message([item]) + (f" ({hint})" if hint else ""))
        parser.error("; ".join(problems))
    return args


def _option_strings(parser: argparse.ArgumentParser, command: str | None) -> list[str]:
    """Every --flag the command's parser takes."""
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            parser = action.choices[command]
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]


def _nearest_flag(item: str, flags: list[str]) -> str:
    """'did you mean ...' for an unknown flag, or what to write instead of a stray argument ('' for none)."""
    flag = item.split("=", 1)[0]
    if flag in triton_flags.UNSUPPORTED:
        return ""
    if not flag.startswith("-"):
        if Path(item).is_dir():
            return f"to serve the models in {item}: --model-repository {item}"
        return ""
    wanted = "--" + flag.lstrip("-").replace("_", "-").lower()
    if wanted in flags:
        return f"did you mean {wanted}?"
    close = difflib.get_close_matches(wanted, flags, n=2, cutoff=0.75)
    return f"did you mean {' or '.join(close)}?" if close else ""


def serve_options(argv: Sequence[str]) -> ServeOptions:
    """The ServeOptions ``fastoip serve <argv>`` means; SystemExit for a bad flag, FlagError for a bad value."""
    args = _parse(_parser(), ["serve", *argv])
    return _serve_options(args)


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    from .metrics import MetricsConfig
    from .options import RepositoryOptions
    from .response_cache import CacheSettings
    from .server.app import ServeOptions

    triton = triton_flags.resolve(args)
    if args.load_model and args.model_control_mode != "explicit":  # tritonserver's words for both
        raise triton_flags.FlagError("Error: Use of '--load-model' requires setting '--model-control-mode=explicit' "
                                     "as well.")
    if "*" in args.load_model and len(args.load_model) > 1:
        raise triton_flags.FlagError("Wildcard model name '*' must be the ONLY startup model if specified at all.")
    if triton.model_repository is not None:
        from .repository.layout import model_folder_given_as_repository

        mistake = model_folder_given_as_repository(triton.model_repository)
        if mistake:
            raise triton_flags.FlagError(mistake)
    try:
        metrics_config = MetricsConfig.parse(args.metrics_config)
        cache = CacheSettings.parse([*args.cache_config, *triton.cache_config])
    except ValueError as exc:
        raise triton_flags.FlagError(str(exc)) from None
    regions, regions_per_client = _region_limits(args)
    return ServeOptions(
        model_repository=triton.model_repository,
        more_repositories=triton.more_repositories,
        model_repository_url=triton.model_repository_url,
        host=triton.grpc_host or args.host,
        grpc_port=args.grpc_port,
        grpc_workers=args.grpc_workers,
        http_host=triton.http_host or args.http_host,
        http_port=args.http_port if triton.allow_http else -1,
        openai_port=args.openai_port,
        openai_restricted=_openai_restrictions(args.openai_restricted_api),
        metrics_port=args.metrics_port if triton.allow_metrics else -1,
        metrics_host=triton.metrics_host,
        metrics_config=metrics_config,
        cache_size_bytes=cache.size_bytes,
        grpc_frontend=args.grpc_frontend,
        grpc_native=_native_grpc_options(args, triton),
        grpc_enabled=triton.allow_grpc,
        http_max_body_size=args.http_max_input_size,
        http_max_binary_size=_positive(args.http_max_binary_input_size, "--http-max-binary-input-size"),
        http_body_bytes_in_flight=_positive(args.http_max_body_bytes_in_flight, "--http-max-body-bytes-in-flight"),
        http_json_workers=max(0, args.http_thread_count),
        http_limits=_http_limits(args),
        http_tls=_http_tls(args),
        http_restricted=triton.http_restricted,
        grpc_restricted=triton.grpc_restricted,
        mlserver_grpc_stream=args.mlserver_grpc_stream,
        max_message_size=args.grpc_max_message_size,
        strict_readiness=args.strict_readiness,
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        poll_interval=args.repository_poll_secs,
        shutdown_grace=args.shutdown_grace,
        exit_timeout=triton.exit_timeout if triton.exit_timeout is not None else args.exit_timeout,
        log_level=triton.log_level or args.log_level,
        log_format=triton.log_format,
        log_file=triton.log_file,
        log_switches=triton.log_switches,
        server_id=triton.server_id,
        trace_config=triton.trace,
        exit_on_error=bool(triton.exit_on_error),
        init_error=triton.init_error,
        pinned_pool_bytes=triton.pinned_pool_bytes,
        http_forward_pattern=triton.http_forward_pattern,
        no_effect_flags=triton.no_effect,
        shared_memory_max_regions=regions,
        shared_memory_max_regions_per_client=regions_per_client,
        repository=RepositoryOptions(
            default_max_batch_size=triton.default_max_batch_size,
            auto_complete=triton.auto_complete,
            intra_op_threads=args.ort_threads,
            default_batching=(
                {"max_queue_delay_microseconds": args.default_max_queue_delay_microseconds}
                if args.default_dynamic_batching
                else None
            ),
            use_gpu=not args.cpu_only,
            allow_code_loads=args.model_control_allow_code,
            load_threads=triton.model_load_threads,
            onnx_max_tensor_bytes=args.onnx_max_tensor_bytes,
            onnx_max_tensor_bytes_for=args.onnx_max_tensor_bytes_for,
        ),
    )


def _http_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP connections: limits, timeouts and TLS (fastoip's own; Triton has none)")
    g.add_argument("--http-max-header-size", type=int, default=64 * 1024, metavar="BYTES",
                   help="largest request line plus headers; larger is answered 431 and closed (default 65536)")
    g.add_argument("--http-max-header-count", type=int, default=100, metavar="N",
                   help="most header fields a request may have; more is answered 431 and closed (default 100)")
    g.add_argument("--http-keep-alive-timeout", type=float, default=75.0, metavar="SECONDS",
                   help="close a connection idle this long, a fresh one included (default 75)")
    g.add_argument("--http-header-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a request's headers must arrive within this from their first byte, else 408 and close "
                        "(slow-header attacks; default 30)")
    g.add_argument("--http-body-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a request body may pause this long between reads, else 408 and close (default 60)")
    g.add_argument("--http-body-min-rate", type=float, default=500.0, metavar="BYTES_PER_S",
                   help="after a 20 s grace a request body must keep arriving at this rate on average (each 500 "
                        "bytes buy a second, as Apache's mod_reqtimeout MinRate), else 408 and close (default "
                        "500; 0: no minimum)")
    g.add_argument("--http-body-min-rate-grace", type=float, default=20.0, metavar="SECONDS",
                   help="seconds from a body's first byte before --http-body-min-rate applies (default 20)")
    g.add_argument("--http-max-connections-per-peer", type=int, default=0, metavar="N",
                   help="at the connection cap, a client address holding more connections than this loses one "
                        "first (default 0: a quarter of the cap; fastoip only)")
    g.add_argument("--http-max-connections", type=int, default=0, metavar="N",
                   help="connections at once; one more closes the connection idle longest, or itself when all are "
                        "busy (default 0: a quarter of the open-file limit, at least 64)")
    g.add_argument("--http-ssl-certfile", default="", metavar="PEM",
                   help="serve HTTPS with this certificate chain (uvicorn's ssl_certfile)")
    g.add_argument("--http-ssl-keyfile", default="", metavar="PEM",
                   help="the certificate's private key (omit when the certfile holds it)")
    g.add_argument("--http-ssl-ca-certs", default="", metavar="PEM",
                   help="CA certificates that client certificates must chain to")
    g.add_argument("--http-ssl-require-client-cert", nargs="?", const=True, default=False,
                   type=triton_flags.parse_bool, metavar="BOOL",
                   help="mutual TLS: refuse clients without a certificate from --http-ssl-ca-certs")


def _region_limits(args: argparse.Namespace) -> tuple[int, int]:
    """``--shared-memory-max-regions`` and its per-client share, checked (FlagError)."""
    from .shared_memory import REGION_LIMIT_CEILING

    total, per_client = args.shared_memory_max_regions, args.shared_memory_max_regions_per_client
    if not 1 <= total <= REGION_LIMIT_CEILING:
        raise triton_flags.FlagError(f"--shared-memory-max-regions must be between 1 and {REGION_LIMIT_CEILING}")
    if not 1 <= per_client <= total:
        raise triton_flags.FlagError(
            "--shared-memory-max-regions-per-client must be between 1 and --shared-memory-max-regions"
        )
    return total, per_client


def _positive(value: int, flag: str) -> int:
    if value <= 0:
        raise triton_flags.FlagError(f"{flag} must be greater than 0")
    return value


def _http_limits(args: argparse.Namespace) -> HttpLimits:
    from .server.http.protocol import HttpLimits

    for flag in ("http_max_header_size", "http_max_header_count", "http_keep_alive_timeout",
                 "http_header_timeout", "http_body_timeout"):
        if getattr(args, flag) <= 0:
            raise triton_flags.FlagError(f"--{flag.replace('_', '-')} must be greater than 0")
    return HttpLimits(
        max_header_bytes=args.http_max_header_size,
        max_header_count=args.http_max_header_count,
        keep_alive_timeout=args.http_keep_alive_timeout,
        header_timeout=args.http_header_timeout,
        body_timeout=args.http_body_timeout,
        body_min_rate=max(args.http_body_min_rate, 0.0),
        body_rate_grace=max(args.http_body_min_rate_grace, 0.0),
        max_connections=max(args.http_max_connections, 0),
        max_connections_per_peer=max(args.http_max_connections_per_peer, 0),
    )


def _http_tls(args: argparse.Namespace) -> HttpTls | None:
    from .server.http.server import HttpTls

    if not args.http_ssl_certfile:
        if args.http_ssl_keyfile or args.http_ssl_ca_certs or args.http_ssl_require_client_cert:
            raise triton_flags.FlagError("HTTPS needs --http-ssl-certfile")
        return None
    if args.http_ssl_require_client_cert and not args.http_ssl_ca_certs:
        raise triton_flags.FlagError("--http-ssl-require-client-cert needs --http-ssl-ca-certs")
    return HttpTls(
        certfile=args.http_ssl_certfile,
        keyfile=args.http_ssl_keyfile,
        ca_certs=args.http_ssl_ca_certs,
        require_client_cert=args.http_ssl_require_client_cert,
    )


def _native_grpc_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpc-frontend", choices=("native", "grpcio"), default=os.environ.get("FASTOIP_GRPC_FRONTEND"),
                   help="native: libnghttp2 on the uvloop loop, no thread per call (default when it was built); "
                        "grpcio: the sync grpcio server (--grpc-workers threads)")
    p.add_argument("--grpc-max-concurrent-streams", type=int, default=1024,
                   help="native: HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS)")
    p.add_argument("--grpc-keepalive-time", type=int, default=7_200_000,
                   help="native: ms of silence before the server PINGs a connection "
                        "(default 7200000 as Triton; 0: never)")
    p.add_argument("--grpc-keepalive-timeout", type=int, default=20_000,
                   help="native: ms to wait for that PING's ACK before closing the connection")
    p.add_argument("--grpc-max-connection-age", type=int, default=0,
                   help="native: ms after which a connection gets GOAWAY so clients rebalance (0: never)")
    p.add_argument("--grpc-max-connection-age-grace", type=int, default=0,
                   help="native: ms a connection past its age keeps for its calls (0: until they end)")
    p.add_argument("--grpc-stream-idle-timeout", type=int, default=60_000,
                   help="native: ms a stream may go without request DATA while its request is open (a unary "
                        "call, or a stream message half received) before it is answered DEADLINE_EXCEEDED "
                        "(default 60000; 0: never; fastoip only)")
    p.add_argument("--grpc-max-connections", type=int, default=0,
                   help="native: connections at once; one more is closed when accepted (default 0: half the "
                        "open-file limit; fastoip only)")
    p.add_argument("--grpc-max-connection-quiet", type=int, default=10_000,
                   help="native: at the connection cap, ms after which a connection whose calls all wait on their "
                        "client (a stream with no request in flight) and that moved no message counts as idle and "
                        "may be closed for a new one (default 10000; fastoip only)")
    p.add_argument("--grpc-max-connections-per-peer", type=int, default=0,
                   help="native: at the connection cap, a client address holding more connections than this "
                        "loses one first (default 0: a quarter of the cap; fastoip only)")
    p.add_argument("--grpc-max-connection-idle", type=int, default=300_000,
                   help="native: ms a connection may go without any call before a graceful GOAWAY (default "
                        "300000; 0: never; grpc's max connection idle, fastoip only)")
    p.add_argument("--grpc-handshake-timeout", type=int, default=10_000,
                   help="native: ms for a new connection's HTTP/2 preface and SETTINGS before it is closed "
                        "(default 10000; 0: never; fastoip only)")
    p.add_argument("--grpc-max-stream-request-bytes", type=int, default=256 * 1024 * 1024,
                   help="native: ModelStreamInfer request bytes one stream may have received and not yet had "
                        "answered; a message past it ends the stream with RESOURCE_EXHAUSTED (default 256 MiB; one "
                        "message is always accepted; fastoip only)")
    p.add_argument("--grpc-max-queued-request-bytes", type=int, default=1024 * 1024 * 1024,
                   help="native: the same, all streams together (default 1 GiB; fastoip only)")
    p.add_argument("--grpc-max-queued-response-bytes", type=int, default=1024 * 1024 * 1024,
                   help="native: response bytes that may wait for clients' flow-control windows, all connections "
                        "together; past it the stream that queues more is reset (RESOURCE_EXHAUSTED; default 1 GiB; "
                        "fastoip only)")
    p.add_argument("--grpc-use-ssl", nargs="?", const=True, default=False, type=triton_flags.parse_bool,
                   metavar="BOOL", help="native: TLS (ALPN h2); Triton's --grpc-use-ssl=true or the bare switch")
    p.add_argument("--grpc-use-ssl-mutual", nargs="?", const=True, default=False, type=triton_flags.parse_bool,
                   metavar="BOOL", help="native: TLS requiring client certificates (=true or the bare switch)")
    p.add_argument("--grpc-server-cert", default="", help="PEM certificate chain for --grpc-use-ssl")
    p.add_argument("--grpc-server-key", default="", help="PEM private key for --grpc-use-ssl")
    p.add_argument("--grpc-root-cert", default="", help="PEM CA certificates that client certificates must chain to")


def _native_grpc_options(args: argparse.Namespace, triton: triton_flags.TritonSettings) -> NativeGrpcOptions:
    from .server.grpc.native_options import NativeGrpcOptions

    return NativeGrpcOptions(
        max_message_size=args.grpc_max_message_size,
        max_concurrent_streams=args.grpc_max_concurrent_streams,
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        max_connection_age_ms=args.grpc_max_connection_age,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        stream_idle_timeout_ms=args.grpc_stream_idle_timeout,
        max_connections=args.grpc_max_connections,
        max_connection_idle_ms=args.grpc_max_connection_idle,
        max_connection_quiet_ms=max(args.grpc_max_connection_quiet, 0),
        max_connections_per_peer=max(args.grpc_max_connections_per_peer, 0),
        handshake_timeout_ms=args.grpc_handshake_timeout,
        max_queued_response_bytes=args.grpc_max_queued_response_bytes,
        max_stream_request_bytes=max(args.grpc_max_stream_request_bytes, 1),
        max_queued_request_bytes=max(args.grpc_max_queued_request_bytes, 1),
        use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        use_ssl_mutual=args.grpc_use_ssl_mutual,
        server_cert=args.grpc_server_cert,
        server_key=args.grpc_server_key,
        root_cert=args.grpc_root_cert,
        response_compression_level=triton.grpc_compression_level,
        max_pings_without_data=triton.grpc_max_pings_without_data,
        keepalive_without_calls=True if triton.grpc_permit_without_calls is None else triton.grpc_permit_without_calls,
        forward_header_pattern=triton.grpc_forward_pattern,
    )


def _openai_restrictions(options: list[list[str]]) -> RestrictedFeatures | None:
    from .server import restricted

    if not options:
        return None
    try:
        return restricted.parse_openai_restrictions(options)
    except restricted.RestrictionError as exc:
        raise triton_flags.FlagError(str(exc)) from None


def main(argv: Sequence[str] | None = None, *, mlserver_settings_read: bool = False) -> int:
    """``mlserver_settings_read``: called by ``fastoip mlserver start``, which read the folder's settings.json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] == "mlserver" and argv[1:2] != ["-h"] and argv[1:2] != ["--help"]:
        return _mlserver(argv[1:])
    args = _parse(_parser(), argv)
    if args.command == "serve":
        from . import _codec
        from .allocator import pin_mmap_threshold, pin_trim_threshold
        from .server import inflate
        from .server.app import serve

        try:
            options = _serve_options(args)
        except triton_flags.FlagError as exc:
            print(f"fastoip: {exc}", file=sys.stderr, flush=True)
            return 1
        if not options.grpc_enabled and options.http_port < 0 and options.openai_port < 0:
            print("fastoip: --allow-grpc=false and --allow-http=false leave nothing to serve", file=sys.stderr)
            return 1
        if not mlserver_settings_read:
            for root in (options.model_repository, *options.more_repositories):
                if root is not None and (root / "settings.json").is_file():  # said, not ignored in silence
                    print(f"fastoip: {root / 'settings.json'} (MLServer's server settings) is read by "
                          f"`fastoip mlserver start {root}`, not by `fastoip serve`", file=sys.stderr, flush=True)
        _codec.set_max_bytes_elements(args.max_bytes_elements)
        _codec.set_max_bytes_memory(args.max_bytes_memory)
        from .pyworker import segments

        segments.set_pool_limit(args.python_shm_pool)  # (and for the workers, through their environment)
        segments.set_total_limit(args.python_shm_pool_total)
        inflate.configure(args.max_inflated_request_bytes)  # issue 37: one server-wide budget
        pin_mmap_threshold()
        pin_trim_threshold()
        return serve(options)
    if args.command == "demo-repository":
        from .demo import write_repository

        root = write_repository(args.out)
        if args.openai:
            from .demo_openai import write_openai_examples

            write_openai_examples(root)
        print(root)
        return 0
    if args.command == "health":
        from .health_check import wait_ready

        state = wait_ready(args.url, max(0.0, args.wait))
        for line in state.lines:
            print(f"fastoip: {line}", file=sys.stdout if state.kind == "ready" else sys.stderr)
        return 0 if state.kind == "ready" else 1
    return 2


def _mlserver(argv: list[str]) -> int:
    """``fastoip mlserver start FOLDER [serve flags]``: ``fastoip serve`` with the flags MLServer's settings mean."""
    from . import mlserver_start

    if len(argv) < 2 or argv[0] != "start" or argv[1].startswith("-"):
        print("usage: fastoip mlserver start FOLDER [fastoip serve flags, which win over the settings]",
              file=sys.stderr)
        return 2
    folder = argv[1]
    if not Path(folder).is_dir():
        print(f"fastoip: mlserver start: '{folder}' is not a folder", file=sys.stderr)
        return 1
    try:
        settings = mlserver_start.mlserver_settings(folder)
    except mlserver_start.MLServerMissing as exc:
        print(f"fastoip: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # pydantic's ValidationError: a wrong value in settings.json or MLSERVER_*
        print(f"fastoip: mlserver start: MLServer's settings are not valid: {exc}", file=sys.stderr)
        return 1
    for line in mlserver_start.unused_settings(settings):
        print(f"fastoip: {line}", file=sys.stderr, flush=True)
    mlserver_start.extend_import_path(folder)
    return main(["serve", *mlserver_start.serve_arguments(settings), *argv[2:]], mlserver_settings_read=True)


if __name__ == "__main__":
    sys.exit(main())

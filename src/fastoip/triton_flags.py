"""Triton's ``tritonserver`` command-line flags, accepted by ``fastoip serve`` beside its own names.

Rules:
- Values parse as Triton parses them: booleans are true/on/1 and false/off/0 in
  any case; ``--flag=value`` and ``--flag value`` both work (argparse, like
  Triton's getopt_long).
- Every flag of ``tritonserver`` is accepted.  Where fastoip has the mechanism
  the flag is honoured (:data:`HONOURED`); where it has none, the flag is taken
  and the start log says, once per flag, that it has no effect here and why
  (:data:`NO_EFFECT`); never silently ignored.  A value asking for a feature
  fastoip does not have (``--rate-limit=execution_count``,
  ``--model-namespacing=true``) is refused by name (:data:`DEFAULT_ONLY`).
- ``--trace-config`` and the deprecated ``--trace-file``, ``--trace-level``,
  ``--trace-rate``, ``--trace-count``, ``--trace-log-frequency`` read as Triton
  reads them (:mod:`fastoip.tracing.config`).
- ``--backend-config`` takes Triton's ``[<backend>,]<setting>=<value>``; the one
  setting fastoip has is ``default-max-batch-size`` (Triton's default: 4).  The
  python backend's own settings (:data:`PYTHON_SETTINGS`: shared-memory sizes,
  stub timeout, ...) are validated as python_be.cc validates them and logged as
  having no effect: Triton's QA passes them to every Python-model server.
- A model repository that does not exist is a start-time error with Triton's
  words ("failed to stat file ..."), not a ready server with no models.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument
from .repository.remote import parse_location
from .server import restricted
from .server.restricted import RestrictedFeatures
from .tracing import TraceConfig, parse_trace_config
from .tracing.otel import require_sdk

log = logging.getLogger("fastoip.flags")

#: Triton's ``default-max-batch-size`` backend setting when none is given.
TRITON_DEFAULT_MAX_BATCH_SIZE = 4

#: Backends whose settings ``--backend-config`` may name (Triton's backend names).
BACKENDS = ("onnxruntime", "python")

#: Triton flags fastoip knows it cannot honour, and why (argparse names every other unknown flag).
UNSUPPORTED = {
    "--model-config-name": "only config.pbtxt is read",
}


class FlagError(ValueError):
    """A flag value fastoip refuses; the message names the flag."""


def parse_bool(value: str) -> bool:
    """A boolean flag value as Triton reads it."""
    lowered = value.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {value}")


def _int_pair(value: str) -> str:
    """Triton's ``<integer>:<integer>`` (device id and byte size)."""
    left, colon, right = value.partition(":")
    try:
        int(left), int(right)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <integer>:<integer>, got '{value}'") from None
    if not colon:
        raise argparse.ArgumentTypeError(f"expected <integer>:<integer>, got '{value}'")
    return value


#: Triton flags fastoip takes and logs as having no effect here: flag -> (value parser, why).
NO_EFFECT: dict[str, tuple[Callable[[str], object], str]] = {
    "--model-load-retry-count": (int, "a failed load is not retried"),
    "--model-load-gpu-limit": (str, "ONNX Runtime's CUDA EP manages device memory itself"),
    "--reuse-http-port": (parse_bool, "the HTTP listener does not set SO_REUSEPORT"),
    "--reuse-grpc-port": (parse_bool, "the gRPC listener does not set SO_REUSEPORT"),
    "--grpc-infer-thread-count": (int, "the native gRPC frontend runs on one event loop, with no thread pool"),
    "--grpc-infer-allocation-pool-size": (int, "the native gRPC frontend keeps no pool of call states to size"),
    "--grpc-max-response-pool-size": (int, "responses are written as they finish, with no pool to size"),
    "--grpc-http2-min-recv-ping-interval-without-data": (int, "client PINGs are acknowledged, never counted"),
    "--grpc-http2-max-ping-strikes": (int, "client PINGs are acknowledged, never counted"),
    "--cuda-memory-pool-byte-size": (_int_pair, "ONNX Runtime's CUDA EP allocates device memory itself"),
    "--cuda-virtual-address-size": (_int_pair, "ONNX Runtime's CUDA EP allocates device memory itself"),
    "--min-supported-compute-capability": (float, "the CUDA EP decides which GPUs it can use"),
    "--buffer-manager-thread-count": (int, "tensor copies run on the request's own thread"),
    "--host-policy": (str, "no NUMA or CPU-core placement of instances"),
    "--enable-peer-access": (parse_bool, "no CUDA peer access is set up"),
    "--allow-gpu-metrics": (parse_bool, "GPU metrics are not exported"),
    "--allow-cpu-metrics": (parse_bool, "CPU metrics are not exported"),
    "--metrics-interval-ms": (float, "metrics are computed when /metrics is read"),
    "--cache-directory": (str, "the response cache is built in (local)"),
    "--backend-directory": (str, "backends are built in (onnxruntime, python)"),
    "--repoagent-directory": (str, "repository agents are not implemented"),
    "--rate-limit-resource": (str, "the rate limiter is not implemented (--rate-limit is off)"),
    "--sagemaker-port": (int, "the SageMaker frontend is not implemented"),
    "--sagemaker-safe-port-range": (str, "the SageMaker frontend is not implemented"),
    "--sagemaker-thread-count": (int, "the SageMaker frontend is not implemented"),
    "--vertex-ai-port": (int, "the Vertex AI frontend is not implemented"),
    "--vertex-ai-thread-count": (int, "the Vertex AI frontend is not implemented"),
    "--vertex-ai-default-model": (str, "the Vertex AI frontend is not implemented"),
}

#: Triton flags whose value must ask for what fastoip does: flag -> (parser, the value fastoip has, why another
#: value is refused).  Triton's default is that value in every case.
DEFAULT_ONLY: dict[str, tuple[Callable[[str], object], object, str]] = {
    "--rate-limit": (str.lower, "off", "the rate limiter (execution_count) is not implemented"),
    "--model-namespacing": (parse_bool, False, "model namespacing is not implemented"),
    "--allow-sagemaker": (parse_bool, False, "the SageMaker frontend is not implemented"),
    "--allow-vertex-ai": (parse_bool, False, "the Vertex AI frontend is not implemented"),
    "--allow-client-shm": (parse_bool, True, "client shared memory cannot be turned off"),
}

#: Triton's --grpc-infer-response-compression-level values.
COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def add_triton_flags(parser: argparse.ArgumentParser) -> None:
    """Triton's flags (the ones fastoip honours) on the ``serve`` parser."""
    g = parser.add_argument_group("Triton-compatible flags")
    g.add_argument("--id", dest="server_id", default="fastoip",
                   help="server name in server metadata (default fastoip; 'triton' for clients that check)")
    g.add_argument("--exit-timeout-secs", type=int, default=None, help="Triton's name for --exit-timeout")
    for name in ("http", "grpc", "metrics"):
        g.add_argument(f"--allow-{name}", type=parse_bool, default=True, metavar="BOOL",
                       help=f"false turns the {name} endpoint off")
    g.add_argument("--grpc-address", default=None, help="gRPC bind address (Triton's name for --host)")
    g.add_argument("--http-address", default=None, help="HTTP bind address (Triton's name for --http-host)")
    g.add_argument("--metrics-address", default=None, help="metrics bind address (default: the HTTP address)")
    g.add_argument("--log-verbose", type=int, default=None, metavar="LEVEL",
                   help=">0 logs fastoip's debug (verbose) messages, whatever --log-info says")
    g.add_argument("--log-info", type=parse_bool, default=None, metavar="BOOL", help="false: no info messages")
    g.add_argument("--log-warning", type=parse_bool, default=None, metavar="BOOL",
                   help="false: no warning messages")
    g.add_argument("--log-error", type=parse_bool, default=None, metavar="BOOL", help="false: no error messages")
    g.add_argument("--log-format", choices=("default", "ISO8601"), default="default")
    g.add_argument("--log-file", default="", help="write the log to this file instead of stderr")
    g.add_argument("--strict-model-config", type=parse_bool, default=None, metavar="BOOL",
                   help="true: no auto-complete, every model needs a complete config.pbtxt")
    g.add_argument("--disable-auto-complete-config", action="store_true",
                   help="same as --strict-model-config=true")
    g.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]SETTING=VALUE",
                   help="Triton's backend settings; fastoip has default-max-batch-size")
    g.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="Triton's tracing (repeatable): level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, "
                        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
                        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_*=N")
    g.add_argument("--trace-file", default=None, help="deprecated by Triton: --trace-config triton,file=PATH")
    g.add_argument("--trace-level", action="append", default=[], help="deprecated by Triton: --trace-config level=")
    g.add_argument("--trace-rate", type=int, default=None, help="deprecated by Triton: --trace-config rate=N")
    g.add_argument("--trace-count", type=int, default=None, help="deprecated by Triton: --trace-config count=N")
    g.add_argument("--trace-log-frequency", type=int, default=None,
                   help="deprecated by Triton: --trace-config triton,log-frequency=N")
    groups = ", ".join(restricted.CATEGORIES)
    g.add_argument("--http-restricted-api", action="append", default=[], metavar="<apis>:<key>=<value>",
                   help="HTTP endpoints of these comma-separated groups answer 403 unless the request has header "
                        f"<key> with <value> (repeatable). Groups: {groups}")
    g.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="<protocols>:<key>=<value>",
                   help="gRPC methods of these groups answer UNAVAILABLE unless the call has metadata "
                        f"'triton-grpc-protocol-<key>' with <value> (repeatable). Groups: {groups}")
    _add_honoured_flags(parser)
    _add_accepted_flags(parser)


def _add_honoured_flags(parser: argparse.ArgumentParser) -> None:
    """Triton flags fastoip honours with its own mechanisms."""
    g = parser.add_argument_group("Triton flags honoured by fastoip's own mechanisms")
    g.add_argument("--exit-on-error", type=parse_bool, default=None, metavar="BOOL",
                   help="true: a model that fails to load at start-up stops the server (Triton's default is true); "
                        "without the flag fastoip serves the models that loaded")
    g.add_argument("--pinned-memory-pool-byte-size", type=int, default=None, metavar="BYTES",
                   help="most page-locked host memory batches for the CUDA EP may hold (default 256 MB as Triton); "
                        "past it batches use pageable memory")
    g.add_argument("--grpc-infer-response-compression-level", type=str.lower, default="none",
                   choices=COMPRESSION_LEVELS, metavar="none|low|medium|high",
                   help="native gRPC: compress ModelInfer / ModelStreamInfer responses with an algorithm the client "
                        "accepts, chosen for the level as gRPC core chooses it (default none)")
    g.add_argument("--grpc-http2-max-pings-without-data", type=int, default=2, metavar="N",
                   help="native gRPC: keepalive PINGs sent to a connection with nothing received in between "
                        "(0: no limit; default 2 as Triton)")
    g.add_argument("--grpc-keepalive-permit-without-calls", type=parse_bool, default=None, metavar="BOOL",
                   help="native gRPC: false sends keepalive PINGs only while calls are open "
                        "(without the flag fastoip also pings idle connections)")
    g.add_argument("--http-header-forward-pattern", default=None, metavar="REGEX",
                   help="HTTP headers whose name matches (case-insensitive) become inference request parameters")
    g.add_argument("--grpc-header-forward-pattern", default=None, metavar="REGEX",
                   help="native gRPC: metadata whose key matches (case-insensitive) become request parameters")
    g.add_argument("--model-load-thread-count", type=int, default=4, metavar="N",
                   help="models of one load operation (start-up, a poll) load on N threads, and a model's versions "
                        "side by side (default 4 as Triton)")
    g.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated by Triton: --cache-config local,size=BYTES")


def _dest(flag: str) -> str:
    return "triton_" + flag[2:].replace("-", "_")


def _add_accepted_flags(parser: argparse.ArgumentParser) -> None:
    """Triton flags fastoip takes without an effect (logged at start), and those that must ask for the default."""
    g = parser.add_argument_group("Triton flags accepted with no effect (the start log says so, once per flag)")
    for flag, (parse, why) in NO_EFFECT.items():
        g.add_argument(flag, dest=_dest(flag), type=parse, default=None, metavar="VALUE", help=why)
    for flag, (parse, wanted, why) in DEFAULT_ONLY.items():
        g.add_argument(flag, dest=_dest(flag), type=parse, default=None, metavar="VALUE",
                       help=f"accepted as {str(wanted).lower()} (Triton's default); other values: {why}")


def unknown_flags_message(unknown: list[str]) -> str:
    """The error for flags the parser did not take, with the reason where fastoip knows one."""
    reasons = []
    for item in unknown:
        flag = item.split("=", 1)[0]
        if flag in UNSUPPORTED:
            reasons.append(f"{flag} is not supported by fastoip: {UNSUPPORTED[flag]}")
        elif flag.startswith("-"):
            reasons.append(f"unrecognized flag {flag}")
        else:
            reasons.append(f"unexpected argument {item!r}")
    return "; ".join(reasons)


@dataclass(frozen=True)
class TritonSettings:
    """What the Triton flags (and fastoip's own equivalents) resolve to."""

    model_repository: Path | None
    #: Further --model-repository directories (Triton serves several).
    more_repositories: tuple[Path, ...]
    #: An object-storage repository (s3://, gs://, as://); model_repository is None then.
    model_repository_url: str | None
    server_id: str
    exit_timeout: float | None
    allow_http: bool
    allow_grpc: bool
    allow_metrics: bool
    grpc_host: str | None
    http_host: str | None
    metrics_host: str | None
    #: None: keep --log-level.
    log_level: str | None
    #: Triton's switches as given (log_info, log_warning, log_error, log_verbose_level); None: none was given.
    log_switches: dict[str, bool | int] | None
    log_format: str
    log_file: str
    auto_complete: bool
    default_max_batch_size: int
    trace: TraceConfig
    http_restricted: RestrictedFeatures
    grpc_restricted: RestrictedFeatures
    #: --exit-on-error (None: not given, fastoip serves the models that loaded).
    exit_on_error: bool | None = None
    #: Why the server failed to initialize ("" when it did not): a --model-repository that does not exist
    #: with --exit-on-error=false, which Triton survives (not live, not ready, server metadata answered).
    init_error: str = ""
    #: --pinned-memory-pool-byte-size (None: the default, 256 MB).
    pinned_pool_bytes: int | None = None
    grpc_compression_level: str = "none"
    grpc_max_pings_without_data: int = 2
    grpc_permit_without_calls: bool | None = None
    http_forward_pattern: str | None = None
    grpc_forward_pattern: str | None = None
    #: --model-load-thread-count (Triton's default 4).
    model_load_threads: int = 4
    #: --response-cache-byte-size, as Triton reads it: --cache-config local,size=N.
    cache_config: tuple[str, ...] = ()
    #: One line per Triton flag given that has no effect here (logged at start).
    no_effect: tuple[str, ...] = ()


def resolve(args: argparse.Namespace) -> TritonSettings:
    """Check and combine the parsed flags; FlagError names the flag that cannot be honoured."""
    missing: list[Path] = []
    # --exit-on-error=false: a missing repository leaves the server up but failed to initialize, as Triton's
    roots, url = _model_repository(args.model_repository, missing if args.exit_on_error is False else None)
    return TritonSettings(
        init_error=f"failed to stat file {missing[0]}" if missing else "",
        model_repository=roots[0] if roots else None,
        more_repositories=roots[1:],
        model_repository_url=url,
        server_id=args.server_id,
        exit_timeout=float(args.exit_timeout_secs) if args.exit_timeout_secs is not None else None,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        grpc_host=args.grpc_address,
        http_host=args.http_address,
        metrics_host=args.metrics_address,
        log_level=_log_level(args),
        log_switches=_log_switches(args),
        log_format=args.log_format,
        log_file=args.log_file,
        auto_complete=_auto_complete(args),
        default_max_batch_size=_default_max_batch_size(args),
        trace=_trace_config(args),
        http_restricted=_restrictions(restricted.parse_http_restrictions, args.http_restricted_api),
        grpc_restricted=_restrictions(restricted.parse_grpc_restrictions, args.grpc_restricted_protocol),
        exit_on_error=args.exit_on_error,
        pinned_pool_bytes=_non_negative("--pinned-memory-pool-byte-size", args.pinned_memory_pool_byte_size),
        grpc_compression_level=args.grpc_infer_response_compression_level,
        grpc_max_pings_without_data=_non_negative(
            "--grpc-http2-max-pings-without-data", args.grpc_http2_max_pings_without_data) or 0,
        grpc_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http_forward_pattern=_pattern("--http-header-forward-pattern", args.http_header_forward_pattern),
        grpc_forward_pattern=_pattern("--grpc-header-forward-pattern", args.grpc_header_forward_pattern),
        cache_config=_response_cache(args.response_cache_byte_size),
        model_load_threads=_at_least_one("--model-load-thread-count", args.model_load_thread_count),
        no_effect=_no_effect(args),
    )


def _auto_complete(args: argparse.Namespace) -> bool:
    """Config auto-complete on or off, with the warnings Triton prints on stderr for the deprecated flag."""
    strict: bool | None = args.strict_model_config
    if strict is not None:
        print("Warning: '--strict-model-config' has been deprecated! Please use "
              "'--disable-auto-complete-config' instead.", file=sys.stderr, flush=True)
    if args.disable_auto_complete_config:
        if strict is False:
            print("Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
                  "'--disable-auto-complete-config'!", file=sys.stderr, flush=True)
        return False
    return not strict


def _non_negative(flag: str, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise FlagError(f"{flag} must be >= 0, got {value}")
    return value


def _at_least_one(flag: str, value: int) -> int:
    if value < 1:
        raise FlagError(f"{flag} must be >= 1, got {value}")
    return value


def _pattern(flag: str, pattern: str | None) -> str | None:
    """A header forwarding pattern, checked now (Triton: RE2, case-insensitive; here Python's re)."""
    if pattern is None:
        return None
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise FlagError(f"{flag}: invalid regular expression '{pattern}': {exc}") from None
    return pattern


def _response_cache(size: int | None) -> tuple[str, ...]:
    if size is None:
        return ()
    log.warning("'--response-cache-byte-size' has been deprecated by Triton: it means "
                "'--cache-config=local,size=%d'", size)
    return (f"local,size={size}",)


def _no_effect(args: argparse.Namespace) -> tuple[str, ...]:
    """The log lines for Triton flags given that have no effect here; FlagError for a value asking for more."""
    lines = []
    for flag, (_, why) in NO_EFFECT.items():
        if getattr(args, _dest(flag)) is not None:
            lines.append(f"{flag} has no effect in fastoip: {why}")
    lines.extend(python_backend_settings(args))
    for flag, (_, wanted, why) in DEFAULT_ONLY.items():
        given = getattr(args, _dest(flag))
        if given is not None and given != wanted:
            raise FlagError(f"{flag}={str(given).lower()} is not supported by fastoip: {why}")
    return tuple(lines)


def _trace_config(args: argparse.Namespace) -> TraceConfig:
    try:
        config = parse_trace_config(
            args.trace_config,
            trace_file=args.trace_file,
            trace_levels=args.trace_level,
            trace_rate=args.trace_rate,
            trace_count=args.trace_count,
            trace_log_frequency=args.trace_log_frequency,
        )
        if config.mode == "opentelemetry":
            require_sdk()  # at start, not at the first traced request
    except (ValueError, RuntimeError) as exc:
        raise FlagError(str(exc)) from None
    return config



def _restrictions(parse: Callable[[list[str]], RestrictedFeatures], options: list[str]) -> RestrictedFeatures:
    try:
        return parse(options)
    except restricted.RestrictionError as exc:
        raise FlagError(str(exc)) from None


def _model_repository(
    given: list[str] | None, missing: list[Path] | None = None
) -> tuple[tuple[Path, ...], str | None]:
    """Every local --model-repository (Triton takes several; a model is found in the first that has it), or the
    one object-storage URL (s3://, gs://, as://).  ``missing``: a list that collects the local ones that do not
    exist (kept among the roots) instead of refusing them."""
    if not given:
        env = os.environ.get("FASTOIP_MODEL_REPOSITORY")
        given = [env] if env else []
    roots: list[Path] = []
    urls: list[str] = []
    for item in given:
        text = str(item)
        try:
            location = parse_location(text)
        except InvalidArgument as exc:
            raise FlagError(f"--model-repository: {exc.message}") from None
        if location is not None:
            urls.append(text)
            continue
        root = Path(text)
        if not root.exists():
            if missing is None:
                raise FlagError(f"failed to stat file {root} (--model-repository does not exist)")
            missing.append(root)
        elif not root.is_dir():
            raise FlagError(f"--model-repository {root} is not a directory")
        roots.append(root)
    if urls and (len(urls) > 1 or roots):
        raise FlagError(
            "--model-repository: an object-storage repository (s3://, gs://, as://) must be the only one"
        )
    return tuple(dict.fromkeys(roots)), (urls[0] if urls else None)


def _log_switches(args: argparse.Namespace) -> dict[str, bool | int] | None:
    """Triton's --log-info / --log-warning / --log-error / --log-verbose, each on its own (None: none given)."""
    if args.log_verbose is None and args.log_info is None and args.log_warning is None and args.log_error is None:
        return None
    return {
        "log_info": args.log_info is not False,
        "log_warning": args.log_warning is not False,
        "log_error": args.log_error is not False,
        "log_verbose_level": max(args.log_verbose or 0, 0),  # Triton's logger takes max(0, level)
    }


def _log_level(args: argparse.Namespace) -> str | None:
    """The Python log level Triton's log flags mean, or None when none was given."""
    if args.log_verbose is None and args.log_info is None and args.log_warning is None and args.log_error is None:
        return None
    if args.log_verbose is not None and args.log_verbose > 0:
        return "DEBUG"
    if args.log_info is not False:
        return "INFO"
    if args.log_warning is not False:
        return "WARNING"
    if args.log_error is not False:
        return "ERROR"
    return "CRITICAL"


def parse_backend_config(value: str) -> tuple[str, str, str]:
    """``[<backend>,]<setting>=<value>`` -> (backend or "", setting, value), as Triton splits it."""
    backend, comma, rest = value.partition(",")
    if not comma:
        backend, rest = "", value
    elif not backend:
        raise FlagError(
            f"--backend-config: no backend specified; the format is <backend name>,<setting>=<value> "
            f"or <setting>=<value>. Got {value}"
        )
    setting, equals, setting_value = rest.partition("=")
    if not equals or not setting or not setting_value:
        raise FlagError(f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {value}")
    return backend, setting, setting_value


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(value)
    return number


#: The python backend's settings (python_be.cc's TRITONBACKEND_Initialize) -> (value check, why no effect here).
#: fastoip's workers size their shared memory per request and are supervised by the server, not by a timeout.
PYTHON_SETTINGS: dict[str, tuple[Callable[[str], object], str]] = {
    "shm-default-byte-size": (int, "a worker's shared memory is sized per request, not preallocated"),
    "shm-growth-byte-size": (_positive_int, "a worker's shared memory is sized per request, not grown in steps"),
    "shm-region-prefix-name": (str, "the server names each shared-memory object itself, unguessably"),
    "shm_message_queue_size": (int, "a worker's channel is a ring sized by the server"),
    "stub-timeout-seconds": (_positive_int, "a worker's health is watched by its process, not by a timeout"),
    "thread-pool-size": (_positive_int, "async execute runs on the worker's own event loop"),
}


def python_backend_settings(args: argparse.Namespace) -> tuple[str, ...]:
    """The log lines for python backend settings given (accepted, no effect); FlagError for a bad value."""
    lines = []
    for entry in args.backend_config:
        backend, setting, value = parse_backend_config(entry)
        if backend not in ("", "python") or setting not in PYTHON_SETTINGS:
            continue
        check, why = PYTHON_SETTINGS[setting]
        try:
            check(value)
        except ValueError:
            raise FlagError(f"--backend-config {entry}: invalid value '{value}' for {setting}") from None
        lines.append(f"--backend-config {entry} has no effect in fastoip: {why}")
    return tuple(lines)


def _default_max_batch_size(args: argparse.Namespace) -> int:
    size: int | None = args.default_max_batch_size
    if size is None and os.environ.get("FASTOIP_DEFAULT_MAX_BATCH_SIZE"):
        size = int(os.environ["FASTOIP_DEFAULT_MAX_BATCH_SIZE"])
    for entry in args.backend_config:
        backend, setting, value = parse_backend_config(entry)
        if backend and backend not in BACKENDS:
            raise FlagError(f"--backend-config {entry}: backend '{backend}' is not one of {', '.join(BACKENDS)}")
        if backend in ("", "python") and setting in PYTHON_SETTINGS:
            continue  # python_backend_settings
        if setting != "default-max-batch-size":
            raise FlagError(
                f"--backend-config {entry}: setting '{setting}' is not supported by fastoip "
                f"(supported: default-max-batch-size; python: {', '.join(PYTHON_SETTINGS)})"
            )
        try:
            size = int(value)
        except ValueError:
            raise FlagError(f"--backend-config {entry}: default-max-batch-size must be an integer") from None
    if size is None:
        return TRITON_DEFAULT_MAX_BATCH_SIZE
    if size < 0:
        raise FlagError(f"default-max-batch-size must be >= 0, got {size}")
    return size

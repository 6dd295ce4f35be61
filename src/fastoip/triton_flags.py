"""Triton's ``tritonserver`` command-line flags, accepted by ``fastoip serve`` beside its own names.

Rules:
- Values parse as Triton parses them: booleans are true/on/1 and false/off/0 in
  any case; ``--flag=value`` and ``--flag value`` both work (argparse, like
  Triton's getopt_long).
- A Triton flag fastoip cannot honour is refused with a message naming it and
  why; nothing is accepted and then silently ignored.
- ``--trace-config`` and the deprecated ``--trace-file``, ``--trace-level``,
  ``--trace-rate``, ``--trace-count``, ``--trace-log-frequency`` read as Triton
  reads them (:mod:`fastoip.tracing.config`).
- ``--backend-config`` takes Triton's ``[<backend>,]<setting>=<value>``; the one
  setting fastoip has is ``default-max-batch-size`` (Triton's default: 4).
- A model repository that does not exist is a start-time error with Triton's
  words ("failed to stat file ..."), not a ready server with no models.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument
from .repository.remote import parse_location
from .server import restricted
from .server.restricted import RestrictedFeatures
from .tracing import TraceConfig, parse_trace_config
from .tracing.otel import require_sdk

#: Triton's ``default-max-batch-size`` backend setting when none is given.
TRITON_DEFAULT_MAX_BATCH_SIZE = 4

#: Backends whose settings ``--backend-config`` may name (Triton's backend names).
BACKENDS = ("onnxruntime", "python")

#: Triton flags fastoip knows it cannot honour, and why (argparse names every other unknown flag).
UNSUPPORTED = {
    "--allow-sagemaker": "the SageMaker frontend is not implemented",
    "--allow-vertex-ai": "the Vertex AI frontend is not implemented",
    "--response-cache-byte-size": "Triton deprecated it: use --cache-config local,size=N",
    "--rate-limit": "the rate limiter is not implemented",
    "--model-namespacing": "model namespacing is not implemented",
    "--model-config-name": "only config.pbtxt is read",
    "--backend-directory": "backends are built in (onnxruntime, python)",
    "--repoagent-directory": "repository agents are not implemented",
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
    g.add_argument("--log-verbose", type=int, default=None, metavar="LEVEL", help=">0 logs at debug level")
    g.add_argument("--log-info", type=parse_bool, default=None, metavar="BOOL")
    g.add_argument("--log-warning", type=parse_bool, default=None, metavar="BOOL")
    g.add_argument("--log-error", type=parse_bool, default=None, metavar="BOOL")
    g.add_argument("--log-format", choices=("default", "ISO8601"), default="default")
    g.add_argument("--log-file", default="", help="write the log to this file instead of stderr")
    g.add_argument("--strict-model-config", type=parse_bool, default=False, metavar="BOOL",
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
    log_format: str
    log_file: str
    auto_complete: bool
    default_max_batch_size: int
    trace: TraceConfig
    http_restricted: RestrictedFeatures
    grpc_restricted: RestrictedFeatures


def resolve(args: argparse.Namespace) -> TritonSettings:
    """Check and combine the parsed flags; FlagError names the flag that cannot be honoured."""
    root, url = _model_repository(args.model_repository)
    return TritonSettings(
        model_repository=root,
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
        log_format=args.log_format,
        log_file=args.log_file,
        auto_complete=not (args.strict_model_config or args.disable_auto_complete_config),
        default_max_batch_size=_default_max_batch_size(args),
        trace=_trace_config(args),
        http_restricted=_restrictions(restricted.parse_http_restrictions, args.http_restricted_api),
        grpc_restricted=_restrictions(restricted.parse_grpc_restrictions, args.grpc_restricted_protocol),
    )


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


def _model_repository(given: list[str] | None) -> tuple[Path | None, str | None]:
    """The local repository folder, or the object-storage URL (s3://, gs://, as://)."""
    if not given:
        env = os.environ.get("FASTOIP_MODEL_REPOSITORY")
        given = [env] if env else []
    if len(given) > 1:
        raise FlagError(
            "--model-repository / --model-store given more than once: fastoip serves one model repository"
        )
    if not given:
        return None, None
    text = str(given[0])
    try:
        location = parse_location(text)
    except InvalidArgument as exc:
        raise FlagError(f"--model-repository: {exc.message}") from None
    if location is not None:
        return None, text
    root = Path(text)
    if not root.exists():
        raise FlagError(f"failed to stat file {root} (--model-repository does not exist)")
    if not root.is_dir():
        raise FlagError(f"--model-repository {root} is not a directory")
    return root, None


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


def _default_max_batch_size(args: argparse.Namespace) -> int:
    size: int | None = args.default_max_batch_size
    if size is None and os.environ.get("FASTOIP_DEFAULT_MAX_BATCH_SIZE"):
        size = int(os.environ["FASTOIP_DEFAULT_MAX_BATCH_SIZE"])
    for entry in args.backend_config:
        backend, setting, value = parse_backend_config(entry)
        if backend and backend not in BACKENDS:
            raise FlagError(f"--backend-config {entry}: backend '{backend}' is not one of {', '.join(BACKENDS)}")
        if setting != "default-max-batch-size":
            raise FlagError(
                f"--backend-config {entry}: setting '{setting}' is not supported by fastoip "
                "(supported: default-max-batch-size)"
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

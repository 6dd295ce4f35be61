"""``fastoip serve --help`` arranged for a reader: flags in groups, every default shown, one spelling preferred.

Rules:
- The flags are defined where their meaning lives (``cli.py``, ``triton_flags.py``); this module only
  arranges the help: it moves each flag named in :data:`GROUPS` into its group, in the groups' order.
  A flag no group names stays in the group it was defined in (nothing is hidden).
- Every flag with a real default shows it (``default: X``) unless its help already says "default".
- Each alias pair says once, on the spelling not preferred, which one to use (:data:`PREFERRED`).
"""

from __future__ import annotations

import argparse
import textwrap

from .triton_flags import DEFAULT_ONLY, NO_EFFECT

#: (title, description, flags) in the order the help shows them.
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("repository", "what to serve and how models load", (
        "--model-repository", "--model-control-mode", "--load-model", "--repository-poll-secs",
        "--strict-readiness", "--disable-auto-complete-config", "--strict-model-config",
        "--backend-config", "--default-max-batch-size", "--exit-on-error", "--model-load-thread-count",
    )),
    ("network", "listeners: addresses, ports, protocols, connections", (
        "--host", "--grpc-port", "--http-port", "--openai-port", "--metrics-port", "--grpc-address", "--http-address",
        "--http-host", "--metrics-address", "--allow-grpc", "--allow-http", "--allow-metrics", "--grpc-frontend",
        "--grpc-workers", "--grpc-max-concurrent-streams", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
        "--grpc-max-connection-age", "--grpc-max-connection-age-grace", "--http-keep-alive-timeout",
        "--grpc-keepalive-permit-without-calls", "--grpc-http2-max-pings-without-data",
        "--grpc-infer-response-compression-level",
        "--http-thread-count",
    )),
    ("scheduling", "batching, execution and shutdown", (
        "--default-dynamic-batching", "--default-max-queue-delay-microseconds", "--ort-threads", "--cpu-only",
        "--cache-config", "--response-cache-byte-size", "--pinned-memory-pool-byte-size", "--shutdown-grace",
        "--exit-timeout-secs", "--exit-timeout",
    )),
    ("limits", "what one request or connection may cost", (
        "--http-max-input-size", "--http-max-binary-input-size", "--http-max-body-bytes-in-flight",
        "--grpc-max-message-size", "--max-inflated-request-bytes",
        "--max-bytes-elements", "--max-bytes-memory",
        "--http-max-header-size",
        "--http-max-header-count", "--http-header-timeout", "--http-body-timeout", "--http-body-min-rate",
        "--http-body-min-rate-grace", "--grpc-stream-idle-timeout", "--grpc-max-connections",
        "--grpc-max-connection-idle", "--grpc-max-connection-quiet",
        "--grpc-max-connections-per-peer", "--grpc-handshake-timeout", "--grpc-max-queued-response-bytes",
        "--grpc-max-stream-request-bytes", "--grpc-max-queued-request-bytes", "--http-max-connections",
        "--python-shm-pool", "--python-shm-pool-total", "--shared-memory-max-regions",
        "--shared-memory-max-regions-per-client",
        "--http-max-connections-per-peer", "--onnx-max-tensor-bytes", "--onnx-max-tensor-bytes-for",
    )),
    ("security", "TLS, restricted APIs, code loading", (
        "--model-control-allow-code", "--http-ssl-certfile", "--http-ssl-keyfile", "--http-ssl-ca-certs",
        "--http-ssl-require-client-cert", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-server-cert",
        "--grpc-server-key", "--grpc-root-cert", "--http-restricted-api", "--grpc-restricted-protocol",
        "--openai-restricted-api",
    )),
    ("observability", "logs, metrics, traces", (
        "--log-level", "--log-verbose", "--log-info", "--log-warning", "--log-error", "--log-format", "--log-file",
        "--metrics-config", "--trace-config", "--trace-file", "--trace-level", "--trace-rate", "--trace-count",
        "--trace-log-frequency",
    )),
    ("compatibility", "Triton's flags fastoip honours that no group above holds, and MLServer's stream", (
        "--id", "--http-header-forward-pattern", "--grpc-header-forward-pattern", "--mlserver-grpc-stream",
    )),
    ("Triton flags without effect", "taken so Triton's command lines start; the start log says once that each has "
     "no effect here (the values that ask for what fastoip lacks are refused)", (*NO_EFFECT, *DEFAULT_ONLY)),
)

#: Alias (or near-alias) spelling -> the spelling to prefer and why; said once, on the alias.
PREFERRED: dict[str, str] = {
    "--exit-timeout": "--exit-timeout-secs, Triton's name (this one also takes fractions of a second)",
    "--http-host": "--http-address, Triton's name",
    "--strict-model-config": "--disable-auto-complete-config (Triton deprecated --strict-model-config)",
    "--default-max-batch-size": "--backend-config=default-max-batch-size=N, Triton's spelling",
    "--log-verbose": "--log-level DEBUG for fastoip-only scripts; this is Triton's spelling of the same",
    "--grpc-address": "--host, which says what it does here: HTTP and metrics follow it unless given their own",
}

#: Help for flags defined without any (the default is added after it).
FILL_IN: dict[str, str] = {
    "--log-level": "Python log level: DEBUG, INFO, WARNING or ERROR",
    "--log-info": "Triton's: false hides informational messages",
    "--log-warning": "Triton's: false hides warnings too (with --log-info=false)",
    "--log-error": "Triton's: false hides errors too (with --log-info=false --log-warning=false)",
    "--log-format": "ISO8601: every log line starts with an ISO 8601 UTC timestamp",
}


class DefaultsFormatter(argparse.HelpFormatter):
    """Shows ``(default: X)`` after a flag's help when it has a real default and the help does not say it."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        # never break a --flag-name at its hyphens
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            states_default(text, default)
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, list)
            or (default is False and action.nargs == 0)  # a plain switch: off unless given
            or default == ""
        ):
            return text
        shown = ("true" if default else "false") if isinstance(default, bool) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})" if text else f"default: {shown.replace('%', '%%')}"


def states_default(text: str, default: object) -> bool:
    """Whether a help text already says its flag's default."""
    shown = ("true" if default else "false") if isinstance(default, bool) else str(default)
    return any(words in text for words in ("(default", "default:", "; default", f"default {shown}"))


def arrange(parser: argparse.ArgumentParser) -> None:
    """Regroup ``serve``'s flags into :data:`GROUPS` and say which alias spelling to prefer."""
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    for alias, preferred in PREFERRED.items():
        action = by_flag.get(alias)
        if action is not None and alias == action.option_strings[0] and action.help != argparse.SUPPRESS:
            action.help = f"{action.help or ''}; prefer {preferred}".lstrip("; ")
    for flag, text in FILL_IN.items():
        action = by_flag.get(flag)
        if action is not None and not action.help:
            action.help = text
    # argparse keeps each group's actions in a private list; regrouping means moving them between those lists
    old_groups = list(parser._action_groups)
    placed: set[int] = set()
    for title, description, flags in GROUPS:
        group = parser.add_argument_group(title, description)
        for flag in flags:
            action = by_flag.get(flag)
            if action is None or id(action) in placed:
                continue
            for old in old_groups:
                if action in old._group_actions:
                    old._group_actions.remove(action)
            group._group_actions.append(action)
            placed.add(id(action))
    parser._action_groups[:] = [group for group in parser._action_groups if group._group_actions]

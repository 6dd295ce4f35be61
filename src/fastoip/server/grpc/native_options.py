"""Settings of the native gRPC frontend (importable without the native extension, for the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..restricted import RestrictedFeatures
from .service import INT32_MAX


@dataclass
class NativeGrpcOptions:
    """The native frontend's settings (CLI flags named as Triton names them where Triton has one)."""

    max_message_size: int = INT32_MAX
    #: ``--mlserver-grpc-stream``: ModelStreamInfer answers models from model-settings.json with MLServer's
    #: messages (server/grpc/mlserver_shapes.py).
    mlserver_streams: bool = False
    max_concurrent_streams: int = 1024
    #: HTTP/2 stream window: large so a 602 KB request arrives without waiting for WINDOW_UPDATEs.
    stream_window: int = 8 * 1024 * 1024
    connection_window: int = 64 * 1024 * 1024
    #: PING a connection idle this long (ms, Triton's --grpc-keepalive-time; 0 turns it off) ...
    keepalive_time_ms: int = 7_200_000
    #: ... and close it when the PING is not answered within this (ms, --grpc-keepalive-timeout).
    keepalive_timeout_ms: int = 20_000
    #: GOAWAY a connection this old (ms, Triton's --grpc-max-connection-age; 0: never) so clients
    #: reconnect through a load balancer ...
    max_connection_age_ms: int = 0
    #: ... and close it this long after that GOAWAY (ms, --grpc-max-connection-age-grace; 0: when its calls end).
    max_connection_age_grace_ms: int = 0
    #: A stream whose request side stays open with no DATA arriving for this long (ms; 0: never) is answered
    #: DEADLINE_EXCEEDED and reset: a unary call that never ends its request, or a ModelStreamInfer stalled
    #: inside a message (between messages a stream may idle, as sequence clients do).  nginx's
    #: client_body_timeout default; Triton has no such bound.
    stream_idle_timeout_ms: int = 60_000
    #: issue 27 (server/grpc/limits.py): connections at once (0: half the open-file limit) ...
    max_connections: int = 0
    #: ... a connection with no call for this long gets a graceful GOAWAY (ms; grpc's max connection idle; 0: never)
    max_connection_idle_ms: int = 300_000
    #: ... at the cap a connection whose calls all wait on their client and moved no message for this long counts
    #: as idle (ms; issue 37: a stream opened and left silent holds nothing but a slot) ...
    max_connection_quiet_ms: int = 10_000
    #: ... and a peer address holding more connections than this loses one first at the cap (0: a quarter of it).
    max_connections_per_peer: int = 0
    #: ... and one whose client sent no HTTP/2 preface + SETTINGS within this is closed (ms; 0: never).
    handshake_timeout_ms: int = 10_000
    #: ... and response bytes waiting for clients' flow-control windows, all connections together.
    max_queued_response_bytes: int = 1024 * 1024 * 1024
    #: ModelStreamInfer request bytes received and not yet answered, per stream / server-wide (issue 27).
    max_stream_request_bytes: int = 256 * 1024 * 1024
    max_queued_request_bytes: int = 1024 * 1024 * 1024
    use_ssl: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""
    use_ssl_mutual: bool = False
    #: Triton's --grpc-restricted-protocol: RPC groups that need a header key=value.
    restricted_protocols: RestrictedFeatures = field(default_factory=lambda: RestrictedFeatures({}))
    #: Triton's --grpc-infer-response-compression-level: none, low, medium or high.
    response_compression_level: str = "none"
    #: Triton's --grpc-http2-max-pings-without-data: keepalive PINGs sent with nothing received in between
    #: (0: no limit).
    max_pings_without_data: int = 2
    #: Triton's --grpc-keepalive-permit-without-calls; fastoip's default (True) also pings idle connections.
    keepalive_without_calls: bool = True
    #: Triton's --grpc-header-forward-pattern: metadata keys matching it become request parameters.
    forward_header_pattern: str | None = None
    #: Threads for the slow control RPCs (model load, shared memory); inference never uses them.
    control_threads: int = 4

"""Where the load goes (``Target``) and the one error type of the package."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
#: An https:// URL without a port: curl's (so perf_analyzer's) default.
HTTPS_PORT = 443


class BenchError(Exception):
    """A failure that ends the run before or between measurements, with a clear message.

    ``stage`` says what was being done (``metadata``, ``config``, ``probe``,
    ``server`` ...); ``status`` is the gRPC status name or HTTP code when the
    failure came from the server.
    """

    def __init__(self, message: str, *, stage: str = "", status: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        self.status = status

    def __str__(self) -> str:
        return self.message

    def as_dict(self) -> dict:
        return {"stage": self.stage, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class TlsSettings:
    """How to open TLS connections to the target (PEM bytes, so the settings pickle to worker processes).

    Made from perf_analyzer's ``--ssl-*`` flags by :mod:`fastoip.bench.tls`, which also opens the channels.
    """

    #: PEM CA certificates the server's certificate must chain to (None: the system's / gRPC's default roots).
    root_certificates: bytes | None = None
    #: A client certificate chain and its key, both PEM, for servers that ask for one (mutual TLS).
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    #: HTTPS only (curl's CURLOPT_SSL_VERIFYPEER / VERIFYHOST): check the certificate, check the host name.
    verify_peer: bool = True
    verify_host: bool = True


@dataclass(frozen=True)
class Target:
    """A server endpoint: protocol plus host:port, and TLS settings when it speaks TLS."""

    protocol: str  # "grpc" | "http"
    host: str
    port: int
    tls: TlsSettings | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        scheme = "https" if self.protocol == "http" and self.tls is not None else self.protocol
        return f"{scheme}://{self.address}"

    @classmethod
    def parse(cls, url: str, protocol: str | None = None) -> Target:
        """``host[:port]``, ``grpc://host:port``, ``http://host:port`` or ``https://host:port``.

        An explicit ``protocol`` (``-i``) wins over the URL's scheme; without
        either the protocol is HTTP (perf_analyzer's default).  A missing port is the protocol's default
        (8001 for gRPC, 8000 for HTTP, 443 for HTTPS), as with perf_analyzer. An ``https://`` URL gives a
        target with default TLS settings, which the ``--ssl-https-*`` flags then replace.
        """
        scheme = None
        rest = url.strip()
        if "://" in rest:
            scheme, rest = rest.split("://", 1)
            scheme = scheme.lower()
            if scheme == "https":  # HTTP over TLS, set up by the --ssl-https-* flags
                if protocol not in (None, "http"):
                    raise BenchError("https:// is HTTP over TLS; for gRPC over TLS give --ssl-grpc-use-ssl",
                                     stage="args")
                protocol = "http"
            elif scheme not in DEFAULT_PORTS:
                raise BenchError(f"unknown URL scheme {scheme!r} (use grpc://, http:// or https://)", stage="args")
        rest = rest.rstrip("/")
        if "/" in rest:
            raise BenchError(f"URL {url!r} must not have a path", stage="args")
        proto = protocol or scheme or "http"
        if proto not in DEFAULT_PORTS:
            raise BenchError(f"unknown protocol {proto!r} (use grpc or http)", stage="args")
        host, port = rest, (HTTPS_PORT if scheme == "https" else DEFAULT_PORTS[proto])
        if rest.startswith("["):  # [ipv6]:port
            end = rest.find("]")
            host = rest[1:end]
            if rest[end + 1 :].startswith(":"):
                port = int(rest[end + 2 :])
        elif rest.count(":") == 1:
            host, port_text = rest.split(":")
            try:
                port = int(port_text)
            except ValueError:
                raise BenchError(f"bad port in URL {url!r}", stage="args") from None
        if not host:
            host = "127.0.0.1"
        return cls(proto, host, port, TlsSettings() if scheme == "https" else None)

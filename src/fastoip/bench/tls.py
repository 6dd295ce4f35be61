"""TLS for the bench's connections: perf_analyzer's ``--ssl-grpc-*`` and ``--ssl-https-*`` flags.

Rules:
- perf_analyzer's meaning: ``--ssl-grpc-use-ssl`` turns on a TLS gRPC channel (root certificates,
  client key and certificate chain from the other ``--ssl-grpc-*`` files; gRPC's default roots without
  one); HTTPS is asked for by an ``https://`` URL and set up by ``--ssl-https-*`` (curl's meanings:
  verify-peer 0/1, verify-host 0/1/2, both on by default; PEM files).
- Every connection the bench opens to the target goes through here: the control calls (metadata,
  config, statistics), the probe, and the load generators, in this process or in ``--processes`` workers
  (the settings hold the files' bytes, so they pickle).
- A flag that cannot be honoured is refused by name (:class:`BenchError`, stage ``args``): a DER key or
  certificate (Python's ssl reads PEM), files for a protocol the run does not use, TLS for the local
  plaintext server.
"""

from __future__ import annotations

import argparse
import ssl
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from .target import BenchError, TlsSettings

#: (attribute, flag): CA certificates, client certificate chain, client key, in that order.
GRPC_FILE_FLAGS = (
    ("ssl_grpc_root_certifications_file", "--ssl-grpc-root-certifications-file"),
    ("ssl_grpc_certificate_chain_file", "--ssl-grpc-certificate-chain-file"),
    ("ssl_grpc_private_key_file", "--ssl-grpc-private-key-file"),
)
HTTPS_FILE_FLAGS = (
    ("ssl_https_ca_certificates_file", "--ssl-https-ca-certificates-file"),
    ("ssl_https_client_certificate_file", "--ssl-https-client-certificate-file"),
    ("ssl_https_private_key_file", "--ssl-https-private-key-file"),
)


def grpc_credentials(tls: TlsSettings) -> Any:
    import grpc

    return grpc.ssl_channel_credentials(tls.root_certificates, tls.private_key, tls.certificate_chain)


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A client context for HTTPS with these settings."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if tls.root_certificates is not None:
        context.load_verify_locations(cadata=tls.root_certificates.decode("ascii"))
    if not tls.verify_host or not tls.verify_peer:
        context.check_hostname = False
    if not tls.verify_peer:
        context.verify_mode = ssl.CERT_NONE
    if tls.certificate_chain is not None:
        # load_cert_chain reads files only: the PEM bytes go through a private temporary folder
        with tempfile.TemporaryDirectory(prefix="fastoip-bench-tls-") as folder:
            chain, key = Path(folder) / "chain.pem", Path(folder) / "key.pem"
            chain.write_bytes(tls.certificate_chain)
            key.write_bytes(tls.private_key or b"")
            try:
                context.load_cert_chain(chain, key if tls.private_key is not None else None)
            except ssl.SSLError as exc:
                raise BenchError(f"the client certificate and key do not load: {exc}", stage="args") from None
    return context


def grpc_channel(address: str, options: list[tuple[str, Any]], tls: TlsSettings | None) -> Any:
    """A sync grpcio channel to ``address``: TLS with ``tls``, plaintext without."""
    import grpc

    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, grpc_credentials(tls), options=options)


def grpc_aio_channel(address: str, options: list[tuple[str, Any]], tls: TlsSettings | None) -> Any:
    """A grpc.aio channel to ``address``: TLS with ``tls``, plaintext without."""
    import grpc.aio

    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, grpc_credentials(tls), options=options)


def tls_from_args(args: argparse.Namespace, protocol: str, https: bool, local: bool) -> TlsSettings | None:
    """The TLS settings the command line asks for (None: plaintext); BenchError naming a flag it cannot honour."""
    grpc_given = [flag for attr, flag in GRPC_FILE_FLAGS if getattr(args, attr, None)]
    https_given = [flag for attr, flag in HTTPS_FILE_FLAGS if getattr(args, attr, None)]
    if args.ssl_https_verify_peer is not None or args.ssl_https_verify_host is not None:
        https_given += [flag for flag, value in (("--ssl-https-verify-peer", args.ssl_https_verify_peer),
                                                 ("--ssl-https-verify-host", args.ssl_https_verify_host))
                        if value is not None]
    for attr, flag in (("ssl_https_client_certificate_type", "--ssl-https-client-certificate-type"),
                       ("ssl_https_private_key_type", "--ssl-https-private-key-type")):
        kind = getattr(args, attr)
        if kind is not None and kind != "PEM":
            raise BenchError(
                f"{flag} {kind}: fastoip bench reads PEM files only (Python's ssl module); convert with "
                "'openssl x509 -inform DER' or 'openssl pkey -inform DER'", stage="args"
            )
    use_grpc_ssl = bool(args.ssl_grpc_use_ssl)
    if local and (use_grpc_ssl or grpc_given or https_given or https):
        raise BenchError("TLS flags need a URL: the local fastoip bench starts speaks plaintext", stage="args")
    if grpc_given and not use_grpc_ssl:
        raise BenchError(f"{', '.join(grpc_given)} need --ssl-grpc-use-ssl", stage="args")
    if (use_grpc_ssl or grpc_given) and protocol != "grpc":
        raise BenchError("--ssl-grpc-* apply to gRPC; for HTTP give an https:// URL and --ssl-https-*", stage="args")
    if https_given and not https:
        raise BenchError(f"{', '.join(https_given)} need an https:// URL", stage="args")
    if use_grpc_ssl:
        return _settings(args, *(flag for _, flag in GRPC_FILE_FLAGS))
    if https:
        settings = _settings(args, *(flag for _, flag in HTTPS_FILE_FLAGS))
        settings = replace(
            settings,
            verify_peer=args.ssl_https_verify_peer != 0,  # None: curl's default, on
            verify_host=args.ssl_https_verify_host != 0,  # 1 and 2 both check the name, as curl >= 7.66
        )
        ssl_context(settings)  # the files load now, or the run stops here naming them
        return settings
    return None


def _settings(args: argparse.Namespace, roots: str, chain: str, key: str) -> TlsSettings:
    """TlsSettings from three file flags (CA certificates, client certificate chain, client key)."""
    has_chain, has_key = _path(args, chain) is not None, _path(args, key) is not None
    if has_chain != has_key:
        raise BenchError(f"a client certificate needs its key and the key its certificate: give "
                         f"{key if has_chain else chain} too", stage="args")
    return TlsSettings(_read(args, roots), _read(args, chain), _read(args, key))


def _path(args: argparse.Namespace, flag: str) -> str | None:
    value: str | None = getattr(args, flag.lstrip("-").replace("-", "_"))
    return value


def _read(args: argparse.Namespace, flag: str) -> bytes | None:
    path = _path(args, flag)
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise BenchError(f"{flag} {path}: cannot read it: {exc.strerror}", stage="args") from None

"""A throwaway PKI for TLS tests: a self-signed CA, a server certificate for localhost/127.0.0.1 and a
client certificate, written as PEM files with ``cryptography`` (shared by the gRPC and HTTP TLS tests)."""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from serverproc import serve_help


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
    *, ca: bool = False, server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    elif server:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(root: Path) -> Pki:
    """A self-signed CA, a server certificate for localhost/127.0.0.1 and a client certificate, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("fastoip test CA", ca_key, _name("fastoip test CA"), ca_key, ca=True)
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    paths = {}
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"fastoip test {role}", key, ca_cert.subject, ca_key, server=role == "server")
        (root / f"{role}.pem").write_bytes(cert.public_bytes(pem))
        paths[role] = (root / f"{role}.pem", _write_key(root / f"{role}.key", key))
    return Pki(root / "ca.pem", *paths["server"], *paths["client"])


def bool_flag(name: str) -> list[str]:
    """Triton spells its TLS switches ``--grpc-use-ssl=true``; a plain switch (store_true) is taken as well."""
    # the option's own line in --help: "  --grpc-use-ssl GRPC_USE_SSL" takes a value, "  --grpc-use-ssl   text" not
    takes_value = re.search(r"(?m)^\s+" + re.escape(name) + r" [^\s-]", serve_help()) is not None
    return [f"{name}=true"] if takes_value else [name]


def tls_args(pki: Pki, *, mutual: bool = False) -> list[str]:
    args = [*bool_flag("--grpc-use-ssl"), "--grpc-server-cert", str(pki.server_cert),
            "--grpc-server-key", str(pki.server_key), "--grpc-root-cert", str(pki.ca)]
    return args + (bool_flag("--grpc-use-ssl-mutual") if mutual else [])

"""TLS on the native gRPC frontend with Triton's flags: server TLS, mutual TLS, ALPN h2.

A throwaway CA, server and client certificate are made with ``cryptography`` (``tests/pki.py``).  The grpcio frontend
has no TLS flags, so these tests need the native frontend and skip without it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
from tritonclient.utils import InferenceServerException

from pki import Pki, tls_args
from serverproc import ServerProcess
from simple_model import simple_inputs

pytestmark = pytest.mark.timeout(120)


def assert_infers(client: tg.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.infer("simple", simple_inputs(tg)).as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]


@pytest.fixture(scope="module")
def tls_server(demo_repo: Path, pki: Pki, native_frontend: str) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *tls_args(pki), grpc_frontend=native_frontend) as proc:
        yield proc


@pytest.fixture(scope="module")
def mtls_server(demo_repo: Path, pki: Pki, native_frontend: str) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *tls_args(pki, mutual=True), grpc_frontend=native_frontend) as proc:
        yield proc


def test_generated_certificates_verify(pki: Pki) -> None:
    """The fixture itself: the CA verifies the server for localhost and 127.0.0.1, and the client (mutual)."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(pki.ca))
    client_ctx.load_cert_chain(pki.client_cert, pki.client_key)
    accepted: list = []

    def serve(sock: socket.socket) -> None:
        with server_ctx.wrap_socket(sock, server_side=True) as tls:
            peer = tls.getpeercert()
            assert peer is not None
            accepted.append(peer["subject"])

    for host in ("localhost", "127.0.0.1"):
        accepted.clear()
        left, right = socket.socketpair()
        thread = threading.Thread(target=serve, args=(right,))
        thread.start()
        with client_ctx.wrap_socket(left, server_hostname=host) as tls:
            assert tls.version() is not None
        thread.join(10)
        assert accepted and "fastoip test client" in str(accepted[0])


def test_tls_with_tritonclient(tls_server: ServerProcess, pki: Pki) -> None:
    url = f"localhost:{tls_server.grpc_port}"
    assert_infers(tg.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca)))

    async def aio() -> None:
        async with tga.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca)) as client:
            assert await client.is_server_ready()
            result = await client.infer("simple", simple_inputs(tg))
            assert result.as_numpy("OUTPUT1").tolist() == [list(range(-1, 15))]

    asyncio.run(aio())


def test_tls_negotiates_h2_with_alpn(tls_server: ServerProcess, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "h2"


def test_plaintext_client_on_the_tls_port_fails_cleanly(tls_server: ServerProcess, pki: Pki) -> None:
    with pytest.raises(InferenceServerException):
        tg.InferenceServerClient(tls_server.grpc_url).is_server_live(client_timeout=5)
    with pytest.raises(InferenceServerException):  # a client that does not trust the CA
        tg.InferenceServerClient(f"localhost:{tls_server.grpc_port}", ssl=True).is_server_live(client_timeout=5)
    assert tls_server.proc is not None and tls_server.proc.poll() is None
    url = f"localhost:{tls_server.grpc_port}"
    assert_infers(tg.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca)))


def test_mutual_tls_requires_a_client_certificate(mtls_server: ServerProcess, pki: Pki) -> None:
    url = f"localhost:{mtls_server.grpc_port}"
    with_cert = tg.InferenceServerClient(
        url, ssl=True, root_certificates=str(pki.ca),
        private_key=str(pki.client_key), certificate_chain=str(pki.client_cert),
    )
    assert_infers(with_cert)
    without_cert = tg.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca))
    with pytest.raises(InferenceServerException):
        without_cert.is_server_live(client_timeout=5)
    assert mtls_server.proc is not None and mtls_server.proc.poll() is None
    assert_infers(with_cert)

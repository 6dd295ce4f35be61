"""HTTPS on the HTTP frontend (fastoip's ``--http-ssl-*`` flags: uvicorn's TLS), server-only and mutual,
with tritonclient.http and tritonclient.http.aio against a throwaway PKI (``tests/pki.py``)."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha
from tritonclient.utils import InferenceServerException

from pki import Pki, make_pki
from serverproc import ServerProcess
from simple_model import simple_inputs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def https_args(pki: Pki, *, mutual: bool = False) -> list[str]:
    args = ["--http-ssl-certfile", str(pki.server_cert), "--http-ssl-keyfile", str(pki.server_key)]
    if mutual:
        args += ["--http-ssl-ca-certs", str(pki.ca), "--http-ssl-require-client-cert=true"]
    return args


@pytest.fixture(scope="module")
def https_server(demo_repo: Path, pki: Pki) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *https_args(pki), http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def mtls_server(demo_repo: Path, pki: Pki) -> Iterator[ServerProcess]:
    with ServerProcess(demo_repo, *https_args(pki, mutual=True), http=True) as proc:
        yield proc


def assert_infers(client: th.InferenceServerClient) -> None:
    try:
        assert client.is_server_ready()
        assert client.infer("simple", simple_inputs(th)).as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
    finally:
        client.close()


def test_https_with_tritonclient(https_server: ServerProcess, pki: Pki) -> None:
    url = f"localhost:{https_server.http_port}"
    assert_infers(th.InferenceServerClient(url, ssl=True, ssl_options={"ca_certs": str(pki.ca)}))

    async def aio() -> None:
        context = ssl.create_default_context(cafile=str(pki.ca))
        client = tha.InferenceServerClient(url, ssl=True, ssl_context=context)
        try:
            assert await client.is_server_live()
            result = await client.infer("simple", simple_inputs(tha))
            assert result.as_numpy("OUTPUT1").tolist() == [list(range(-1, 15))]
        finally:
            await client.close()

    asyncio.run(aio())


def test_plain_http_and_untrusting_clients_fail_cleanly(https_server: ServerProcess, pki: Pki) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", https_server.http_port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/v2/health/ready")
        conn.getresponse().read()
    conn.close()
    untrusting = http.client.HTTPSConnection("localhost", https_server.http_port, timeout=10,
                                             context=ssl.create_default_context())
    with pytest.raises(ssl.SSLError):
        untrusting.request("GET", "/v2/health/ready")
    untrusting.close()
    assert https_server.proc is not None and https_server.proc.poll() is None
    assert_infers(th.InferenceServerClient(f"localhost:{https_server.http_port}", ssl=True,
                                           ssl_options={"ca_certs": str(pki.ca)}))


def test_mutual_tls_requires_a_client_certificate(mtls_server: ServerProcess, pki: Pki) -> None:
    url = f"localhost:{mtls_server.http_port}"
    without_cert = th.InferenceServerClient(url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
    # the handshake, or the first read after it, fails: geventhttpclient reports the closed connection
    with pytest.raises((OSError, http.client.HTTPException, InferenceServerException)):
        without_cert.is_server_live()
    without_cert.close()
    assert_infers(th.InferenceServerClient(url, ssl=True, ssl_options={
        "ca_certs": str(pki.ca), "certfile": str(pki.client_cert), "keyfile": str(pki.client_key),
    }))


def test_tls_flags_are_checked(demo_repo: Path, pki: Pki) -> None:
    from fastoip.cli import serve_options
    from fastoip.triton_flags import FlagError

    with pytest.raises(FlagError, match="HTTPS needs --http-ssl-certfile"):
        serve_options(["--http-ssl-keyfile", str(pki.server_key)])
    with pytest.raises(FlagError, match="--http-ssl-require-client-cert needs --http-ssl-ca-certs"):
        serve_options([*https_args(pki), "--http-ssl-require-client-cert"])
    missing = pki.ca.parent / "missing.pem"
    done = subprocess.run(
        [sys.executable, "-m", "fastoip.cli", "serve", "--model-repository", str(demo_repo), "--grpc-port", "0",
         "--http-port", "0", "--metrics-port", "-1", "--shutdown-grace", "0", "--http-ssl-certfile", str(missing)],
        capture_output=True, text=True, timeout=90,
    )
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "the HTTP server failed to start" in done.stderr

"""``fastoip bench`` over TLS with perf_analyzer's ``--ssl-grpc-*`` and ``--ssl-https-*`` flags.

gRPC: a fastoip served with ``--grpc-use-ssl`` (and ``--grpc-use-ssl-mutual``), certificates made by the TLS
tests' fixture. HTTPS: fastoip's HTTP has no TLS of its own (a proxy goes in front, as the README says), so the
test puts a TLS-terminating proxy (``ssl`` + ``asyncio``, real sockets) in front of its HTTP port.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastoip.bench.cli import main as bench_main
from pki import Pki, tls_args
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

FAST = ["-m", "simple", "--concurrency-range", "2", "-p", "300", "-r", "2", "--warmup-ms", "100", "--quiet"]


@pytest.fixture(scope="module")
def tls_server(demo_repo: Path, pki: Pki, native_frontend: str) -> Iterator[ServerProcess]:  # noqa: F811
    with ServerProcess(demo_repo, *tls_args(pki), http=True, grpc_frontend=native_frontend) as proc:
        yield proc


@pytest.fixture(scope="module")
def mtls_server(demo_repo: Path, pki: Pki, native_frontend: str) -> Iterator[ServerProcess]:  # noqa: F811
    with ServerProcess(demo_repo, *tls_args(pki, mutual=True), grpc_frontend=native_frontend) as proc:
        yield proc


class TlsProxy:
    """Terminates TLS on a loopback port and forwards the bytes to a plaintext port (an asyncio loop in a thread)."""

    def __init__(self, target_port: int, context: ssl.SSLContext) -> None:
        self.target_port = target_port
        self.context = context
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.handshakes_failed = 0
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="tls-proxy", daemon=True)

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.context), self.loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))


def proxy_context(pki: Pki, *, mutual: bool = False) -> ssl.SSLContext:  # noqa: F811
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE
    return context


def run_bench(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    out = tmp_path / "bench.json"
    rc = bench_main([*args, *FAST, "--json", str(out)])
    err = capsys.readouterr().err
    return rc, (json.loads(out.read_text()) if out.exists() else {}), err


def assert_measured(rc: int, document: dict, err: str) -> None:
    assert rc == 0, err
    (result,) = [r for r in document["results"] if r["target"] == "server"]
    assert result["throughput_infer_per_s"] > 0
    assert not result.get("errors"), result


@pytest.mark.parametrize("client", ["future", "aio"])
def test_grpc_over_tls(tls_server: ServerProcess, pki: Pki, tmp_path: Path, capsys, client: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    rc, document, err = run_bench(
        [f"grpc://{tls_server.grpc_url}", "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(pki.ca),
         "--grpc-client", client], tmp_path, capsys,
    )
    assert_measured(rc, document, err)


def test_grpc_streaming_over_tls_in_worker_processes(tls_server: ServerProcess, pki: Pki, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]  # noqa: E501, F811
    rc, document, err = run_bench(
        [f"grpc://{tls_server.grpc_url}", "--ssl-grpc-use-ssl=true", "--ssl-grpc-root-certifications-file", str(pki.ca),
         "--streaming", "--processes", "2"], tmp_path, capsys,
    )
    assert_measured(rc, document, err)


def test_mutual_tls_needs_the_client_certificate(mtls_server: ServerProcess, pki: Pki, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]  # noqa: E501, F811
    base = [f"grpc://{mtls_server.grpc_url}", "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(pki.ca)]
    rc, _, err = run_bench(base, tmp_path, capsys)
    assert rc != 0 and "UNAVAILABLE" in err, err
    rc, document, err = run_bench(
        [*base, "--ssl-grpc-private-key-file", str(pki.client_key),
         "--ssl-grpc-certificate-chain-file", str(pki.client_cert)], tmp_path, capsys,
    )
    assert_measured(rc, document, err)


def test_plaintext_bench_on_the_tls_port_fails_cleanly(tls_server: ServerProcess, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = run_bench([f"grpc://{tls_server.grpc_url}"], tmp_path, capsys)
    assert rc != 0 and "UNAVAILABLE" in err, err


@pytest.mark.parametrize("mutual", [False, True])
def test_https_through_a_tls_proxy(tls_server: ServerProcess, pki: Pki, tmp_path: Path, capsys, mutual: bool) -> None:  # type: ignore[no-untyped-def]  # noqa: E501, F811
    with TlsProxy(tls_server.http_port, proxy_context(pki, mutual=mutual)) as proxy:
        args = [f"https://127.0.0.1:{proxy.port}", "--ssl-https-ca-certificates-file", str(pki.ca)]
        if mutual:
            args += ["--ssl-https-client-certificate-file", str(pki.client_cert),
                     "--ssl-https-private-key-file", str(pki.client_key), "--ssl-https-private-key-type", "PEM"]
        rc, document, err = run_bench(args, tmp_path, capsys)
        assert_measured(rc, document, err)
        assert document["url"] == f"https://127.0.0.1:{proxy.port}"


def test_https_checks_the_certificate_unless_told_not_to(tls_server: ServerProcess, pki: Pki, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]  # noqa: E501, F811
    with TlsProxy(tls_server.http_port, proxy_context(pki)) as proxy:
        rc, _, err = run_bench([f"https://127.0.0.1:{proxy.port}"], tmp_path, capsys)  # the test CA is not trusted
        assert rc != 0 and "CERTIFICATE_VERIFY_FAILED" in err, err
        rc, document, err = run_bench(
            [f"https://127.0.0.1:{proxy.port}", "--ssl-https-verify-peer", "0", "--ssl-https-verify-host", "0"],
            tmp_path, capsys,
        )
        assert_measured(rc, document, err)


@pytest.mark.parametrize(("args", "message"), [
    (["127.0.0.1:1", "--ssl-grpc-root-certifications-file", "ca.pem"],
     "--ssl-grpc-root-certifications-file need --ssl-grpc-use-ssl"),
    (["-i", "http", "127.0.0.1:1", "--ssl-grpc-use-ssl"], "--ssl-grpc-\\* apply to gRPC"),
    (["http://127.0.0.1:1", "--ssl-https-verify-peer", "0"], "--ssl-https-verify-peer need an https:// URL"),
    (["https://127.0.0.1:1", "--ssl-https-private-key-type", "DER"], "--ssl-https-private-key-type DER: .* PEM"),
    (["https://127.0.0.1:1", "--ssl-https-client-certificate-type", "DER"], "certificate-type DER"),
    (["--local-server", "--ssl-grpc-use-ssl"], "TLS flags need a URL"),
    (["-i", "grpc", "https://127.0.0.1:1"], "for gRPC over TLS give --ssl-grpc-use-ssl"),
    (["grpc://127.0.0.1:1", "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", "/nonexistent/ca.pem"],
     "--ssl-grpc-root-certifications-file /nonexistent/ca.pem: cannot read it"),
    (["grpc://127.0.0.1:1", "--ssl-grpc-use-ssl", "--ssl-grpc-private-key-file", "key.pem"],
     "give --ssl-grpc-certificate-chain-file too"),
    (["grpc://127.0.0.1:1", "--ssl-grpc-use-ssl", "--ceiling"], "--ceiling .* not with TLS"),
    (["https://127.0.0.1:1", "--ssl-https-verify-host", "3"], "invalid choice: 3"),
])
def test_flags_it_cannot_honour_are_refused_by_name(args: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stopped:
        bench_main([*args, "-m", "simple"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err

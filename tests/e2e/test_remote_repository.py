"""Model repositories on object storage: a real S3-compatible server (moto's server mode) on 127.0.0.1.

fastoip reads it through s3fs as it would read AWS (Triton's ``s3://host:port/bucket/path`` spelling);
the test writes and deletes objects with boto3, as an operator's pipeline would.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from onnx import TensorProto

import fastoip
from fastoip.errors import InvalidArgument, Unavailable
from fastoip.repository.remote import parse_location
from models import identity_model_bytes

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

IDENTITY = identity_model_bytes(TensorProto.FLOAT, [4])
CONFIG = b'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, object]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fastoip-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fastoip-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="models")
    try:
        yield f"{host}:{port}", client
    finally:
        server.stop()


def put_model(client: object, name: str, version: int) -> None:
    client.put_object(Bucket="models", Key=f"repo/{name}/config.pbtxt", Body=CONFIG)  # type: ignore[attr-defined]
    client.put_object(Bucket="models", Key=f"repo/{name}/{version}/model.onnx", Body=IDENTITY)  # type: ignore[attr-defined]


def served_versions(server: fastoip.Server, name: str) -> list[str]:
    import json

    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}", timeout=5) as answer:
            return list(json.loads(answer.read())["versions"])
    except urllib.error.HTTPError:
        return []


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def test_load_poll_new_version_delete_version_and_vanishing_bucket(s3: tuple[str, object]) -> None:
    address, client = s3
    put_model(client, "ident", 1)
    put_model(client, "other", 1)
    url = f"s3://{address}/models/repo"
    with fastoip.Server(url, grpc=False, model_control_mode="poll", poll_interval=0.3) as server:
        assert served_versions(server, "ident") == ["1"] and served_versions(server, "other") == ["1"]

        put_model(client, "ident", 2)  # a new version: loaded on the next poll
        wait_for(lambda: served_versions(server, "ident") == ["2"])

        client.delete_object(Bucket="models", Key="repo/ident/2/model.onnx")  # type: ignore[attr-defined]
        wait_for(lambda: served_versions(server, "ident") == ["1"])  # back to the version left

        for key in ("repo/other/config.pbtxt", "repo/other/1/model.onnx"):  # a model deleted: unloaded
            client.delete_object(Bucket="models", Key=key)  # type: ignore[attr-defined]
        wait_for(lambda: served_versions(server, "other") == [])

        # the bucket vanishes: polling fails, logs, and the loaded models keep serving
        for key in ("repo/ident/config.pbtxt", "repo/ident/1/model.onnx"):
            client.delete_object(Bucket="models", Key=key)  # type: ignore[attr-defined]
        client.delete_bucket(Bucket="models")  # type: ignore[attr-defined]
        time.sleep(1.5)
        assert served_versions(server, "ident") == ["1"]


def test_a_missing_bucket_is_a_start_error_naming_the_url(s3: tuple[str, object]) -> None:
    address, _ = s3
    url = f"s3://{address}/no-such-bucket/repo"
    with pytest.raises(Unavailable, match="cannot read model repository 's3://.*no-such-bucket"):
        fastoip.Server(url, grpc=False).start()


def test_a_url_with_another_scheme_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument, match="'ftp://' is not supported"):
        fastoip.Server("ftp://example.com/models")
    from fastoip.cli import serve_options
    from fastoip.triton_flags import FlagError

    with pytest.raises(FlagError, match="'http://' is not supported"):
        serve_options(["--model-repository", "http://host/models"])


def test_tritons_spellings() -> None:
    aws = parse_location("s3://bucket/path/to/repo")
    assert aws is not None and (aws.protocol, aws.path, aws.options) == ("s3", "bucket/path/to/repo", {})
    minio = parse_location("s3://https://minio.local:9000/bucket/repo")
    assert minio is not None and minio.options == {"endpoint_url": "https://minio.local:9000"}
    assert minio.path == "bucket/repo"
    plain = parse_location("s3://127.0.0.1:9000/bucket/repo")
    assert plain is not None and plain.options == {"endpoint_url": "http://127.0.0.1:9000"}
    gcs = parse_location("gs://bucket/repo")
    assert gcs is not None and (gcs.protocol, gcs.path) == ("gcs", "bucket/repo")
    azure = parse_location("as://account/container/repo")
    assert azure is not None and (azure.protocol, azure.path, azure.options["account_name"]) == (
        "abfs", "container/repo", "account")
    assert parse_location(str(Path("/local/models"))) is None


def enforce_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the server checks every request's credentials against its IAM (ours are unknown there)."""
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)


def test_bad_credentials_at_start_are_a_clear_error(s3: tuple[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    address, client = s3
    put_model(client, "ident", 1)
    enforce_credentials(monkeypatch)
    with pytest.raises(Unavailable, match="cannot read model repository 's3://.*/models/repo'.*(Access|access|Key)"):
        fastoip.Server(f"s3://{address}/models/repo", grpc=False).start()


def test_credentials_refused_while_polling_keep_the_models(
    s3: tuple[str, object], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    address, client = s3
    put_model(client, "ident", 1)
    with fastoip.Server(f"s3://{address}/models/repo", grpc=False, model_control_mode="poll",
                        poll_interval=0.3) as server:
        assert served_versions(server, "ident") == ["1"]
        enforce_credentials(monkeypatch)
        with caplog.at_level("ERROR", logger="fastoip"):
            wait_for(lambda: any("cannot read model repository" in r.getMessage() for r in caplog.records))
        assert served_versions(server, "ident") == ["1"]


def test_a_key_with_an_empty_segment_is_skipped(s3: tuple[str, object], caplog: pytest.LogCaptureFixture) -> None:
    """Issue 37: ``repo//x`` (legal in S3) was read back as ``repo/x`` and the server did not start."""
    address, client = s3
    put_model(client, "ident", 1)
    client.put_object(Bucket="models", Key="repo//x", Body=b"stray")  # type: ignore[attr-defined]
    client.put_object(Bucket="models", Key="repo/ident//config.pbtxt", Body=b"junk")  # type: ignore[attr-defined]
    with fastoip.Server(f"s3://{address}/models/repo", grpc=False) as server:
        assert served_versions(server, "ident") == ["1"]
    assert "names no file path" in caplog.text


def test_a_failed_start_leaves_no_local_copy(s3: tuple[str, object]) -> None:
    import tempfile

    address, _ = s3
    before = set(Path(tempfile.gettempdir()).glob("fastoip-repository-*"))
    with pytest.raises(Unavailable):
        fastoip.Server(f"s3://{address}/no-such-bucket/repo", grpc=False).start()
    assert set(Path(tempfile.gettempdir()).glob("fastoip-repository-*")) == before

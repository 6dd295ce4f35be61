"""The examples in ``examples/`` work end to end (real server, real tritonclient)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pandas_pipeline"


# One server on the default gRPC frontend, not one per frontend: the example's model runs under the Core, and
# tests/e2e/test_grpc_differential.py keeps the two frontends' answers byte-identical.
@pytest.fixture(scope="module")
def pandas_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # A copy, so the server's __pycache__ does not land in the source tree.
    root = tmp_path_factory.mktemp("pandas-pipeline") / "repository"
    shutil.copytree(EXAMPLE / "repository", root)
    with ServerProcess(root, http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def example_client():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(EXAMPLE))
    try:
        import client

        yield client
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("client", None)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_pandas_pipeline_scores_the_table(pandas_server: ServerProcess, example_client, protocol: str) -> None:  # type: ignore[no-untyped-def]
    url = pandas_server.grpc_url if protocol == "grpc" else pandas_server.http_url
    found = example_client.score(url, protocol)
    outputs = found["outputs"]
    assert outputs["applicant"].tolist() == [b"Joanne", b"Michael", "Zo\u00eb".encode()]
    np.testing.assert_allclose(outputs["debt_ratio"], [4000 / 52000, 21000 / 31000, 12000 / 87000])
    assert outputs["tenure_years"].dtype == np.float64
    assert 0.1 < outputs["tenure_years"][1] < 0.2  # 2024-11-15 .. 2025-01-01
    assert outputs["score"].dtype == np.float32
    assert outputs["decision"].tolist() == [b"approve", b"review", b"approve"]
    assert found["content_types"] == {
        "applicant": "str", "debt_ratio": "np", "tenure_years": "np", "score": "np", "decision": "str"
    }


def test_pandas_pipeline_batches_concurrent_requests(pandas_server: ServerProcess, example_client) -> None:  # type: ignore[no-untyped-def]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: example_client.score(pandas_server.grpc_url)["outputs"], range(16)))
    for outputs in results:  # each request gets back exactly its own three rows
        assert outputs["decision"].tolist() == [b"approve", b"review", b"approve"]
    client = grpcclient.InferenceServerClient(pandas_server.grpc_url)
    stats = client.get_inference_statistics("loan_scorer", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 48


def test_pandas_pipeline_rejects_bad_rows(pandas_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(pandas_server.grpc_url)

    def tensor(name: str, values: list) -> grpcclient.InferInput:
        array = np.array(values, dtype=object if isinstance(values[0], bytes) else np.float64)
        inp = grpcclient.InferInput(name, [len(values)], "BYTES" if array.dtype == object else "FP64")
        inp.set_data_from_numpy(array)
        return inp

    good_date = [b"2020-01-01"]
    with pytest.raises(InferenceServerException, match="income must be positive"):
        client.infer("loan_scorer", [tensor("applicant", [b"a"]), tensor("income", [0.0]), tensor("debt", [1.0]),
                                     tensor("customer_since", good_date)])
    with pytest.raises(InferenceServerException, match="input 'customer_since'.*ISO 8601"):
        client.infer("loan_scorer", [tensor("applicant", [b"a"]), tensor("income", [1.0]), tensor("debt", [1.0]),
                                     tensor("customer_since", [b"last spring"])])


def test_example_client_script_runs(pandas_server: ServerProcess) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "client.py"), "--url", pandas_server.grpc_url],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "Michael" in out.stdout and "review" in out.stdout


TOKENS = Path(__file__).resolve().parents[2] / "examples" / "token_stream"


@pytest.mark.timeout(240)  # a server and a client process: slow on a loaded machine
def test_token_stream_example_streams_each_word(tmp_path: Path, grpc_frontend: str) -> None:
    root = tmp_path / "repository"
    shutil.copytree(TOKENS / "repository", root)
    with ServerProcess(root, grpc_frontend=grpc_frontend) as proc:
        out = subprocess.run(
            [sys.executable, str(TOKENS / "client.py"), "--url", proc.grpc_url, "--text", "one two  three"],
            capture_output=True, text=True, timeout=150,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["one", "two", "three", ""]

TESTING_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "testing_your_model"


def test_the_testing_example_passes_under_pytest(tmp_path: Path) -> None:
    # the README's "Testing your model" example, run as a user runs it: pytest on the example folder
    copy = tmp_path / "testing_your_model"
    shutil.copytree(TESTING_EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(copy), str(copy)],
        capture_output=True, text=True, timeout=110, cwd=copy,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout, out.stdout


def test_the_readme_shows_the_testing_example_as_it_is() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in ("test_word_count.py", "repository/word_count/1/model.py"):
        source = (TESTING_EXAMPLE / name).read_text()
        body = source.split('"""', 2)[2].lstrip("\n") if source.startswith('"""') else source
        assert body in readme, f"README.md's 'Testing your model' no longer shows {name} as it is"

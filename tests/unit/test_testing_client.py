"""``fastoip.testing.InProcessClient``: users' models called through the Core, no server, no socket."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

import fastoip
from fastoip.demo import write_repository
from fastoip.errors import InferenceError, InvalidArgument, NotFound, Unavailable
from fastoip.testing import InProcessClient
from fastoip.types import InferInput
from python_models import BATCHED_CONFIG, BROKEN_LOAD, DOUBLER, INT_IO, MISBEHAVE, write_python_model

pytestmark = pytest.mark.timeout(120)

GREETER = """
    import fastoip

    class Greeter(fastoip.Model):
        def predict(self, frame):
            return frame.assign(greeting="Hello " + frame["name"])[["greeting"]]
"""

GREETER_SETTINGS = """
    {"name": "greeter", "parameters": {"content_type": "pd"},
     "inputs": [{"name": "name", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "str"}}],
     "outputs": [{"name": "greeting", "datatype": "BYTES", "shape": [-1]}]}
"""

#: The doubler's config without its 0.5 s batching delay (one request at a time here).
BATCHED = BATCHED_CONFIG.split("dynamic_batching")[0]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("inprocess") / "repository", ["simple"])
    write_python_model(root, "doubler", DOUBLER, BATCHED)
    write_python_model(root, "misbehave", MISBEHAVE, INT_IO)
    greeter = write_python_model(root, "greeter", GREETER)
    (greeter / "model-settings.json").write_text(textwrap.dedent(GREETER_SETTINGS))
    return root


@pytest.fixture(scope="module")
def client(repository: Path):  # type: ignore[no-untyped-def]
    with InProcessClient(repository) as client:
        yield client


def test_onnx_model_with_numpy_arrays(client: InProcessClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    outputs = client.infer("simple", {"INPUT0": a, "INPUT1": np.ones_like(a)})
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + 1)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - 1)
    only = client.infer("simple", {"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT1"])
    assert list(only) == ["OUTPUT1"]


def test_plain_values_take_the_declared_datatype(client: InProcessClient) -> None:
    outputs = client.infer("doubler", {"INPUT0": [[1, 2, 3, 4], [5, 6, 7, 8]]})
    assert outputs["OUTPUT0"].dtype == np.float32
    assert outputs["OUTPUT0"].tolist() == [[2, 4, 6, 8], [10, 12, 14, 16]]


def test_an_array_is_sent_as_it_is_and_the_model_checks_it(client: InProcessClient) -> None:
    with pytest.raises(InvalidArgument, match="INPUT0.*FP32.*FP64|FP64.*FP32"):
        client.infer("doubler", {"INPUT0": np.ones((1, 4))})  # float64, as a real client would send it


def test_content_types_strings_and_parameters(client: InProcessClient) -> None:
    response = client.infer_response("greeter", {"name": ["Ada", "Zoë"]})
    (greeting,) = response.outputs
    assert greeting.data.tolist() == [b"Hello Ada", "Hello Zoë".encode()]
    assert greeting.parameters.get("content_type") == "str"
    tensor = InferInput("X", "INT32", (2,), np.array([4, 5], dtype=np.int32))
    assert client.infer("misbehave", {"X": tensor}, parameters={"mode": "wide"})["OUT"].tolist() == [12, 15]


def test_errors_are_the_projects_own(client: InProcessClient) -> None:
    with pytest.raises(NotFound, match="'nope'"):
        client.infer("nope", {"X": [1]})
    with pytest.raises(InvalidArgument, match="X must be positive"):
        client.infer("misbehave", {"X": [1]}, parameters={"mode": "invalid"})
    with pytest.raises(InferenceError, match="boom"):
        client.infer("misbehave", {"X": [1]}, parameters={"mode": "crash"})
    with pytest.raises(InvalidArgument, match="cannot make INT32 data"):
        client.infer("misbehave", {"X": ["one"]})


def test_metadata_config_statistics(client: InProcessClient) -> None:
    assert client.is_model_ready("simple")
    assert [t.name for t in client.model_metadata("simple").inputs] == ["INPUT0", "INPUT1"]
    assert client.model_config("doubler")["max_batch_size"] == 16
    client.infer("simple", {"INPUT0": np.zeros((1, 16), np.int32), "INPUT1": np.zeros((1, 16), np.int32)})
    (stats,) = client.statistics("simple")
    assert stats.inference_stats.success.count >= 1
    assert {entry.name for entry in client.repository_index()} == {"simple", "doubler", "misbehave", "greeter"}


def test_a_model_that_does_not_load_is_named(tmp_path: Path) -> None:
    write_python_model(tmp_path, "broken", BROKEN_LOAD, INT_IO)
    write_python_model(tmp_path, "fine", MISBEHAVE, INT_IO)
    with pytest.raises(Unavailable, match="model 'broken' is UNAVAILABLE.*no weights here"):
        InProcessClient(tmp_path)
    with InProcessClient(tmp_path, require_ready=False) as client:
        assert not client.is_model_ready("broken")
        assert "no weights here" in client.model_not_ready_reason("broken")
        assert client.infer("fine", {"X": [7]})["OUT"].tolist() == [7]


def test_only_the_models_asked_for_and_reload(tmp_path: Path) -> None:
    write_python_model(tmp_path, "broken", BROKEN_LOAD, INT_IO)
    model_dir = write_python_model(tmp_path, "fine", MISBEHAVE, INT_IO)
    with InProcessClient(tmp_path, models=["fine"]) as client:
        assert client.infer("fine", {"X": [2]}, parameters={"mode": "wide"})["OUT"].tolist() == [6]
        assert not client.is_model_ready("broken")
        source = (model_dir / "1" / "model.py").read_text().replace("* 3", "* 4")
        (model_dir / "1" / "model.py").write_text(source)
        client.load_model("fine")  # picks up the edited model.py
        assert client.infer("fine", {"X": [2]}, parameters={"mode": "wide"})["OUT"].tolist() == [8]
        client.unload_model("fine")
        with pytest.raises(fastoip.Unavailable):
            client.infer("fine", {"X": [2]})


def test_a_missing_repository_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere' is not a directory"):
        InProcessClient(tmp_path / "nowhere")

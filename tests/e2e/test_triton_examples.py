"""What Triton's Python client examples check, done with our own client calls against a real fastoip.

Each test follows one example of ``triton-inference-server/client`` (``src/python/examples``) with ONNX
stand-ins built here: the health/metadata example (server started with ``--id triton``), the model-control
example, and the image-classification client (an NCHW image model with a labelled class output).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, image_model_bytes, write_model
from serverproc import ServerProcess

CLASSES = [f"class_{i}" for i in range(10)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    write_model(root, "simple", identity_model_bytes(TensorProto.INT32, [16]), config="max_batch_size: 8\n")
    write_model(root, "other", identity_model_bytes(TensorProto.FLOAT, [4]))
    write_model(
        root,
        "image",
        image_model_bytes(),
        config=(
            "max_batch_size: 4\n"
            'input { name: "INPUT" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 8, 8] }\n'
            'output { name: "OUTPUT" data_type: TYPE_FP32 dims: [10] label_filename: "labels.txt" }\n'
        ),
    )
    (root / "image" / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    return root


# -- simple_grpc_health_metadata.py / simple_http_health_metadata.py -------------------------
def test_health_metadata_example_with_id_triton(repo: Path) -> None:
    with ServerProcess(repo, "--id", "triton", http=True) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_live(headers={"test": "1", "dummy": "2"})
        assert client.is_server_ready() and client.is_model_ready("simple")
        assert client.get_server_metadata().name == "triton"
        assert client.get_model_metadata("simple", headers={"test": "1"}).name == "simple"
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata("wrong_model_name")
        assert "Request for unknown model" in err.value.message()
        assert client.get_model_config("simple").config.name == "simple"

        http = httpclient.InferenceServerClient(server.http_url)
        assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("simple")
        assert http.get_server_metadata()["name"] == "triton"
        with pytest.raises(InferenceServerException) as err:
            http.get_model_metadata("wrong_model_name")
        assert "Request for unknown model" in err.value.message()


# -- simple_grpc_model_control.py ------------------------------------------------------------
def test_model_control_example(repo: Path) -> None:
    with ServerProcess(repo, "--model-control-mode=explicit") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert len(client.get_model_repository_index().models) == 3  # every model directory, loaded or not
        client.load_model("simple")
        assert client.is_model_ready("simple")

        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert "failed to load" in err.value.message()

        client.load_model("simple", config='{"max_batch_size":"16"}')
        assert client.get_model_config("simple").config.max_batch_size == 16

        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        assert client.is_server_ready()  # unloaded on purpose: readiness as Triton's IsReady

        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        # a name no file system takes fails the write: INTERNAL with Triton's words, as Triton's example expects
        assert err.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in err.value.message()
        assert str(repo) not in err.value.message() and "/tmp" not in err.value.message()
        assert client.is_server_live()

        with pytest.raises(InferenceServerException) as err:
            client.load_model("wrong_model_name")
        assert "failed to load" in err.value.message()
        # ... and it left nothing behind: not in the index, readiness unchanged
        names = [model.name for model in client.get_model_repository_index().models]
        assert "wrong_model_name" not in names and len(names) == 3
        assert client.is_server_ready()


# -- image_client.py (-m image -c 3 -s NONE), both protocols ---------------------------------
def _parse_model(metadata: dict, config: dict) -> tuple[int, str, str, int, int, int]:
    """The checks image_client.py makes on the model before sending anything."""
    assert len(metadata["inputs"]) == 1 and len(metadata["outputs"]) == 1
    assert len(config["input"]) == 1
    output = metadata["outputs"][0]
    assert output["datatype"] == "FP32"
    batching = config["max_batch_size"] > 0
    assert sum(1 for dim in output["shape"][1 if batching else 0:] if int(dim) > 1) == 1  # a vector
    assert len(metadata["inputs"][0]["shape"]) == (4 if batching else 3)
    fmt = config["input"][0]["format"]
    assert (mc.ModelInput.Format.Value(fmt) if isinstance(fmt, str) else fmt) == mc.ModelInput.FORMAT_NCHW
    c, h, w = (int(d) for d in metadata["inputs"][0]["shape"][1:])
    return config["max_batch_size"], metadata["inputs"][0]["name"], output["name"], c, h, w


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_client_example(repo: Path, protocol: str) -> None:
    with ServerProcess(repo, http=True) as server:
        if protocol == "grpc":
            module = grpcclient
            client = grpcclient.InferenceServerClient(server.grpc_url)
            metadata = client.get_model_metadata("image", as_json=True)
            config = client.get_model_config("image", as_json=True)["config"]
            config["max_batch_size"] = int(config["max_batch_size"])
        else:
            module = httpclient  # type: ignore[assignment]
            client = httpclient.InferenceServerClient(server.http_url)  # type: ignore[assignment]
            metadata = client.get_model_metadata("image")
            config = client.get_model_config("image")
        max_batch, input_name, output_name, c, h, w = _parse_model(metadata, config)
        assert max_batch == 4
        # Two "images" (HWC uint8 turned CHW float, as the example's preprocess with scaling NONE).
        rng = np.random.default_rng(3)
        images = [rng.integers(0, 255, (h, w, c), dtype=np.uint8) for _ in range(2)]
        batch = np.stack([np.transpose(img.astype(np.float32), (2, 0, 1)) for img in images])
        tensor = module.InferInput(input_name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = client.infer("image", [tensor], outputs=[module.InferRequestedOutput(output_name, class_count=3)])
        output = result.as_numpy(output_name)
        assert output.shape == (2, 3)
        weights = np.arange(30, dtype=np.float32).reshape(3, 10) / 10.0
        for image, row in zip(batch, output, strict=True):
            scores = image.mean(axis=(1, 2)) @ weights
            expected = np.argsort(-scores, kind="stable")[:3]
            parsed = ["".join(chr(x) for x in entry).split(":") for entry in row]  # as the example parses them
            assert [int(index) for _, index, _ in parsed] == expected.tolist()
            assert [label for _, _, label in parsed] == [CLASSES[i] for i in expected]
            np.testing.assert_allclose([float(value) for value, _, _ in parsed], scores[expected], rtol=1e-5)

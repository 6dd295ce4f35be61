"""The classification extension: top-N classes of an output, with labels, over gRPC and HTTP (JSON and binary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip.classification import class_count, top_classes
from fastoip.core import Core
from fastoip.errors import InvalidArgument
from fastoip.repository import RepositoryOptions
from fastoip.types import InferInput, InferRequest, RequestedOutput
from models import V2_TO_ONNX, identity_model_bytes, write_model
from serverproc import ServerProcess

LABELS = ["zero", "one", "", "three"]  # index 2 has an empty label: Triton then sends no label


def _repository(root: Path) -> Path:
    write_model(
        root,
        "scores",
        identity_model_bytes(TensorProto.FLOAT, [4]),
        config='max_batch_size: 8\n'
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }\n'
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] label_filename: "labels.txt" }\n',
    )
    (root / "scores" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_model(root, "flat", identity_model_bytes(TensorProto.INT32, [5], batch=False))
    write_model(root, "half", identity_model_bytes(TensorProto.FLOAT16, [4]))
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("classification"))


@pytest.fixture(scope="module")
def core(repo: Path):  # type: ignore[no-untyped-def]
    core = Core(repo, RepositoryOptions(use_gpu=False))
    core.load_models()
    yield core
    core.close()


def _infer(core: Core, model: str, data: np.ndarray, datatype: str, count: object) -> np.ndarray:
    request = InferRequest(
        model,
        inputs=[InferInput("INPUT0", datatype, data.shape, data)],
        outputs=[RequestedOutput("OUTPUT0", {"classification": count})],
    )
    out = core.infer(request).output("OUTPUT0")
    assert out.datatype == "BYTES"
    assert out.data is not None and tuple(out.shape) == out.data.shape
    return out.data


def test_batched_output_gives_one_row_of_classes_per_batch_item_with_labels(core: Core) -> None:
    data = np.array([[0.1, 0.9, 0.5, 0.2], [4.0, 3.0, 2.0, 1.0]], dtype=np.float32)
    classes = _infer(core, "scores", data, "FP32", 3)
    assert classes.shape == (2, 3)
    assert classes[0].tolist() == [b"0.900000:1:one", b"0.500000:2", b"0.200000:3:three"]
    assert classes[1].tolist() == [b"4.000000:0:zero", b"3.000000:1:one", b"2.000000:2"]


def test_count_above_the_class_count_is_cut_to_the_classes(core: Core) -> None:
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)
    assert _infer(core, "scores", data, "FP32", 10).shape == (1, 4)


def test_model_without_batching_gives_a_flat_list_and_integers_print_as_integers(core: Core) -> None:
    data = np.array([7, -3, 7, 12, 0], dtype=np.int32)
    classes = _infer(core, "flat", data, "INT32", 3)
    # ties keep index order; no label file: "value:index"
    assert classes.tolist() == [b"12:3", b"7:0", b"7:2"]


def test_zero_means_no_classification(core: Core) -> None:
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)
    request = InferRequest("scores", inputs=[InferInput("INPUT0", "FP32", data.shape, data)],
                           outputs=[RequestedOutput("OUTPUT0", {"classification": 0})])
    out = core.infer(request).output("OUTPUT0")
    assert out.datatype == "FP32" and out.data is not None
    np.testing.assert_array_equal(out.data, data)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (-1, "expected >= 0"),
        ("3", "expected int64_param"),
        (True, "expected int64_param"),
    ],
)
def test_bad_counts_are_refused_with_tritons_words(core: Core, value: object, words: str) -> None:
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)
    with pytest.raises(InvalidArgument, match=words):
        _infer(core, "scores", data, "FP32", value)


def test_fp16_is_refused_as_triton_does(core: Core) -> None:
    data = np.array([[1, 2, 3, 4]], dtype=np.float16)
    with pytest.raises(InvalidArgument, match="class result not available for output due to unsupported type 'FP16'"):
        _infer(core, "half", data, "FP16", 2)


def test_shared_memory_output_with_classification_is_refused() -> None:
    wanted = RequestedOutput("OUT", {"classification": 2, "shared_memory_region": "r"})
    with pytest.raises(InvalidArgument, match="can't set both 'shared_memory_region' and 'classification'"):
        class_count(wanted, "FP32")


@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT64", "FP64"])
def test_every_integer_and_float_type_classifies(datatype: str) -> None:
    assert datatype in V2_TO_ONNX
    values = np.array([3, 9, 1], dtype=np.dtype(datatype.lower().replace("fp", "float")))
    expected = [b"9.000000:1", b"3.000000:0"] if datatype == "FP64" else [b"9:1", b"3:0"]
    assert top_classes(values, 2, ["a"]) == [expected[0], expected[1] + b":a"]


@pytest.mark.parametrize("datatype", ["BOOL", "BF16", "BYTES"])
def test_types_triton_does_not_classify_are_refused(datatype: str) -> None:
    with pytest.raises(InvalidArgument, match=f"unsupported type '{datatype}'"):
        class_count(RequestedOutput("OUT", {"classification": 1}), datatype)


def test_label_file_outside_the_model_directory_is_refused_at_load(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "escape",
        identity_model_bytes(TensorProto.FLOAT, [4]),
        config='max_batch_size: 8\noutput { name: "OUTPUT0" dims: [4] label_filename: "../labels.txt" }\n',
    )
    core = Core(tmp_path, RepositoryOptions(use_gpu=False))
    core.load_models()
    try:
        [entry] = core.repository_index()
        assert entry.state == "UNAVAILABLE"
        assert "label_filename '../labels.txt' must be a file inside the model directory" in entry.reason
    finally:
        core.close()


# -- real clients over the wire ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo, http=True) as proc:
        yield proc


def test_grpc_client_class_count(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert "classification" in client.get_server_metadata(as_json=True)["extensions"]
    data = np.array([[0.1, 0.9, 0.5, 0.2]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("scores", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"0.900000:1:one", b"0.500000:2"]]


@pytest.mark.parametrize("binary", [True, False])
def test_http_client_class_count_binary_and_json(server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.array([7, -3, 7, 12, 0], dtype=np.int32)
    tensor = httpclient.InferInput("INPUT0", [5], "INT32")
    tensor.set_data_from_numpy(data)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
    result = client.infer("flat", [tensor], outputs=[wanted])
    classes = result.as_numpy("OUTPUT0")
    assert [c if isinstance(c, bytes) else c.encode() for c in classes.tolist()] == [b"12:3", b"7:0"]


def test_http_fp16_classification_is_a_400(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP16")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float16))
    with pytest.raises(InferenceServerException, match="class result not available") as err:
        client.infer("half", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert err.value.status() == "400"

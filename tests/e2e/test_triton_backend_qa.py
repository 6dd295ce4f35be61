"""What Triton's own Python-backend QA (qa/L0_backend_python) checks, each as a test of its own (issue 41).

No Triton file is needed: each model here is written for the behaviour it checks, after reading
python_backend's pb_stub.cc / python_be.cc for the semantics.  One real fastoip serves them; tritonclient
drives it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

IDENTITY_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
"""


def write_model(root: Path, name: str, files: dict[str, str], extra: str = "") -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, source in files.items():
        (folder / file_name).write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_CONFIG.format(name=name, extra=extra)))


# python_backend's stub imports "<version>.model" with the version folder on sys.path: a helper beside model.py
# imports absolutely and relatively (Triton's multi_file model), and the model's own file imports again as
# "model" at execute time (Triton's QA models run unittest.main("model")).
MULTI_FILE = {
    "helper_abs.py": 'WORD = "absolute"\n',
    "helper_rel.py": 'WORD = "relative"\n',
    "model.py": """
        import helper_abs
        import triton_python_backend_utils as pb_utils
        import numpy as np

        from . import helper_rel

        MARK = np.float32(7)

        class TritonPythonModel:
            def initialize(self, args):
                if helper_abs.WORD != "absolute" or helper_rel.WORD != "relative":
                    raise pb_utils.TritonModelException("imports beside model.py do not work")

            def execute(self, requests):
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + MARK)]))
                return out
    """,
}
SELF_IMPORT = {
    "model.py": """
        import triton_python_backend_utils as pb_utils
        import numpy as np

        MARK = np.float32(5)

        class TritonPythonModel:
            def execute(self, requests):
                import model
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + model.MARK)]))
                return out
    """,
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_qa")
    write_model(root, "multi_file", MULTI_FILE)
    write_model(root, "self_import", SELF_IMPORT)
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo, http=True, metrics=True) as proc:
        yield proc


def _input(values: list[float]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return [tensor]


def test_model_file_imports_files_beside_it_and_itself_as_model(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("multi_file")
    result = client.infer("multi_file", _input([1.0, 2.0]))
    assert result.as_numpy("OUTPUT0").tolist() == [8.0, 9.0]
    result = client.infer("self_import", _input([1.0]))
    assert result.as_numpy("OUTPUT0").tolist() == [6.0]

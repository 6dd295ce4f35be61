"""python_backend behaviours of a model's worker that Triton's own QA reads (issue 41, the "qaworker" items).

Each model here is written for the behaviour it checks, after python_backend's request_executor.cc, pb_stub.cc
and python_be.cc, and Triton core's sequence batcher; no Triton file is needed.  One real fastoip serves them;
tritonclient drives it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

FP32_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
"""
DECOUPLED = "model_transaction_policy { decoupled: true }"
IN_PROCESS = 'parameters { key: "hosting" value: { string_value: "in_process" } }'


def write_model(root: Path, name: str, source: str, extra: str = "", config: str = FP32_CONFIG) -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config.format(name=name, extra=extra)))


def _input(values: list[float]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return [tensor]


# -- item 1: exec(decoupled=True)'s empty last response ----------------------------------------------------------
# A decoupled model that sends INPUT0[0] responses, then its final flag: alone (python_backend's square example),
# or with its last response (INPUT0[1] == 1).
REPEATER = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                sender = request.get_response_sender()
                count, final_with_last = int(x[0]), len(x) > 1 and x[1] == 1
                for i in range(count):
                    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])
                    if final_with_last and i == count - 1:
                        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        sender.send(response)
                if not final_with_last:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""
# Counts what exec(decoupled=True) yields into {target}: [responses, responses without outputs, last is empty].
BLS_COUNTS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                call = pb_utils.InferenceRequest(model_name="{target}", requested_output_names=["OUTPUT0"],
                                                 inputs=[pb_utils.Tensor("INPUT0", x)])
                responses = list(call.exec(decoupled=True))
                empty = [r for r in responses if not r.output_tensors() and not r.has_error()]
                last_empty = float(bool(responses) and not responses[-1].output_tensors())
                counted = np.array([len(responses), len(empty), last_empty], dtype=np.float32)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", counted)]))
            return out
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_worker")
    write_model(root, "repeater", REPEATER, DECOUPLED)
    write_model(root, "repeater_in_process", REPEATER, DECOUPLED + "\n" + IN_PROCESS)
    write_model(root, "bls_counts", BLS_COUNTS.replace("{target}", "repeater"))
    write_model(root, "bls_counts_in_process", BLS_COUNTS.replace("{target}", "repeater_in_process"), IN_PROCESS)
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo) as proc:
        yield proc


@pytest.mark.parametrize("model", ["bls_counts", "bls_counts_in_process"])
def test_decoupled_bls_iterator_yields_tritons_empty_last_response_for_a_final_flag_alone(
    server: ServerProcess, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # two responses, then the final flag alone: Triton's iterator yields three, the last one empty
    assert client.infer(model, _input([2.0, 0.0])).as_numpy("OUTPUT0").tolist() == [3.0, 1.0, 1.0]
    # no response at all, only the final flag: one empty response
    assert client.infer(model, _input([0.0, 0.0])).as_numpy("OUTPUT0").tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("model", ["bls_counts", "bls_counts_in_process"])
def test_decoupled_bls_iterator_ends_with_the_last_response_when_the_final_flag_came_with_it(
    server: ServerProcess, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # three responses, the last one carrying the final flag: no empty response after it (as in Triton)
    assert client.infer(model, _input([3.0, 1.0])).as_numpy("OUTPUT0").tolist() == [3.0, 0.0, 0.0]

"""Triton Python models in embedded servers: two ``fastoip.Server`` objects in one process, each model's BLS
calls going to the server that loaded it (not to the one built last)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import fastoip
from test_triton_python_backend import write_python_model

pytestmark = pytest.mark.timeout(120)

# "whoami": answers the number its repository was written with.
WHOAMI = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([{number}], dtype=np.int32))])
                    for _ in requests]
"""

# BLS into "whoami" of the same repository (sync exec, from execute).
ASK = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                inner = pb_utils.InferenceRequest(model_name="whoami", inputs=[request.inputs()[0]],
                                                  requested_output_names=["Y"])
                answer = inner.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "Y")]))
            return out
"""

CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

IN_PROCESS = CONFIG + """
    parameters { key: "hosting" value: { string_value: "in_process" } }
"""


def write_repository(root: Path, number: int) -> Path:
    write_python_model(root, "whoami", WHOAMI.replace("{number}", str(number)), CONFIG)
    write_python_model(root, "ask", ASK, CONFIG)  # a worker process
    write_python_model(root, "ask_in_process", ASK, IN_PROCESS)  # in the server process
    return root


def ask(server: fastoip.Server, model: str) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))
    return int(client.infer(model, [x]).as_numpy("Y")[0])


def test_two_embedded_servers_each_get_their_own_bls_calls(tmp_path: Path) -> None:
    first = write_repository(tmp_path / "first", 1)
    second = write_repository(tmp_path / "second", 2)
    with fastoip.Server(first, http=False) as one, fastoip.Server(second, http=False) as two:
        for model in ("ask", "ask_in_process"):
            assert ask(one, model) == 1, model  # the first server's whoami, though the second was built last
            assert ask(two, model) == 2, model
        client = grpcclient.InferenceServerClient(one.grpc_url)
        stats = client.get_inference_statistics("whoami").model_stats
        assert sum(s.inference_stats.success.count for s in stats) == 2  # both inner requests counted here

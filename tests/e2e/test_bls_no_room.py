"""A BLS call whose input finds no room in shared memory (issue 41; Triton's bls_memory QA on its 1 GB /dev/shm;
here the room is ``--python-shm-pool-total``, since the segments are memfds, not /dev/shm files):
python_backend answers it with an error response, "Failed to increase the shared memory pool size", for
``exec()`` and for ``exec(decoupled=True)`` alike (there: the iterator's one response, then StopIteration). Before,
the decoupled call raised SharedMemoryFull out of ``exec`` and failed the calling model's whole request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(240)

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""

CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        said = []
        for decoupled in (False, True):
            big = pb_utils.Tensor("IN", np.ones(96 * 1024 * 1024, dtype=np.uint8))  # more than the 64 MiB pool
            request = pb_utils.InferenceRequest(model_name="py_identity", inputs=[big], requested_output_names=["OUT"])
            if decoupled:
                responses = request.exec(decoupled=True)
                response = next(responses)
                ended = next(responses, None) is None
            else:
                response, ended = request.exec(), True
            said.append(f"{response.error().message() if response.has_error() else 'no error'} ended={ended}")
        small = pb_utils.Tensor("IN", np.ones(16, dtype=np.uint8))  # and the next call goes through
        answer = pb_utils.InferenceRequest(model_name="py_identity", inputs=[small], requested_output_names=["OUT"])
        said.append(str(int(pb_utils.get_output_tensor_by_name(answer.exec(), "OUT").as_numpy().sum())))
        out = np.array([s.encode() for s in said], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SAID", out)]) for _ in requests]
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""

CALLER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_UINT8 dims: [ 1 ] } ]
output [ { name: "SAID" data_type: TYPE_STRING dims: [ 3 ] } ]
"""


def test_a_bls_call_without_room_is_an_error_response_in_both_modes(tmp_path: Path) -> None:
    for name, model, config in (("py_identity", IDENTITY, CONFIG), ("caller", CALLER, CALLER_CONFIG)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(model)
        (tmp_path / name / "config.pbtxt").write_text(config)
    proc = ServerProcess(tmp_path, "--python-shm-pool-total", str(64 * 1024 * 1024))
    proc.__enter__()
    try:
        client = grpcclient.InferenceServerClient(proc.grpc_url)
        x = grpcclient.InferInput("X", [1], "UINT8")
        x.set_data_from_numpy(np.zeros(1, dtype=np.uint8))
        said = [s.decode() for s in client.infer("caller", [x], client_timeout=180).as_numpy("SAID")]
        for outcome in said[:2]:
            assert "Failed to increase the shared memory pool size" in outcome and outcome.endswith("ended=True")
        assert said[2] == "16"
    finally:
        proc.__exit__(None, None, None)

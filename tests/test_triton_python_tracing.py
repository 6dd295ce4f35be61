"""A Python model's BLS request made with ``trace=request.trace()`` is traced as the child of the model's own
request (Triton's child traces: ``parent_id`` in the trace file), through a real server and tritonclient."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess, wait_until
from test_triton_python_backend import ADD_SUB, ADD_SUB_CONFIG, _add_sub_inputs, write_python_model

pytestmark = pytest.mark.timeout(120)

# BLS into add_sub twice: once with the request's trace (a child trace), once without (traced on its own terms).
BLS_TRACED = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
                child = pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs, request_id="child",
                                                  requested_output_names=["OUTPUT0", "OUTPUT1"],
                                                  trace=request.trace())
                answer = child.exec()
                assert request.trace().get_context() is None  # Triton mode: no W3C context
                pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs, request_id="untraced",
                                          requested_output_names=["OUTPUT0"]).exec()
                out.append(pb_utils.InferenceResponse(answer.output_tensors()))
            return out
"""


def test_bls_request_with_the_request_trace_is_its_child(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    write_python_model(root, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
    write_python_model(root, "bls_traced", BLS_TRACED, ADD_SUB_CONFIG.replace('"add_sub"', '"bls_traced"'))
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--trace-config", "count=-1"]
    with ServerProcess(root, *args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.update_trace_settings("add_sub", {"trace_rate": "1000000"})  # add_sub's own requests: not sampled
        a = np.arange(4, dtype=np.float32)
        result = client.infer("bls_traced", _add_sub_inputs(a, a), request_id="outer")
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a)

        def heads() -> list[dict]:
            try:
                return [e for e in json.loads(trace_file.read_text()) if "model_name" in e]
            except (OSError, ValueError):
                return []

        assert wait_until(lambda: len(heads()) >= 2, timeout=20)
    by_request = {entry.get("request_id"): entry for entry in heads()}
    outer, child = by_request["outer"], by_request["child"]
    assert outer["model_name"] == "bls_traced" and "parent_id" not in outer
    assert child["model_name"] == "add_sub" and child["parent_id"] == outer["id"]
    assert "untraced" not in by_request  # sampled as any request of add_sub's (1 in a million)

"""A model's custom metrics with bad names, end to end (issue 36 item 5): the model gets a clear error, the scrape
stays whole, and no label can forge another family's line."""

from __future__ import annotations

import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

FORGING = 'a="1"} 1\\nnv_inference_request_success{model="victim",version="1"} 999999\\n# x{b'


class TritonPythonModel:
    def execute(self, requests):
        said = []
        for make in (
            lambda: pb_utils.MetricFamily("bad-name", "d", pb_utils.MetricFamily.COUNTER),
            lambda: pb_utils.MetricFamily("good_total", "d", pb_utils.MetricFamily.COUNTER).Metric(
                labels={FORGING: "v"}),
        ):
            try:
                make()
                said.append("accepted")
            except pb_utils.TritonModelException as exc:
                said.append(exc.message())
        family = pb_utils.MetricFamily("good_total", "d", pb_utils.MetricFamily.COUNTER)
        family.Metric(labels={"k": "v"}).increment(1)
        try:  # the server refuses it at once, through the worker's call (as Triton's MetricFamily does)
            pb_utils.MetricFamily("good_total", "d", pb_utils.MetricFamily.GAUGE)
            said.append("accepted")
        except pb_utils.TritonModelException as exc:
            said.append(exc.message())
        out = np.array([s.encode() for s in said], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SAID", out)]) for _ in requests]
'''

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SAID" data_type: TYPE_STRING dims: [ 3 ] } ]
"""


def test_bad_metric_names_are_refused_to_the_model_and_the_scrape_stays_whole(tmp_path: Path) -> None:
    (tmp_path / "metered" / "1").mkdir(parents=True)
    (tmp_path / "metered" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "metered" / "config.pbtxt").write_text(CONFIG)
    with ServerProcess(tmp_path, metrics=True) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        said = [s.decode() for s in client.infer("metered", [x]).as_numpy("SAID")]
        assert "invalid metric name 'bad-name'" in said[0]
        assert "invalid label name" in said[1]
        assert "already exists with another kind" in said[2]
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}  # the whole scrape parses
        assert "good" in families or "good_total" in families
        success = families["nv_inference_request_success"].samples
        assert {s.labels["model"] for s in success} == {"metered"}  # no forged 'victim' line
        assert all(s.value < 999999 for s in success)

"""Model warmup (Triton's model_warmup): run at load before READY; a failing warmup fails the load.

Warm-up happens inside the repository's load, below every frontend: the Core is driven in-process
(tests/harness.py, real ONNX Runtime); what the frontends make of readiness, statistics and the index is
tested with them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto

from harness import core_on
from models import identity_model_bytes

WARMUP = """
max_batch_size: 4
model_warmup [ {{ name: "{name}" batch_size: 2 count: 3
  inputs {{ key: "{input}" value: {{ data_type: TYPE_FP32 dims: [ 4 ] {data} }} }} }} ]
"""


def write(root: Path, name: str, warmup: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(identity_model_bytes(TensorProto.FLOAT, [4], name="identity"))
    (root / name / "config.pbtxt").write_text(warmup)


def test_warmup_runs_before_ready_and_a_bad_warmup_fails_the_load(tmp_path: Path) -> None:
    write(tmp_path, "zeros", WARMUP.format(name="zeros", input="INPUT0", data="zero_data: true"))
    write(tmp_path, "fromfile", WARMUP.format(name="file", input="INPUT0", data='input_data_file: "raw.bin"'))
    (tmp_path / "fromfile" / "warmup").mkdir()
    (tmp_path / "fromfile" / "warmup" / "raw.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    write(tmp_path, "wrongname", WARMUP.format(name="oops", input="NOPE", data="random_data: true"))
    write(tmp_path, "escapes", WARMUP.format(name="esc", input="INPUT0", data='input_data_file: "../../etc"'))
    with core_on(tmp_path, strict_readiness=False) as core:
        assert core.model_ready("zeros") and core.model_ready("fromfile")
        (stats,) = core.statistics("zeros")
        assert stats.inference_count == 0 and stats.execution_count == 0  # warm-up is not traffic
        index = {m.name: m for m in core.repository_index()}
        assert index["wrongname"].state == "UNAVAILABLE"
        assert "model_warmup 'oops' failed" in index["wrongname"].reason
        assert "NOPE" in index["wrongname"].reason
        assert index["escapes"].state == "UNAVAILABLE"
        assert "is not a file in the model's 'warmup' folder" in index["escapes"].reason

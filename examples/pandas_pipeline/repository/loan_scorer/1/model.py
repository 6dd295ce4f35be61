"""A pandas feature pipeline in front of an ONNX model, served by fastoip.

The request arrives as a DataFrame (request-level content type ``pd`` set in
model-settings.json), with ``applicant`` decoded as str and
``customer_since`` as datetime.  predict derives two features with pandas,
scores them with a small logistic regression run by onnxruntime, and returns
a DataFrame: fastoip sends one output per column, each with its content type.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pandas as pd
from onnx import TensorProto, helper, numpy_helper

import fastoip

#: Logistic regression over [debt_ratio, tenure_years]: more debt lowers the score, tenure raises it.
WEIGHTS = np.array([[-4.0], [0.35]], dtype=np.float32)
BIAS = np.array([0.8], dtype=np.float32)


def logistic_regression_onnx() -> bytes:
    """FEATURES FP32 [batch, 2] -> SCORE FP32 [batch, 1] = sigmoid(FEATURES @ W + b)."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["FEATURES", "W"], ["logit0"]),
            helper.make_node("Add", ["logit0", "B"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["SCORE"]),
        ],
        "loan_scorer",
        [helper.make_tensor_value_info("FEATURES", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("SCORE", TensorProto.FLOAT, ["batch", 1])],
        initializer=[numpy_helper.from_array(WEIGHTS, "W"), numpy_helper.from_array(BIAS, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


class LoanScorer(fastoip.Model):
    def load(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(logistic_regression_onnx(), options, providers=["CPUExecutionProvider"])
        self.as_of = pd.Timestamp(self.extra["as_of"])
        self.approve_above = float(self.extra["approve_above"])

    @fastoip.on_startup
    def warm_up(self) -> None:
        self.session.run(None, {"FEATURES": np.zeros((1, 2), dtype=np.float32)})

    def predict(self, frame: pd.DataFrame, parameters: dict) -> pd.DataFrame:
        if (frame["income"] <= 0).any():
            raise fastoip.InvalidArgument("income must be positive")
        features = pd.DataFrame(
            {
                "debt_ratio": frame["debt"] / frame["income"],
                "tenure_years": (self.as_of - frame["customer_since"]).dt.days / 365.25,
            }
        )
        (scores,) = self.session.run(None, {"FEATURES": features.to_numpy(dtype=np.float32)})
        score = scores[:, 0]
        return pd.DataFrame(
            {
                "applicant": frame["applicant"],
                "debt_ratio": features["debt_ratio"],
                "tenure_years": features["tenure_years"],
                "score": score,
                "decision": np.where(score >= self.approve_above, "approve", "review").tolist(),
            }
        )

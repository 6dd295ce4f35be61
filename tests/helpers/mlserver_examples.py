"""Folders laid out as MLServer's own examples (``docs-gb/examples/`` of SeldonIO/MLServer 1.7), built here.

Each ``write_*`` writes one example's layout into a folder: its ``settings.json``, ``model-settings.json`` files
and runtime modules, equivalents written for these tests (not the examples' files), and the models trained here
on data that needs no download (scikit-learn's bundled digits and iris; a synthetic stand-in for the mushroom
data set).  Each returns the README's request inputs and what the model itself answers, so a test can hold the
server's answer to the model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


# -- prebuilt runtimes --------------------------------------------------------------------------
def _digits_svm() -> tuple[Any, np.ndarray]:
    from sklearn import datasets, svm

    digits = datasets.load_digits()
    data = digits.images.reshape((len(digits.images), -1))
    classifier = svm.SVC(gamma=0.001)
    classifier.fit(data[:200], digits.target[:200])
    return classifier, data[300:301].astype(np.float32)


def _mushroom_xgboost() -> tuple[Any, np.ndarray]:
    import xgboost as xgb

    rng = np.random.default_rng(7)
    features = rng.integers(0, 2, size=(200, 126)).astype(np.float32)
    labels = (features[:, 3] + features[:, 17] > 1).astype(np.float32)
    booster = xgb.train({"max_depth": 2, "eta": 1, "objective": "binary:logistic"},
                        xgb.DMatrix(data=features, label=labels), 2)
    return booster, features[:1]


def _iris_lightgbm() -> tuple[Any, np.ndarray]:
    import lightgbm as lgb
    from sklearn import datasets

    iris = datasets.load_iris()
    booster = lgb.train({"objective": "multiclass", "num_class": 3, "metric": "multi_logloss", "verbose": -1},
                        lgb.Dataset(iris.data, label=iris.target), num_boost_round=5)
    return booster, iris.data[:1].astype(np.float32)


def write_sklearn(folder: Path) -> dict[str, Any]:
    """docs-gb/examples/sklearn: ``mnist-svm.joblib`` named by ``parameters.uri``, version "v0.1.0"."""
    import joblib

    classifier, x_0 = _digits_svm()
    joblib.dump(classifier, folder / "mnist-svm.joblib")
    _json(folder / "settings.json", {"debug": "true"})
    _json(folder / "model-settings.json", {
        "name": "mnist-svm", "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.1.0"},
    })
    return {"model": "mnist-svm", "input": "predict", "x": x_0, "expected": classifier.predict(x_0)}


def write_xgboost(folder: Path) -> dict[str, Any]:
    """docs-gb/examples/xgboost: ``mushroom-xgboost.json`` named by ``parameters.uri``."""
    import xgboost as xgb

    booster, x_0 = _mushroom_xgboost()
    booster.save_model(str(folder / "mushroom-xgboost.json"))
    _json(folder / "settings.json", {"debug": "true"})
    _json(folder / "model-settings.json", {
        "name": "mushroom-xgboost", "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"uri": "./mushroom-xgboost.json", "version": "v0.1.0"},
    })
    return {"model": "mushroom-xgboost", "input": "predict", "x": x_0, "expected": booster.predict(xgb.DMatrix(x_0))}


def write_lightgbm(folder: Path) -> dict[str, Any]:
    """docs-gb/examples/lightgbm: ``iris-lightgbm.bst``; the README asks for ``predict-prob``."""
    booster, x_0 = _iris_lightgbm()
    booster.save_model(str(folder / "iris-lightgbm.bst"))
    _json(folder / "settings.json", {"debug": "true"})
    _json(folder / "model-settings.json", {
        "name": "iris-lgb", "implementation": "mlserver_lightgbm.LightGBMModel",
        "parameters": {"uri": "./iris-lightgbm.bst", "version": "v0.1.0"},
    })
    return {"model": "iris-lgb", "input": "predict-prob", "x": x_0, "expected": booster.predict(x_0)}


def write_mms(folder: Path) -> list[dict[str, Any]]:
    """docs-gb/examples/mms: two models under ``models/``, each file at its runtime's well-known name
    (``model.joblib``, ``model.json``) and no ``parameters.uri`` (MLServer's default: the settings' folder)."""
    import joblib
    import xgboost as xgb

    classifier, digits_x = _digits_svm()
    booster, mushroom_x = _mushroom_xgboost()
    (folder / "models" / "mnist-svm").mkdir(parents=True)
    (folder / "models" / "mushroom-xgboost").mkdir(parents=True)
    joblib.dump(classifier, folder / "models" / "mnist-svm" / "model.joblib")
    booster.save_model(str(folder / "models" / "mushroom-xgboost" / "model.json"))
    _json(folder / "settings.json", {"debug": "true"})
    _json(folder / "models" / "mnist-svm" / "model-settings.json", {
        "name": "mnist-svm", "implementation": "mlserver_sklearn.SKLearnModel", "parameters": {"version": "v0.1.0"},
    })
    _json(folder / "models" / "mushroom-xgboost" / "model-settings.json", {
        "name": "mushroom-xgboost", "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"version": "v0.1.0"},
    })
    return [
        {"model": "mnist-svm", "input": "predict", "x": digits_x, "expected": classifier.predict(digits_x)},
        {"model": "mushroom-xgboost", "input": "predict", "x": mushroom_x,
         "expected": booster.predict(xgb.DMatrix(mushroom_x))},
    ]


# -- custom runtimes ----------------------------------------------------------------------------
JSON_MODELS = '''
import json

from mlserver import MLModel, types
from mlserver.codecs import StringCodec


class JsonHelloWorldModel(MLModel):
    async def load(self):
        return await super().load()

    async def predict(self, payload):
        request = {inp.name: json.loads("".join(self.decode(inp, default_codec=StringCodec)))
                   for inp in payload.inputs}
        reply = json.dumps({"request": request, "server_response": "Got your request. Hello from the server."})
        encoded = reply.encode("UTF-8")
        return types.InferenceResponse(
            id=payload.id, model_name=self.name, model_version=self.version,
            outputs=[types.ResponseOutput(name="echo_response", shape=[len(encoded)], datatype="BYTES",
                                          data=[encoded], parameters=types.Parameters(content_type="str"))],
        )
'''


def write_custom_json(folder: Path) -> None:
    """docs-gb/examples/custom-json: ``jsonmodels.py`` beside a root ``model-settings.json``."""
    (folder / "jsonmodels.py").write_text(JSON_MODELS, encoding="utf-8")
    _json(folder / "settings.json", {"debug": "true"})
    _json(folder / "model-settings.json",
          {"name": "json-hello-world", "implementation": "jsonmodels.JsonHelloWorldModel"})


ECHO_RUNTIME = '''
import json

from mlserver import MLModel
from mlserver.codecs import DecodedParameterName
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

_to_exclude = {
    "parameters": {DecodedParameterName, "headers"},
    "inputs": {"__all__": {"parameters": {DecodedParameterName, "headers"}}},
}


class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            decoded_input = self.decode(request_input)
            print(json.dumps(request_input.dict(exclude=_to_exclude), indent=2))  # fails on bytes, as in MLServer
            print(decoded_input)
            outputs.append(ResponseOutput(name=request_input.name, datatype=request_input.datatype,
                                          shape=request_input.shape, data=request_input.data))
        return InferenceResponse(model_name=self.name, outputs=outputs)
'''


def write_content_type(folder: Path, with_metadata: bool = False) -> None:
    """docs-gb/examples/content-type: ``runtime.EchoRuntime``; ``with_metadata``: the README's second
    model-settings.json, whose inputs declare their content types."""
    (folder / "runtime.py").write_text(ECHO_RUNTIME, encoding="utf-8")
    doc: dict[str, Any] = {"name": "content-type-example", "implementation": "runtime.EchoRuntime"}
    if with_metadata:
        doc["inputs"] = [
            {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "parameters": {"content_type": "np"}},
            {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "parameters": {"content_type": "str"}},
        ]
    _json(folder / "model-settings.json", doc)


TEXT_MODEL = '''
import asyncio

from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceResponse


class TextModel(MLModel):
    async def predict_stream(self, payloads):
        payload = [_ async for _ in payloads][0]
        text = StringCodec.decode_input(payload.inputs[0])[0]
        words = text.split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(0.05)  # the example sleeps 0.5 s: a slow model, shortened for the test
            yield InferenceResponse(
                model_name=self._settings.name,
                outputs=[StringCodec.encode_output(name="output", payload=[word if i == 0 else " " + word],
                                                   use_bytes=True)],
            )
'''


def write_streaming(folder: Path) -> None:
    """docs-gb/examples/streaming: ``text_model.TextModel`` (``predict_stream`` only)."""
    (folder / "text_model.py").write_text(TEXT_MODEL, encoding="utf-8")
    _json(folder / "settings.json", {"debug": False, "parallel_workers": 0, "gzip_enabled": False})
    _json(folder / "model-settings.json", {
        "name": "text-model", "implementation": "text_model.TextModel", "versions": ["text-model/v1.2.3"],
        "platform": "mlserver",
        "inputs": [{"datatype": "BYTES", "name": "prompt", "shape": [1]}],
        "outputs": [{"datatype": "BYTES", "name": "output", "shape": [1]}],
    })
    _json(folder / "generate-request.json", {
        "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["What is the capital of France?"],
                    "parameters": {"content_type": "str"}}],
        "outputs": [{"name": "output"}],
    })

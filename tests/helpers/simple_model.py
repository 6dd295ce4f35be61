"""The demo repository's ``simple`` model as the end-to-end tests call it through tritonclient.

``simple`` takes INT32 [1, 16] INPUT0 and INPUT1 and answers OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The default INPUT0: 0..15.
ZERO_TO_15 = np.arange(16, dtype=np.int32).reshape(1, 16)
#: The default INPUT1: sixteen 1s.
ONES_16 = np.ones((1, 16), dtype=np.int32)
ZERO_TO_15.setflags(write=False)  # shared by every test that imports them
ONES_16.setflags(write=False)

#: Its metadata as the server answers it (``/v2/models/simple``, ModelMetadata).
SIMPLE_METADATA = {
    "name": "simple",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
}


def simple_inputs(client: Any, a: np.ndarray = ZERO_TO_15, b: np.ndarray = ONES_16) -> list[Any]:
    """INPUT0 = ``a`` and INPUT1 = ``b`` as ``client``'s InferInputs.

    ``client``: the tritonclient module whose request it goes in (``tritonclient.grpc``, ``tritonclient.http``, or
    ``tritonclient.http.aio``); INT32 arrays of any shape (the shape is theirs).
    """
    inputs = [client.InferInput("INPUT0", list(a.shape), "INT32"), client.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs

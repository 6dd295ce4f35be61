"""Small Python models (``fastoip.Model`` sources and their configs) that several test modules serve."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_python_model(root: Path, name: str, source: str, config: str | None = None, version: int = 1) -> Path:
    """``<root>/<name>/<version>/model.py`` (+ config.pbtxt); returns the model directory."""
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    if config is not None:
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return root / name


DOUBLER = """
    import numpy as np
    import fastoip

    class Doubler(fastoip.Model):
        @fastoip.batchable
        def predict(self, inputs, parameters):
            x = inputs["INPUT0"]
            return {"OUTPUT0": x * 2, "BATCH": np.full((len(x), 1), len(x), dtype=np.int64)}
"""

BATCHED_CONFIG = """
    backend: "python"
    max_batch_size: 16
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]
    dynamic_batching { max_queue_delay_microseconds: 500000 }
"""

INFO = """
    import json
    import fastoip

    class Info(fastoip.Model):
        def __init__(self):
            self.seen_in_init = (self.name, self.instance)

        def predict(self, inputs):          # one argument: no parameters wanted
            return [json.dumps({
                "name": self.name, "version": self.version, "instance": self.instance,
                "folder": self.path.name, "extra": self.extra, "param": self.parameters.get("greeting"),
                "init": list(self.seen_in_init), "n": int(inputs["X"].shape[0]),
            })]
"""

SHAPES = """
    import numpy as np
    import fastoip

    class Pair(fastoip.Model):
        def predict(self, inputs, parameters):
            x = inputs["X"]
            return x, x + 1                 # a tuple: outputs in config order

    class Single(fastoip.Model):
        async def predict(self, inputs, parameters):
            return inputs["X"].astype(np.float64) / 2   # one value, FP64 cast to the declared FP32
"""

MISBEHAVE = """
    import numpy as np
    import fastoip

    class Misbehave(fastoip.Model):
        def predict(self, inputs, parameters):
            mode = parameters.get("mode", "ok")
            x = inputs["X"]
            if mode == "ok":
                return {"OUT": x}
            if mode == "wide":
                return {"OUT": x.astype(np.int64) * 3}
            if mode == "undeclared":
                return {"OUT": x, "NOPE": x}
            if mode == "missing":
                return {}
            if mode == "float":
                return {"OUT": x + 0.5}
            if mode == "strings":
                return {"OUT": ["a"] * len(x)}
            if mode == "tuple":
                return (x, x)
            if mode == "invalid":
                raise fastoip.InvalidArgument("X must be positive")
            raise ValueError("boom")
"""

SLEEPER = """
    import asyncio
    import numpy as np
    import fastoip

    class Sleeper(fastoip.Model):
        async def predict(self, inputs, parameters):
            await asyncio.sleep(0.4)
            return {"OUT": inputs["X"]}
"""

BROKEN_LOAD = """
    import fastoip

    class Broken(fastoip.Model):
        def load(self):
            raise RuntimeError("no weights here")

        def predict(self, inputs, parameters):
            return inputs
"""

INT_IO = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


# Decoupled models: predict is a generator or an async generator.
COUNTER = """
    import time
    import numpy as np
    import fastoip

    class Counter(fastoip.Model):
        def predict(self, inputs, parameters):
            fail_at = int(parameters.get("fail_at", -1))
            delay = float(parameters.get("delay", 0))
            for index in range(int(inputs["COUNT"].reshape(-1)[0])):
                if index == fail_at:
                    raise ValueError(f"no response {index}")
                if delay:
                    time.sleep(delay)
                yield {"INDEX": np.array([index], dtype=np.int32)}
"""

COUNTER_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] } ]
    model_transaction_policy { decoupled: true }
"""

ASYNC_COUNTER = """
    import asyncio
    import numpy as np
    import fastoip

    class AsyncCounter(fastoip.Model):
        async def predict(self, inputs):
            for index in range(int(inputs["COUNT"].reshape(-1)[0])):
                await asyncio.sleep(0)
                yield {"INDEX": np.array([index], dtype=np.int32)}
"""

#: Each word of ``text_input`` as its own response (a token stream), with its position as a parameter.
WORDS = """
    import fastoip

    class Words(fastoip.Model):
        async def predict(self, inputs, parameters):
            text = inputs["text_input"].reshape(-1)[0].decode()
            if text == "fail":
                raise fastoip.InvalidArgument("the model refuses 'fail'")
            words = text.split()
            for index, word in enumerate(words):
                if word == "boom":
                    raise RuntimeError("boom in the middle")
                yield {"text_output": [word.upper() if parameters.get("upper") else word],
                       "position": [index]}
"""

WORDS_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
             { name: "position" data_type: TYPE_INT64 dims: [ 1 ] } ]
    model_transaction_policy { decoupled: true }
"""


#: Not decoupled: one response per request, whatever the request asks of the final flag.
PLAIN = """
    import numpy as np
    import fastoip

    class Plain(fastoip.Model):
        def predict(self, inputs):
            return {"INDEX": inputs["COUNT"].astype(np.int32)}
"""

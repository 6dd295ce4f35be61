"""Triton Python-backend models (``TritonPythonModel`` + ``triton_python_backend_utils``) served unchanged.

One real fastoip serves a repository of model.py files written here (nothing
copied from python_backend's examples, but each exercises what one of them
does: add_sub, auto_complete, BLS sync and async, decoupled repeat and square,
BLS into a decoupled model, custom metrics), next to an ONNX model with a
dynamic batcher that the BLS models call.  tritonclient drives it over gRPC
and HTTP.  Each Python instance runs in its own worker process; the crash cases
(segfault, ``os._exit``, unbounded allocation) live in their own server so
their restarts do not disturb the rest.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

import fastoip
from fastoip.pyworker import channel
from models import identity_model_bytes, write_model
from python_models import write_python_model
from serverproc import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(180)


ADD_SUB = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.args = args
            config = json.loads(args["model_config"])
            self.dtype0 = pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])
            self.dtype1 = pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"])

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if a.shape != b.shape:
                    error = pb_utils.TritonError("INPUT0 and INPUT1 differ in shape", pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype0)),
                    pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype1)),
                ]))
            return responses

        def finalize(self):
            pb_utils.Logger.log_info("add_sub finalize")
"""

ADD_SUB_CONFIG = """
    name: "add_sub"
    backend: "python"
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
"""

ARGS_ECHO = """
    import json, os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.args = dict(args)
            self.args["pid"] = os.getpid()

        def execute(self, requests):
            out = []
            for request in requests:
                info = dict(self.args, batch=len(requests), request_id=request.request_id(),
                            parameters=json.loads(request.parameters()),
                            requested=request.requested_output_names())
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))]))
            return out
"""

ARGS_ECHO_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# auto_complete_config fills the config (config.pbtxt names only the backend); execute sees batches as lists.
AUTO_BATCH = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
            auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
            auto_complete_model_config.add_output({"name": "REQUESTS", "data_type": "TYPE_INT32", "dims": [1]})
            auto_complete_model_config.set_max_batch_size(8)
            auto_complete_model_config.set_dynamic_batching()
            return auto_complete_model_config

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", x * 10),
                    pb_utils.Tensor("REQUESTS", np.full((x.shape[0], 1), len(requests), dtype=np.int32)),
                ]))
            return out
"""

AUTO_BATCH_CONFIG = """
    backend: "python"
    dynamic_batching { max_queue_delay_microseconds: 300000 }
"""

# decoupled "repeat": each element of IN is one response, sent from a thread the model starts.
REPEAT = """
    import json, threading, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            if not pb_utils.using_decoupled_model_transaction_policy(config):
                raise pb_utils.TritonModelException("repeat must be decoupled")
            self.threads = []

        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                thread = threading.Thread(target=self.stream, args=(values, sender))
                thread.start()
                self.threads.append(thread)
            return None

        def stream(self, values, sender):
            for index, value in enumerate(values):
                time.sleep(0.01)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        def finalize(self):
            for thread in self.threads:
                thread.join()
"""

REPEAT_CONFIG = """
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
             { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""

# decoupled "square": IN = n answers n responses of n, from execute itself, then the final flag alone.
SQUARE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                sender = request.get_response_sender()
                for _ in range(n):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

SQUARE_CONFIG = """
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# decoupled "ticker": one response every 20 ms from a thread until the client cancels the request.
TICKER = """
    import threading, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.tick, args=(request, request.get_response_sender())).start()
            return None

        def tick(self, request, sender):
            sent = 0
            while sent < 500 and not request.is_cancelled():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([sent], dtype=np.int32))]))
                sent += 1
                time.sleep(0.02)
            tag = int(request.inputs()[0].as_numpy()[0])
            pb_utils.Logger.log_warn(
                f"ticker {tag} saw the cancellation after {sent} responses: {sender.is_cancelled()}")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

TICKER_CONFIG = """
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# BLS: MODEL names which model to call (add_sub or the ONNX identity); the call goes through the server's Core.
BLS_SYNC = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0].decode()
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
                if target == "add_sub":  # the name as the BYTES element it came in (Triton takes bytes too)
                    name = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0]
                    inner = pb_utils.InferenceRequest(model_name=name, inputs=[a, b],
                                                      requested_output_names=["OUTPUT0", "OUTPUT1"])
                    result = inner.exec()
                    if result.has_error():
                        raise pb_utils.TritonModelException(result.error().message())
                    out0 = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()
                    out1 = pb_utils.get_output_tensor_by_name(result, "OUTPUT1").as_numpy()
                elif target in ("identity", "ensemble"):  # the ONNX model, or an ensemble around it
                    inner = pb_utils.InferenceRequest(
                        model_name=target,
                        inputs=[pb_utils.Tensor("INPUT0", a.as_numpy().reshape(1, 4))],
                        requested_output_names=["OUTPUT0"])
                    result = inner.exec()
                    out0 = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy().reshape(4)
                    out1 = b.as_numpy()
                else:
                    result = pb_utils.InferenceRequest(model_name=target, inputs=[a, b],
                                                       requested_output_names=["OUTPUT0"]).exec()
                    responses.append(pb_utils.InferenceResponse(error=result.error()))
                    continue
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)]))
            return responses
"""

BLS_CONFIG = """
    backend: "python"
    input [ { name: "MODEL" data_type: TYPE_STRING dims: [ 1 ] },
            { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# BLS async: both inner requests at once with asyncio.gather, plus readiness.
BLS_ASYNC = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
                assert pb_utils.is_model_ready("add_sub") and not pb_utils.is_model_ready("no_such_model")
                first = pb_utils.InferenceRequest(model_name="add_sub", inputs=[a, b],
                                                  requested_output_names=["OUTPUT0"])
                second = pb_utils.InferenceRequest(
                    model_name="identity", inputs=[pb_utils.Tensor("INPUT0", b.as_numpy().reshape(1, 4))],
                    requested_output_names=["OUTPUT0"])
                r1, r2 = await asyncio.gather(first.async_exec(), second.async_exec())
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(r1, "OUTPUT0").as_numpy()),
                    pb_utils.Tensor("OUTPUT1",
                                    pb_utils.get_output_tensor_by_name(r2, "OUTPUT0").as_numpy().reshape(4)),
                ]))
            return responses
"""

BLS_ASYNC_CONFIG = """
    backend: "python"
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# BLS into a decoupled model: exec(decoupled=True) iterates square's responses.
BLS_DECOUPLED = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                n = pb_utils.get_input_tensor_by_name(request, "IN")
                inner = pb_utils.InferenceRequest(model_name="square", inputs=[n], requested_output_names=["OUT"])
                values = []
                for response in inner.exec(decoupled=True):
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    out = pb_utils.get_output_tensor_by_name(response, "OUT")
                    if out is not None:
                        values.append(int(out.as_numpy()[0]))
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("COUNT", np.array([len(values)], dtype=np.int32)),
                    pb_utils.Tensor("SUM", np.array([sum(values)], dtype=np.int32))]))
            return responses
"""

# python_backend's bls_decoupled/async_model.py pattern: two exec(decoupled=True) awaited together (asyncio.gather)
# from an async execute, then each stream iterated (it failed under the mypyc-compiled worker: issue 36 item 6).
BLS_DECOUPLED_GATHER = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                n = pb_utils.get_input_tensor_by_name(request, "IN")
                inner = [pb_utils.InferenceRequest(model_name="square", inputs=[n], requested_output_names=["OUT"])
                         for _ in range(2)]
                streams = await asyncio.gather(*[r.async_exec(decoupled=True) for r in inner])
                values = []
                for stream in streams:
                    for response in stream:
                        if response.has_error():
                            raise pb_utils.TritonModelException(response.error().message())
                        out = pb_utils.get_output_tensor_by_name(response, "OUT")
                        if out is not None:
                            values.append(int(out.as_numpy()[0]))
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("COUNT", np.array([len(values)], dtype=np.int32)),
                    pb_utils.Tensor("SUM", np.array([sum(values)], dtype=np.int32))]))
            return responses
"""

BLS_DECOUPLED_CONFIG = """
    backend: "python"
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
             { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# BLS into the decoupled ticker: three responses, then ResponseIterator.cancel() cancels the inner request.
BLS_CANCEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                inner = pb_utils.InferenceRequest(model_name="ticker", inputs=[request.inputs()[0]],
                                                  requested_output_names=["OUT"])
                stream = inner.exec(decoupled=True)
                got, errors = 0, []
                for response in stream:
                    if response.has_error():
                        errors.append(response.error().code())
                        break
                    if pb_utils.get_output_tensor_by_name(response, "OUT") is not None:
                        got += 1
                    if got == 3:
                        stream.cancel()
                cancelled = int(errors == [pb_utils.TritonError.CANCELLED])
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("COUNT", np.array([got], dtype=np.int32)),
                    pb_utils.Tensor("SUM", np.array([cancelled], dtype=np.int32))]))
            return responses
"""


# async_exec(decoupled=True) into the ticker: the iterator gives each response as it comes (the ticker would
# send 500 over 10 s), so the model cancels after three.
BLS_CANCEL_ASYNC = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                inner = pb_utils.InferenceRequest(model_name="ticker", inputs=[request.inputs()[0]],
                                                  requested_output_names=["OUT"])
                started = time.monotonic()
                stream = await inner.async_exec(decoupled=True)
                waited_ms = int((time.monotonic() - started) * 1000)
                got, errors = 0, []
                for response in stream:
                    if response.has_error():
                        errors.append(response.error().code())
                        break
                    if pb_utils.get_output_tensor_by_name(response, "OUT") is not None:
                        got += 1
                    if got == 3:
                        stream.cancel()
                cancelled = int(errors == [pb_utils.TritonError.CANCELLED])
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("COUNT", np.array([got], dtype=np.int32)),
                    pb_utils.Tensor("SUM", np.array([cancelled * 100000 + waited_ms], dtype=np.int32))]))
            return responses
"""


# Decoupled relay of the ticker through BLS, in Triton's pattern for a cancelled outer request: Triton does not
# cancel a model's BLS requests when its own request is cancelled; the model checks is_cancelled() and cancels
# the inner stream with ResponseIterator.cancel().
BLS_RELAY = """
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.relay, args=(request, request.get_response_sender())).start()
            return None

        def relay(self, request, sender):
            inner = pb_utils.InferenceRequest(model_name="ticker", inputs=[request.inputs()[0]],
                                              requested_output_names=["OUT"])
            stream = inner.exec(decoupled=True)
            relayed, ended = 0, "completed"
            for response in stream:
                if response.has_error():
                    ended = f"error {response.error().code()}"
                    break
                if request.is_cancelled():
                    stream.cancel()
                    continue  # the inner stream ends with a CANCELLED error
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    sender.send(pb_utils.InferenceResponse([out]))
                    relayed += 1
            pb_utils.Logger.log_warn(f"relay ended after {relayed} responses: {ended}")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


METRICS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            # (the families are kept: a Metric lives only as long as its family object, as on Triton)
            self.families = [
                pb_utils.MetricFamily("my_model_requests", "Requests seen by the model", pb_utils.MetricFamily.COUNTER),
                pb_utils.MetricFamily("my_model_last_value", "Last value seen", pb_utils.MetricFamily.GAUGE),
                pb_utils.MetricFamily("my_model_value", "Values seen", pb_utils.MetricFamily.HISTOGRAM),
            ]
            self.requests = self.families[0].Metric(
                labels={"model": args["model_name"], "version": args["model_version"]})
            self.last = self.families[1].Metric(labels={"kind": "x"})
            self.sizes = self.families[2].Metric(labels={"kind": "x"}, buckets=[1.0, 10.0])

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                self.requests.increment(1)
                self.last.set(float(x[0]))
                self.sizes.observe(float(x[0]))
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("COUNT", np.array([self.requests.value()], dtype=np.float64))]))
            return out
"""

METRICS_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "COUNT" data_type: TYPE_FP64 dims: [ 1 ] } ]
"""

FAILING = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            raise pb_utils.TritonModelException("this model always fails")
"""

FAILING_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CONDA = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return []
"""

CONDA_CONFIG = FAILING_CONFIG + """
    parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
"""


ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "identity" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_python")
    write_python_model(root, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
    write_python_model(root, "args_echo", ARGS_ECHO, ARGS_ECHO_CONFIG)
    write_python_model(root, "auto_batch", AUTO_BATCH, AUTO_BATCH_CONFIG)
    write_python_model(root, "repeat", REPEAT, REPEAT_CONFIG)
    write_python_model(root, "square", SQUARE, SQUARE_CONFIG)
    write_python_model(root, "ticker", TICKER, TICKER_CONFIG)
    write_python_model(root, "bls_sync", BLS_SYNC, BLS_CONFIG)
    write_python_model(root, "bls_async", BLS_ASYNC, BLS_ASYNC_CONFIG)
    write_python_model(root, "bls_decoupled", BLS_DECOUPLED, BLS_DECOUPLED_CONFIG)
    write_python_model(root, "bls_decoupled_gather", BLS_DECOUPLED_GATHER, BLS_DECOUPLED_CONFIG)
    write_python_model(root, "bls_cancel", BLS_CANCEL, BLS_DECOUPLED_CONFIG)
    write_python_model(root, "bls_relay", BLS_RELAY, TICKER_CONFIG)
    write_python_model(root, "bls_cancel_async", BLS_CANCEL_ASYNC, BLS_DECOUPLED_CONFIG)
    write_python_model(root, "add_sub_pipelined", ADD_SUB, ADD_SUB_CONFIG.replace('"add_sub"', '"add_sub_pipelined"')
                       + 'parameters { key: "worker_pipeline" value: { string_value: "3" } }\n')
    write_python_model(root, "bad_pipeline", ADD_SUB, ADD_SUB_CONFIG.replace('"add_sub"', '"bad_pipeline"')
                       + 'parameters { key: "worker_pipeline" value: { string_value: "0" } }\n')
    write_python_model(root, "metrics", METRICS, METRICS_CONFIG)
    write_python_model(root, "failing", FAILING, FAILING_CONFIG)
    write_python_model(root, "conda", CONDA, CONDA_CONFIG)
    (root / "ensemble" / "1").mkdir(parents=True)
    (root / "ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    write_model(
        root,
        "identity",
        identity_model_bytes(TensorProto.FLOAT, [4]),
        config="max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n",
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo, http=True, metrics=True) as proc:
        yield proc


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_over_grpc_and_http(server: ServerProcess) -> None:
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("add_sub")
    result = client.infer("add_sub", _add_sub_inputs(a, b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    # Only what was asked for comes back.
    only = client.infer("add_sub", _add_sub_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None
    np.testing.assert_allclose(only.as_numpy("OUTPUT1"), a - b)

    http = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    np.testing.assert_allclose(http.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
    assert client.get_model_config("add_sub").config.backend == "python"


def test_grpc_and_http_at_once_each_get_their_own_answers(server: ServerProcess) -> None:
    """Both event-loop frontends hand requests to the same worker at once: one loop reads its results, the other
    loop's requests are finished there and handed back to their own loop; every caller gets its own answer."""

    def grpc_calls(seed: int) -> int:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for i in range(40):
            a = np.full(4, seed * 1000 + i, np.float32)
            result = client.infer("add_sub", _add_sub_inputs(a, np.ones(4, np.float32)))
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + 1)
        return 40

    def http_calls(seed: int) -> int:
        client = httpclient.InferenceServerClient(server.http_url)
        for i in range(40):
            a = np.full(4, seed * 1000 + i, np.float32)
            inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones(4, np.float32))
            np.testing.assert_allclose(client.infer("add_sub", inputs).as_numpy("OUTPUT1"), a - 1)
        return 40

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(grpc_calls if n % 2 else http_calls, n) for n in range(8)]
        assert sum(f.result(timeout=120) for f in futures) == 320


def test_initialize_args_and_request_fields(server: ServerProcess, repo: Path) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = client.infer("args_echo", [x], request_id="req-7", parameters={"temperature": "hot"})
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["model_name"] == "args_echo" and info["model_version"] == "1"
    assert info["model_instance_kind"] == "CPU" and info["model_instance_device_id"] == "0"
    assert info["model_instance_name"] == "args_echo_0"  # Triton: the group it adds is named after the model
    assert info["model_repository"] == str(repo / "args_echo")
    config = json.loads(info["model_config"])
    assert config["name"] == "args_echo" and config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [1] and config["output"][0]["data_type"] == "TYPE_STRING"
    assert info["request_id"] == "req-7" and info["parameters"] == {"temperature": "hot"}
    assert info["requested"] == ["INFO"]
    assert info["pid"] != os.getpid() and info["pid"] != server.proc.pid  # type: ignore[union-attr]


def test_auto_complete_and_batches_as_lists(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("auto_batch").config
    assert config.max_batch_size == 8 and [i.name for i in config.input] == ["IN"]
    assert [o.name for o in config.output] == ["OUT", "REQUESTS"]

    def one(value: float) -> tuple[np.ndarray, int]:
        inp = grpcclient.InferInput("IN", [1, 2], "FP32")
        inp.set_data_from_numpy(np.full((1, 2), value, dtype=np.float32))
        result = grpcclient.InferenceServerClient(server.grpc_url).infer("auto_batch", [inp])
        return result.as_numpy("OUT"), int(result.as_numpy("REQUESTS")[0, 0])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, [1.0, 2.0, 3.0, 4.0]))
    for value, (out, _) in zip([1.0, 2.0, 3.0, 4.0], answers, strict=True):
        np.testing.assert_allclose(out, np.full((1, 2), value * 10))
    # The dynamic batcher gave execute() several requests in one list.
    assert max(count for _, count in answers) > 1


def _stream(server: ServerProcess, model: str, inputs: list, count: int = 1) -> list:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for _ in range(count):
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        got = []
        finals = 0
        while finals < count:
            result, error = results.get(timeout=30)
            got.append((result, error))
            if error is not None:
                finals += 1
                continue
            if result.get_response().parameters["triton_final_response"].bool_param:
                finals += 1
        return got
    finally:
        client.stop_stream()


def test_decoupled_repeat_from_model_threads(server: ServerProcess) -> None:
    values = np.array([4, 2, 0, 7], dtype=np.int32)
    inp = grpcclient.InferInput("IN", [4], "INT32")
    inp.set_data_from_numpy(values)
    got = _stream(server, "repeat", [inp])
    assert all(error is None for _, error in got)
    outputs = [r.as_numpy("OUT")[0] for r, _ in got if r.as_numpy("OUT") is not None]
    assert outputs == list(values)
    assert [int(r.as_numpy("IDX")[0]) for r, _ in got if r.as_numpy("IDX") is not None] == [0, 1, 2, 3]


def test_decoupled_square_two_requests(server: ServerProcess) -> None:
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([3], dtype=np.int32))
    got = _stream(server, "square", [inp], count=2)
    outputs = [int(r.as_numpy("OUT")[0]) for r, _ in got if r is not None and r.as_numpy("OUT") is not None]
    assert outputs == [3] * 6


def test_decoupled_on_generate_stream(server: ServerProcess) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/square/generate_stream",
        data=json.dumps({"IN": 2}).encode(),
        headers={"Content-Type": "application/json"},
    )
    body = urllib.request.urlopen(request, timeout=30).read().decode()
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    assert [event["OUT"] for event in events] == [2, 2]


def test_cancelling_a_stream_is_seen_by_the_model(server: ServerProcess) -> None:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    client.async_stream_infer("ticker", [inp])
    for _ in range(3):
        result, error = results.get(timeout=30)
        assert error is None
    client.stop_stream(cancel_requests=True)
    assert wait_until(lambda: "ticker 0 saw the cancellation after" in server.output(), timeout=20)
    line = next(line for line in server.output().splitlines() if "ticker 0 saw the cancellation" in line)
    assert int(line.split("after ")[1].split()[0]) < 500 and line.endswith("True")


def test_cancelling_the_outer_request_cancels_its_bls_stream(server: ServerProcess) -> None:
    """The client cancels the relay's stream; the relay sees it (is_cancelled) and cancels its BLS stream into
    the ticker (as Triton's docs show: Triton itself leaves a model's BLS requests running); the ticker sees its
    request cancelled; the inner request counts in the ticker's statistics."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = _request_count(grpc, "ticker")
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([7], dtype=np.int32))
    client.async_stream_infer("bls_relay", [inp])
    for expected in range(3):
        result, error = results.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == expected
    client.stop_stream(cancel_requests=True)
    assert wait_until(lambda: "ticker 7 saw the cancellation after" in server.output(), timeout=20)
    line = next(line for line in server.output().splitlines() if "ticker 7 saw the cancellation" in line)
    assert int(line.split("after ")[1].split()[0]) < 500 and line.endswith("True")
    assert wait_until(lambda: "relay ended after" in server.output(), timeout=20)
    line = next(line for line in server.output().splitlines() if "relay ended after" in line)
    assert line.endswith("error 7")  # TritonError.CANCELLED: the inner stream's last response
    assert wait_until(lambda: _request_count(grpc, "ticker") == before + 1, timeout=10)


def _request_count(client: grpcclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)
    return sum(s.inference_stats.success.count + s.inference_stats.fail.count for s in stats.model_stats)


def test_bls_sync_into_python_and_onnx_and_errors(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)

    def call(target: str) -> grpcclient.InferResult:
        model = grpcclient.InferInput("MODEL", [1], "BYTES")
        model.set_data_from_numpy(np.array([target.encode()], dtype=np.object_))
        return client.infer("bls_sync", [model, *_add_sub_inputs(a, b)])

    before = _success_count(client, "add_sub")
    result = call("add_sub")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    assert _success_count(client, "add_sub") == before + 1  # the inner request counts in add_sub's statistics

    with ThreadPoolExecutor(6) as pool:  # concurrent BLS calls into the ONNX model's dynamic batcher
        results = list(pool.map(lambda _: call("identity"), range(6)))
    for r in results:
        np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a)

    np.testing.assert_allclose(call("ensemble").as_numpy("OUTPUT0"), a)  # BLS into an ensemble

    with pytest.raises(InferenceServerException) as err:
        call("no_such_model")
    assert "no_such_model" in err.value.message()


def _success_count(client: grpcclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)
    return sum(s.inference_stats.success.count for s in stats.model_stats)


def test_bls_async_gathers_two_models(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2, dtype=np.float32)
    result = client.infer("bls_async", _add_sub_inputs(a, b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), b)


def test_bls_into_decoupled_model(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([4], dtype=np.int32))
    result = client.infer("bls_decoupled", [inp])
    assert int(result.as_numpy("COUNT")[0]) == 4 and int(result.as_numpy("SUM")[0]) == 16


def test_bls_two_decoupled_streams_awaited_together(server: ServerProcess) -> None:
    """python_backend's ``bls_decoupled/async_model.py``: two ``async_exec(decoupled=True)`` gathered."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([3], dtype=np.int32))
    for _ in range(3):
        result = client.infer("bls_decoupled_gather", [inp])
        assert int(result.as_numpy("COUNT")[0]) == 6 and int(result.as_numpy("SUM")[0]) == 18


def test_bls_response_iterator_cancel(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    result = client.infer("bls_cancel", [inp])
    assert 3 <= int(result.as_numpy("COUNT")[0]) < 500  # the ticker stopped long before its 500
    assert int(result.as_numpy("SUM")[0]) == 1  # the stream ended with a CANCELLED error


def test_bls_async_exec_decoupled_yields_as_responses_come(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = client.infer("bls_cancel_async", [inp])
    assert 3 <= int(result.as_numpy("COUNT")[0]) < 500  # not gathered: the model read three, then cancelled
    flag, waited_ms = divmod(int(result.as_numpy("SUM")[0]), 100000)
    assert flag == 1  # the stream ended with a CANCELLED error
    assert waited_ms < 5000  # the await resolved at the first response, not after the ticker's 10 s


def test_custom_metrics_on_metrics_endpoint(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for value in (0.5, 5.0, 50.0):
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], dtype=np.float32))
        last = client.infer("metrics", [x])
    assert float(last.as_numpy("COUNT")[0]) == 3.0
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "nv_inference_request_success" in families  # beside the server's own families
    (counter,) = families["my_model_requests"].samples
    assert counter.labels == {"model": "metrics", "version": "1"} and counter.value == 3.0
    assert families["my_model_last_value"].samples[0].value == 50.0
    histogram = {(s.name, s.labels.get("le")): s.value for s in families["my_model_value"].samples}
    assert histogram[("my_model_value_bucket", "1")] == 1  # bounds written as Triton writes them (le="1")
    assert histogram[("my_model_value_bucket", "10")] == 2
    assert histogram[("my_model_value_bucket", "+Inf")] == 3
    assert histogram[("my_model_value_count", None)] == 3


def test_model_errors_have_triton_codes(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.infer("failing", [x])
    assert err.value.status() == "StatusCode.INTERNAL"
    assert "this model always fails" in err.value.message() and "failing" in err.value.message()
    # A response carrying TritonError(INVALID_ARG) is a 400 with the model's message for the client.
    http = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [3], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros(4, dtype=np.float32))
    inputs[1].set_data_from_numpy(np.zeros(3, dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        http.infer("add_sub", inputs)
    assert err.value.status() == "400" and "differ in shape" in err.value.message()


SLOW_ECHO = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.002)  # long enough for requests to queue behind this one in the worker's socket
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() * 2)]) for r in requests]
"""

SLOW_ECHO_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def test_blocking_callers_share_the_worker_window_and_statistics_count_the_worker_time(tmp_path: Path) -> None:
    """Core.infer from threads that wait (they lend their thread): each gets its own answer from the reader
    thread, and the statistics count every execution with the worker's time, recorded when the result came."""
    from fastoip.core import Core
    from fastoip.types import InferInput, InferRequest, RequestedOutput

    write_python_model(tmp_path, "slow_echo", SLOW_ECHO, SLOW_ECHO_CONFIG)
    core = Core(tmp_path)
    core.load_models()
    try:
        def one(i: int) -> int:
            x = InferInput("X", "INT32", (1,), np.array([i], np.int32))
            request = InferRequest("slow_echo", "", f"r{i}", {}, [x], [RequestedOutput("Y")])
            return int(core.infer(request).outputs[0].data[0])

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(64))) == [2 * i for i in range(64)]
        (stats,) = core.statistics("slow_echo")
        assert stats.execution_count == stats.inference_count == 64
        infer = stats.inference_stats.compute_infer
        assert infer.count == 64 and infer.ns >= 64 * 2_000_000  # the worker's 2 ms each, not the send's time
    finally:
        core.close()


def test_worker_pipeline_answers_each_request_its_own(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    pairs = [(np.full(4, i, dtype=np.float32), np.full(4, 2 * i, dtype=np.float32)) for i in range(24)]
    with ThreadPoolExecutor(8) as pool:  # up to three requests on their way to the one worker at once
        results = list(pool.map(lambda ab: client.infer("add_sub_pipelined", _add_sub_inputs(*ab)), pairs))
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["bad_pipeline"].state == "UNAVAILABLE"
    assert "'worker_pipeline' must be an integer >= 1" in index["bad_pipeline"].reason


def test_execution_env_path_is_refused(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not client.is_model_ready("conda")
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["conda"].state == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH" in index["conda"].reason
    assert client.is_model_ready("add_sub")  # everything else serves


# -- crashes ---------------------------------------------------------------------------------------------------
CRASHER = """
    import ctypes, os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                how = int(pb_utils.get_input_tensor_by_name(request, "HOW").as_numpy()[0])
                if how == 1:
                    ctypes.string_at(0)
                elif how == 2:
                    os._exit(3)
                elif how == 4:  # a crash after a while: requests sent meanwhile wait behind it
                    import time
                    time.sleep(0.5)
                    ctypes.string_at(0)
                elif how == 3:
                    hoard = []
                    while True:
                        hoard.append(np.ones(64 * 1024 * 1024, dtype=np.uint8))
                pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
                out.append(pb_utils.InferenceResponse([pid]))
            return out
"""

CRASHER_CONFIG = """
    backend: "python"
    input [ { name: "HOW" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
    parameters { key: "worker_memory_limit_mb" value: { string_value: "1024" } }
"""


#: Writes over the result ring the server passed it (its read position, far ahead of anything written): a model
#: process that scribbles on shared memory.
SCRIBBLER = """
    import mmap, os, struct, sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                if int(pb_utils.get_input_tensor_by_name(request, "HOW").as_numpy()[0]) == 5:
                    ring = mmap.mmap(int(sys.orig_argv[-1]), 4096)  # (the worker's own argv: its ring)
                    struct.pack_into("<Q", ring, 64, 10 << 20)
                pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
                out.append(pb_utils.InferenceResponse([pid]))
            return out
"""


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("crashes")
    write_python_model(root, "crasher", CRASHER, CRASHER_CONFIG)
    write_python_model(root, "scribbler", SCRIBBLER, CRASHER_CONFIG)
    write_python_model(root, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
    write_python_model(root, "crasher_queued", CRASHER, CRASHER_CONFIG)
    with ServerProcess(root, http=True) as proc:
        yield proc


def _how(client: grpcclient.InferenceServerClient, how: int, model: str = "crasher") -> int:
    x = grpcclient.InferInput("HOW", [1], "INT32")
    x.set_data_from_numpy(np.array([how], dtype=np.int32))
    return int(client.infer(model, [x]).as_numpy("PID")[0])


def test_requests_waiting_behind_a_crash_run_on_the_replacement(crash_server: ServerProcess) -> None:
    """Without a batcher several requests are on their way to one worker (worker_pipeline): when it dies, only
    the one it was running fails; those waiting in its socket never started and are answered by its successor."""
    client = grpcclient.InferenceServerClient(crash_server.grpc_url)
    first_pid = _how(client, 0, "crasher_queued")
    with ThreadPoolExecutor(4) as pool:
        crash = pool.submit(_how, grpcclient.InferenceServerClient(crash_server.grpc_url), 4, "crasher_queued")
        time.sleep(0.2)  # the crash request runs (0.5 s) while these three are sent behind it
        behind = [pool.submit(_how, grpcclient.InferenceServerClient(crash_server.grpc_url), 0, "crasher_queued")
                  for _ in range(3)]
        with pytest.raises(InferenceServerException) as err:
            crash.result(timeout=60)
        assert err.value.status() == "StatusCode.INTERNAL"
        assert "crasher_queued" in err.value.message() and "SIGSEGV" in err.value.message()
        pids = {f.result(timeout=60) for f in behind}
    assert len(pids) == 1 and first_pid not in pids  # all three answered by the restarted worker
    assert client.is_model_ready("crasher_queued")


def test_results_read_on_the_event_loop_and_a_crash_still_fails_what_was_in_flight(tmp_path: Path) -> None:
    """Requests started on an event loop (as the frontends start them) have their results read on that loop: the
    job finishes on the loop's thread, no reader-thread hop.  A crash still fails the request it ran (INTERNAL
    naming the model and the signal), the requests behind it run on the replacement, and once the loop is closed
    a blocking caller is answered again (the reader thread took the worker's socket back)."""
    import asyncio
    import threading

    import uvloop

    from fastoip.core import Core, on_loop
    from fastoip.errors import InternalError
    from fastoip.types import InferInput, InferRequest, RequestedOutput

    write_python_model(tmp_path, "crasher", CRASHER, CRASHER_CONFIG)
    core = Core(tmp_path)
    core.load_models()

    def request(how: int) -> InferRequest:
        x = InferInput("HOW", "INT32", (1,), np.array([how], np.int32))
        return InferRequest("crasher", "", "", {}, [x], [RequestedOutput("PID")])

    async def run(hows: list[int]) -> tuple[list, set[int]]:
        loop = asyncio.get_running_loop()
        finishing_threads: set[int] = set()
        answers: list[asyncio.Future] = []
        for how in hows:
            answer = loop.create_future()

            def settle(call: object, answer: asyncio.Future = answer) -> None:
                answer.set_result(call.error or int(call.response.outputs[0].data[0]))  # type: ignore[attr-defined]

            hop = on_loop(loop, settle)

            def done(call: object, hop: object = hop) -> None:
                finishing_threads.add(threading.get_ident())
                hop(call)  # type: ignore[operator]

            core.start(request(how), None, done)
            answers.append(answer)
            if how == 4:
                await asyncio.sleep(0.2)  # it runs (0.5 s, then a segfault) while the next ones wait behind it
        return list(await asyncio.wait_for(asyncio.gather(*answers), 60)), finishing_threads

    loop = uvloop.new_event_loop()
    try:
        loop_thread = threading.get_ident()
        loop.run_until_complete(run([0]))  # the reader thread hands the socket to the loop after this one
        first, threads = loop.run_until_complete(run([0] * 6))
        assert len(set(first)) == 1 and threads == {loop_thread}  # finished on the loop's thread
        pid = first[0]

        answers, _ = loop.run_until_complete(run([0, 4, 0, 0, 0]))
        assert answers[0] == pid
        crash = answers[1]
        assert isinstance(crash, InternalError)
        assert "crasher" in str(crash) and "SIGSEGV" in str(crash)
        behind = set(answers[2:])
        assert len(behind) == 1 and pid not in behind  # answered by the restarted worker

        loop.run_until_complete(run([0]))  # (the replacement's reader thread hands over after one message)
        again, threads = loop.run_until_complete(run([0] * 4))
        assert set(again) == behind and threads == {loop_thread}  # the replacement is read on the loop too
    finally:
        loop.close()
    try:
        # The loop is gone: a blocking caller still gets its answer (the reader thread reads again).
        response = core.infer(request(0))
        assert int(response.outputs[0].data[0]) in behind
    finally:
        core.close()


def test_a_worker_that_writes_over_its_result_ring_is_ended_and_restarted(crash_server: ServerProcess) -> None:
    """The server checks the ring it reads results from: a worker that scribbled on it is ended (its request fails
    with INTERNAL naming the model), restarted, and the server and its other models keep answering."""
    client = grpcclient.InferenceServerClient(crash_server.grpc_url)
    first_pid = _how(client, 0, "scribbler")
    with pytest.raises(InferenceServerException) as err:
        _how(client, 5, "scribbler")
    assert err.value.status() == "StatusCode.INTERNAL" and "scribbler" in err.value.message()
    assert "SIGKILL" in err.value.message()  # (the server ended it: the worker itself never fails)
    assert _how(client, 0, "scribbler") != first_pid  # its replacement answers
    client.infer("add_sub", _add_sub_inputs(np.ones(4, np.float32), np.ones(4, np.float32)))


def test_crashes_fail_their_requests_and_restart(crash_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(crash_server.grpc_url)
    first_pid = _how(client, 0)

    # While the crasher dies, add_sub keeps answering from its own workers.
    stop = False

    def keep_calling() -> int:
        answered = 0
        other = grpcclient.InferenceServerClient(crash_server.grpc_url)
        while not stop:
            other.infer("add_sub", _add_sub_inputs(np.ones(4, np.float32), np.ones(4, np.float32)))
            answered += 1
        return answered

    with ThreadPoolExecutor(1) as pool:
        background = pool.submit(keep_calling)
        with pytest.raises(InferenceServerException) as err:
            _how(client, 1)
        assert err.value.status() == "StatusCode.INTERNAL"
        assert "crasher" in err.value.message() and "SIGSEGV" in err.value.message()
        second_pid = _how(client, 0)  # restarted
        assert second_pid != first_pid

        # Unbounded allocation under the worker's memory limit: MemoryError fails the request, the worker lives.
        with pytest.raises(InferenceServerException) as err:
            _how(client, 3)
        assert err.value.status() == "StatusCode.INTERNAL" and "MemoryError" in err.value.message()
        assert _how(client, 0) == second_pid

        with pytest.raises(InferenceServerException) as err:
            _how(client, 2)
        assert "exited with code 3" in err.value.message()
        # Triton's model readiness: not ready while its stub is down ("Stub process ... is not healthy."), ready
        # again once the next request started a new one
        assert not client.is_model_ready("crasher")
        assert _how(client, 0) != second_pid
        assert client.is_model_ready("crasher")

        # A third crash within the window: the instance stays down, the model is not ready, with the reason.
        with pytest.raises(InferenceServerException):
            _how(client, 1)
        with pytest.raises(InferenceServerException) as err:
            _how(client, 0)
        assert err.value.status() == "StatusCode.UNAVAILABLE" and "crashed 3 times" in err.value.message()
        assert wait_until(lambda: not client.is_model_ready("crasher"))
        entry = next(m for m in client.get_model_repository_index().models if m.name == "crasher")
        assert entry.state == "UNAVAILABLE" and "crashed 3 times" in entry.reason
        ready = urllib.request.Request(f"http://{crash_server.http_url}/v2/models/crasher/ready")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(ready, timeout=10)
        assert answer.value.code == 400 and "crashed 3 times" in answer.value.read().decode()
        stop = True
        assert background.result(timeout=30) > 0
    assert client.is_model_ready("add_sub") and client.is_server_live()


def test_count_two_runs_two_worker_processes(server: ServerProcess) -> None:
    # add_sub has instance_group count 2: two concurrent slow calls overlap only with two processes.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: client.infer("add_sub", _add_sub_inputs(np.ones(4, np.float32),
                                                                        np.ones(4, np.float32))), range(8)))
    assert time.monotonic() - started < 30



# -- in-process hosting, unload and reload ------------------------------------------------------------------
IN_PROCESS = 'parameters { key: "hosting" value: { string_value: "in_process" } }\n'


CONTROLLER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                load = bool(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
                if load:
                    pb_utils.load_model("add_sub")
                else:
                    pb_utils.unload_model("add_sub")
                ready = pb_utils.is_model_ready("add_sub")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([int(ready)], dtype=np.int32))]))
            return out
"""


def test_in_process_hosting_and_unload_reload(tmp_path: Path) -> None:
    write_python_model(tmp_path, "add_sub", ADD_SUB, ADD_SUB_CONFIG)
    write_python_model(tmp_path, "add_sub_here", ADD_SUB, ADD_SUB_CONFIG.replace('"add_sub"', '"add_sub_here"')
                       + IN_PROCESS)
    write_python_model(tmp_path, "square_here", SQUARE, SQUARE_CONFIG + IN_PROCESS)
    write_python_model(tmp_path, "args_echo", ARGS_ECHO, ARGS_ECHO_CONFIG)
    write_python_model(tmp_path, "controller", CONTROLLER, FAILING_CONFIG)
    with ServerProcess(tmp_path, "--model-control-mode=explicit", "--load-model=*", "--model-control-allow-code",
                       "--log-level", "INFO") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        a, b = np.full(4, 3, np.float32), np.ones(4, np.float32)
        np.testing.assert_allclose(client.infer("add_sub_here", _add_sub_inputs(a, b)).as_numpy("OUTPUT0"), a + b)
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([2], dtype=np.int32))
        got = _stream(server, "square_here", [inp])
        assert [int(r.as_numpy("OUT")[0]) for r, _ in got if r.as_numpy("OUT") is not None] == [2, 2]

        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        worker_pid = json.loads(client.infer("args_echo", [x]).as_numpy("INFO")[0])["pid"]
        def control(load: int) -> int:
            flag = grpcclient.InferInput("X", [1], "INT32")
            flag.set_data_from_numpy(np.array([load], dtype=np.int32))
            return int(client.infer("controller", [flag]).as_numpy("Y")[0])

        # pb_utils.unload_model / load_model / is_model_ready from inside a model (explicit model control).
        assert control(0) == 0 and not client.is_model_ready("add_sub")
        assert control(1) == 1 and client.is_model_ready("add_sub")
        client.unload_model("add_sub")
        client.unload_model("args_echo")
        assert wait_until(lambda: "add_sub finalize" in server.output(), timeout=20)  # finalize() ran, logged
        assert wait_until(lambda: not Path(f"/proc/{worker_pid}").exists(), timeout=20)  # the worker is gone

        # Reload with new code: a new worker serves it.
        (tmp_path / "args_echo" / "1" / "model.py").write_text(
            textwrap.dedent(ARGS_ECHO).replace('self.args["pid"] = os.getpid()',
                                               'self.args["pid"] = os.getpid(); self.args["v"] = 2'))
        client.load_model("args_echo")
        info = json.loads(client.infer("args_echo", [x]).as_numpy("INFO")[0])
        assert info["v"] == 2 and info["pid"] != worker_pid


def identity_worker(tmp_path: Path, on_result: Any) -> Any:
    """A worker process serving an identity ``TritonPythonModel`` (IN -> OUT), loaded and initialized."""
    from fastoip.backends.python.hosting.worker_process import WorkerProcess

    folder = tmp_path / "identity" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
                        for r in requests]
    """))
    worker = WorkerProcess("identity", lambda *a: None, lambda cause: None, on_result=on_result)
    try:
        worker.control(channel.Load(str(folder / "model.py"), "identity", 1, 0))
        worker.control(channel.Initialize({}, False))
    except BaseException:
        worker.kill()
        raise
    return worker


def test_batches_of_one_loop_turn_go_out_together_and_one_that_cannot_be_sent_fails_alone(tmp_path: Path) -> None:
    """An event loop's turn of batches is encoded as one message; a batch that cannot be encoded (a parameter that
    is not plain data) fails with a clear error while the others of its turn are answered."""
    import asyncio

    from fastoip.pyworker import transport

    results: dict[int, tuple] = {}
    worker = identity_worker(tmp_path, lambda exec_id, responses, error, _again: results.__setitem__(exec_id,
                                                                                            (responses, error)))

    async def one_turn(exec_ids: tuple[int, ...], unpicklable: int = 0) -> None:
        for exec_id in exec_ids:
            data = np.full((1, 4), exec_id, dtype=np.float32)
            parameters = {"unpicklable": lambda: None} if exec_id == unpicklable else {}
            worker.submit(exec_id, [transport.pack_request(("", 0, 0, parameters, [("IN", "FP32", data)], ["OUT"],
                                                           None), worker.segments)], defer=True)
        for _ in range(600):
            if all(exec_id in results for exec_id in exec_ids):
                return
            await asyncio.sleep(0.05)

    try:
        asyncio.run(one_turn((1, 2, 3), unpicklable=2))
        asyncio.run(one_turn((4, 5, 6)))  # one Many message
        assert sorted(results) == [1, 2, 3, 4, 5, 6]
        for exec_id in (1, 3, 4, 5, 6):
            responses, error = results[exec_id]
            assert error is None
            ((_, _, packed),), _, _ = responses[0]
            np.testing.assert_array_equal(transport.unpack(packed, worker.segments),
                                          np.full((1, 4), exec_id, dtype=np.float32))
        responses, error = results[2]
        assert responses is None and "could not be sent to the worker" in error
    finally:
        worker.finalize()


def test_a_batch_over_the_frame_limit_fails_alone_and_the_channel_lives(tmp_path: Path) -> None:
    """A message longer than the channel's limit is never written (its length would be refused by the reader):
    its batch fails with the reason, sent alone or in an event loop's turn, and the next batch is answered."""
    import asyncio

    from fastoip.pyworker import transport

    results: dict[int, tuple] = {}
    worker = identity_worker(tmp_path, lambda exec_id, responses, error, _again: results.__setitem__(exec_id,
                                                                                            (responses, error)))
    worker._connection.limit = 4096  # (1 GiB in the server: a BYTES tensor larger than that)

    def request(size: int) -> Any:
        return transport.pack_request(("", 0, 0, {}, [("IN", "BYTES", np.array([b"x" * size], dtype=object))],
                                       ["OUT"], None), worker.segments)

    async def one_turn() -> None:
        worker.submit(2, [request(8000)], defer=True)
        worker.submit(3, [request(10)], defer=True)
        for _ in range(600):
            if 2 in results and 3 in results:
                return
            await asyncio.sleep(0.05)

    try:
        worker.submit(1, [request(8000)])
        assert results[1][0] is None and "over the channel's limit of 4096" in results[1][1]
        asyncio.run(one_turn())
        assert results[2][0] is None and "over the channel's limit" in results[2][1]
        responses, error = results[3]
        assert error is None
        ((_, _, packed),), _, _ = responses[0]
        assert transport.unpack(packed, worker.segments).tolist() == [b"x" * 10]
    finally:
        worker.finalize()


def test_large_tensor_crosses_through_shared_memory(tmp_path: Path) -> None:
    """A 602 KB tensor is written once into shared memory by each side and read as a view: no pickled copy."""
    import mmap

    from fastoip.pyworker import segments, transport

    results: queue.SimpleQueue = queue.SimpleQueue()
    worker = identity_worker(tmp_path, lambda exec_id, responses, error, _again: results.put((responses, error)))
    try:
        data = np.random.rand(1, 3, 224, 224).astype(np.float32)
        for round_ in range(3):
            before, made = transport.COPIED.bytes_to_shm, segments.MADE.segments
            packed = transport.pack_request(("", 0, 0, {}, [("IN", "FP32", data)], ["OUT"], None), worker.segments)
            assert transport.COPIED.bytes_to_shm - before == data.nbytes == 602_112  # one copy in
            assert packed[4][0][2][0] == "m"  # the message names a shared-memory segment, it carries no data
            if round_:
                assert segments.MADE.segments == made  # the segments of the last round are reused, both ways
            worker.submit(round_ + 1, [packed])
            responses, error = results.get(timeout=60)
            assert error is None
            ((name, datatype, out_packed),), _, _ = responses[0]
            assert out_packed[0] == "m"
            out = transport.unpack(out_packed, worker.segments)  # (an index of that worker's, checked)
            root = out
            while isinstance(root, np.ndarray):
                root = root.base
            if isinstance(root, memoryview):
                root = root.obj
            assert isinstance(root, mmap.mmap)  # a view on the worker's shared memory, not a copy
            np.testing.assert_array_equal(out, data)
            del out, root  # the worker may reuse its segment now
    finally:
        worker.finalize()


SLOW = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(1.5)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())]) for r in requests]

        def finalize(self):
            pb_utils.Logger.log_warn("slow finalize")
"""


def test_sigterm_drains_requests_in_flight_on_workers(tmp_path: Path) -> None:
    write_python_model(tmp_path, "slow", SLOW, FAILING_CONFIG + "instance_group [ { count: 3 } ]\n")
    server = ServerProcess(tmp_path, "--shutdown-grace", "1").start()
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def one(i: int) -> int:
            x = grpcclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([i], dtype=np.int32))
            return int(grpcclient.InferenceServerClient(server.grpc_url).infer("slow", [x]).as_numpy("Y")[0])

        assert client.is_model_ready("slow")
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(one, i) for i in range(3)]
            time.sleep(0.5)
            # To the server's whole process group (it leads one), workers included, as a shell's ^C would.
            os.killpg(server.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
            assert [f.result(timeout=30) for f in futures] == [0, 1, 2]
        assert server.wait(30) == 0
        assert server.output().count("slow finalize") == 3
    finally:
        server.stop()


# -- several embedded servers in one process: BLS stays with the server that loaded the model ---------------
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

WHOAMI_CONFIG = """
    backend: "python"
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

WHOAMI_IN_PROCESS = WHOAMI_CONFIG + """
    parameters { key: "hosting" value: { string_value: "in_process" } }
"""


def write_whoami_repository(root: Path, number: int) -> Path:
    write_python_model(root, "whoami", WHOAMI.replace("{number}", str(number)), WHOAMI_CONFIG)
    write_python_model(root, "ask", ASK, WHOAMI_CONFIG)  # a worker process
    write_python_model(root, "ask_in_process", ASK, WHOAMI_IN_PROCESS)  # in the server process
    return root


def ask(server: fastoip.Server, model: str) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))
    return int(client.infer(model, [x]).as_numpy("Y")[0])


def test_two_embedded_servers_each_get_their_own_bls_calls(tmp_path: Path) -> None:
    first = write_whoami_repository(tmp_path / "first", 1)
    second = write_whoami_repository(tmp_path / "second", 2)
    with fastoip.Server(first, http=False) as one, fastoip.Server(second, http=False) as two:
        for model in ("ask", "ask_in_process"):
            assert ask(one, model) == 1, model  # the first server's whoami, though the second was built last
            assert ask(two, model) == 2, model
        client = grpcclient.InferenceServerClient(one.grpc_url)
        stats = client.get_inference_statistics("whoami").model_stats
        assert sum(s.inference_stats.success.count for s in stats) == 2  # both inner requests counted here


# -- BLS child traces --------------------------------------------------------------------------------------
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

"""python_backend behaviours of a model's worker that Triton's own QA reads (issue 41, the "qaworker" items).

Each model here is written for the behaviour it checks, after python_backend's request_executor.cc, pb_stub.cc
and python_be.cc, and Triton core's sequence batcher; no Triton file is needed.  One real fastoip serves them;
tritonclient drives it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

FP32_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
"""
DECOUPLED = "model_transaction_policy { decoupled: true }"
IN_PROCESS = 'parameters { key: "hosting" value: { string_value: "in_process" } }'


def write_model(root: Path, name: str, source: str, extra: str = "", config: str = FP32_CONFIG) -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config.format(name=name, extra=extra)))


def _input(values: list[float]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return [tensor]


# -- item 1: exec(decoupled=True)'s empty last response ----------------------------------------------------------
# A decoupled model that sends INPUT0[0] responses, then its final flag: alone (python_backend's square example),
# or with its last response (INPUT0[1] == 1).
REPEATER = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                sender = request.get_response_sender()
                count, final_with_last = int(x[0]), len(x) > 1 and x[1] == 1
                for i in range(count):
                    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])
                    if final_with_last and i == count - 1:
                        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        sender.send(response)
                if not final_with_last:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""
# Counts what exec(decoupled=True) yields into {target}: [responses, responses without outputs, last is empty].
BLS_COUNTS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                call = pb_utils.InferenceRequest(model_name="{target}", requested_output_names=["OUTPUT0"],
                                                 inputs=[pb_utils.Tensor("INPUT0", x)])
                responses = list(call.exec(decoupled=True))
                empty = [r for r in responses if not r.output_tensors() and not r.has_error()]
                last_empty = float(bool(responses) and not responses[-1].output_tensors())
                counted = np.array([len(responses), len(empty), last_empty], dtype=np.float32)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", counted)]))
            return out
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_worker")
    write_model(root, "repeater", REPEATER, DECOUPLED)
    write_model(root, "repeater_in_process", REPEATER, DECOUPLED + "\n" + IN_PROCESS)
    write_model(root, "bls_counts", BLS_COUNTS.replace("{target}", "repeater"))
    write_model(root, "bls_counts_in_process", BLS_COUNTS.replace("{target}", "repeater_in_process"), IN_PROCESS)
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo) as proc:
        yield proc


@pytest.mark.parametrize("model", ["bls_counts", "bls_counts_in_process"])
def test_decoupled_bls_iterator_yields_tritons_empty_last_response_for_a_final_flag_alone(
    server: ServerProcess, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # two responses, then the final flag alone: Triton's iterator yields three, the last one empty
    assert client.infer(model, _input([2.0, 0.0])).as_numpy("OUTPUT0").tolist() == [3.0, 1.0, 1.0]
    # no response at all, only the final flag: one empty response
    assert client.infer(model, _input([0.0, 0.0])).as_numpy("OUTPUT0").tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("model", ["bls_counts", "bls_counts_in_process"])
def test_decoupled_bls_iterator_ends_with_the_last_response_when_the_final_flag_came_with_it(
    server: ServerProcess, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # three responses, the last one carrying the final flag: no empty response after it (as in Triton)
    assert client.infer(model, _input([3.0, 1.0])).as_numpy("OUTPUT0").tolist() == [3.0, 0.0, 0.0]


# -- item 3: a model's own is_ready() (python_backend newer than 2.51) --------------------------------------------
# Its answer comes from the config (as Triton's QA readiness_model.py): "true", "false", "exception", "non_boolean",
# "coroutine"; DELAY seconds before it answers.
READINESS = """
    import asyncio
    import json
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            params = json.loads(args["model_config"]).get("parameters", {})
            self.answer = params["ANSWER"]["string_value"]
            self.delay = float(params["DELAY"]["string_value"])

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]

        def is_ready(self):
            time.sleep(self.delay)
            if self.answer == "exception":
                raise RuntimeError("the model's own check failed")
            if self.answer == "non_boolean":
                return "ready"
            if self.answer == "coroutine":
                async def answer():
                    await asyncio.sleep(0.01)
                    return True
                return answer()
            return self.answer == "true"
"""
# A decoupled model busy in execute (0.1 s per response) whose is_ready() takes 0.2 s: readiness is answered
# while execute runs (python_backend answers it on the stub's own thread).
BUSY_DECOUPLED = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = request.inputs()[0].as_numpy()
                sender = request.get_response_sender()
                for _ in range(int(x[0])):
                    time.sleep(0.1)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None

        def is_ready(self):
            time.sleep(0.2)
            return True
"""

PLAIN = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""

# Answers its worker's process id.
MORTAL = """
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], np.float32))])
                    for _ in requests]
"""

# Its is_ready() writes a pickle onto the readiness socket, where the server expects a Readiness record.
READY_LIAR = """
    import os, pickle, struct, sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    READINESS = int(sys.orig_argv[sys.orig_argv.index("fastoip.pyworker") + 2])

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], np.float32))])
                    for _ in requests]

        def is_ready(self):
            payload = pickle.dumps(("readiness", True))
            os.write(READINESS, struct.pack("!I", len(payload)) + payload)
            return True
"""


def _readiness_params(answer: str, delay: float) -> str:
    return (f'parameters {{ key: "ANSWER" value: {{ string_value: "{answer}" }} }}\n'
            f'parameters {{ key: "DELAY" value: {{ string_value: "{delay}" }} }}')


@pytest.fixture(scope="module")
def readiness_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("triton_readiness")
    for answer in ("true", "false", "exception", "non_boolean", "coroutine"):
        write_model(root, f"ready_{answer}", READINESS, _readiness_params(answer, 0.05))
    write_model(root, "ready_slow", READINESS, _readiness_params("true", 7.0))
    write_model(root, "ready_false_in_process", READINESS, _readiness_params("false", 0.05) + "\n" + IN_PROCESS)
    write_model(root, "busy_decoupled", BUSY_DECOUPLED, DECOUPLED)
    write_model(root, "plain", PLAIN)  # no is_ready(): ready, and asked once only
    write_model(root, "mortal", MORTAL, "instance_group [{ kind: KIND_CPU }]")
    write_model(root, "ready_liar", READY_LIAR)
    # (the models that are not ready keep the server not ready: Triton's QA starts it with this flag too)
    with ServerProcess(root, "--strict-readiness=false", http=True) as proc:
        yield proc


@pytest.mark.parametrize("model,ready", [
    ("ready_true", True), ("ready_false", False), ("ready_exception", False), ("ready_non_boolean", False),
    ("ready_coroutine", True), ("ready_false_in_process", False), ("plain", True),
])
def test_model_readiness_asks_the_models_own_is_ready(readiness_server: ServerProcess, model: str,
                                                     ready: bool) -> None:
    import tritonclient.http as httpclient

    grpc = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    http = httpclient.InferenceServerClient(readiness_server.http_url)
    for _ in range(3):  # each request asks again (not cached)
        assert grpc.is_model_ready(model) is ready
        assert http.is_model_ready(model) is ready
    # inference does not depend on it
    assert grpc.infer(model, _input([4.0])).as_numpy("OUTPUT0").tolist() == [4.0]


def test_model_readiness_logs_why_a_model_is_not_ready(readiness_server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    assert not grpc.is_model_ready("ready_false")
    assert not grpc.is_model_ready("ready_exception")
    assert not grpc.is_model_ready("ready_non_boolean")
    output = readiness_server.output()
    # (the instance's name as Triton names it: a config without instance_group gets one group named after the model)
    assert "Model 'ready_false' version 1 is not ready: Model 'ready_false_0' is not ready (user-defined check " \
           "failed)." in output
    assert "Model 'ready_exception' version 1 is not ready: RuntimeError: the model's own check failed" in output
    assert "Model 'ready_non_boolean' version 1 is not ready: is_ready() must return a boolean value" in output


def test_a_slow_is_ready_times_out_and_the_next_request_shares_the_check_on_its_way(
    readiness_server: ServerProcess
) -> None:
    import time

    grpc = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    started = time.monotonic()
    assert not grpc.is_model_ready("ready_slow")  # 5 s, then not ready: the check (7 s) goes on
    assert 4.5 < time.monotonic() - started < 20.0
    # waits for that same check (about 2 s more): a second check would take 7 s, past the 5 s bound, and say no
    assert grpc.is_model_ready("ready_slow")
    assert "Timed out waiting for user-defined is_ready() response" in readiness_server.output()


def test_is_ready_is_answered_while_execute_runs(readiness_server: ServerProcess) -> None:
    import queue
    import time

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("busy_decoupled", _input([60.0]))  # 6 s in execute
        answers.get(timeout=30)  # execute is running
        started = time.monotonic()
        checker = grpcclient.InferenceServerClient(readiness_server.grpc_url)
        assert checker.is_model_ready("busy_decoupled")
        assert time.monotonic() - started < 4.0  # not after execute's 6 s
    finally:
        client.stop_stream()


def test_a_dead_worker_makes_its_model_not_ready_until_it_is_started_again(readiness_server: ServerProcess) -> None:
    import os
    import signal
    import time

    grpc = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    pid = int(grpc.infer("mortal", _input([0.0])).as_numpy("OUTPUT0")[0])
    assert grpc.is_model_ready("mortal")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while grpc.is_model_ready("mortal") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not grpc.is_model_ready("mortal")
    # Triton's words (its model_readiness QA greps them), the instance named as Triton names it
    words = "Model 'mortal' version 1 is not ready: Stub process 'mortal_0_0' is not healthy."
    assert words in readiness_server.output()
    # the next request starts a new worker (Triton restarts its stub so): ready again
    assert int(grpc.infer("mortal", _input([0.0])).as_numpy("OUTPUT0")[0]) != pid
    assert grpc.is_model_ready("mortal")


# -- item 2: request rescheduling ----------------------------------------------------------------------------------
ITERATIVE = "sequence_batching { iterative_sequence: true }"
# Triton's iterative_sequence pattern: INPUT0[0] responses counting down, one per run; every run but the last
# releases the request with RESCHEDULE; the model keeps the count between runs.  OUTPUT0 = [remaining, flags].
COUNTDOWN = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.remaining = {}

        def execute(self, requests):
            for request in requests:
                key = request.correlation_id()
                if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                    self.remaining[key] = int(request.inputs()[0].as_numpy()[0])
                self.remaining[key] -= 1
                left = self.remaining[key]
                out = pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", np.array([left, request.flags()], np.float32))])
                sender = request.get_response_sender()
                if left <= 0:
                    sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    sender.send(out)
            return None
"""
# Triton's request_rescheduling_addsub pattern: the model's first request is rescheduled (None in the list),
# and answered on its second run.  OUTPUT0 = [INPUT0 * 2, runs so far].
TWICE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.runs = 0

        def execute(self, requests):
            responses = []
            for request in requests:
                self.runs += 1
                x = request.inputs()[0].as_numpy()
                if self.runs == 1:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    responses.append(None)
                else:
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUTPUT0", np.array([x[0] * 2, self.runs], np.float32))]))
            return responses
"""
# Rescheduled, yet it returns a response (Triton's wrong_return_type): refused in the stub's words.
RESCHEDULED_WITH_RESPONSE = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""
# Rescheduled by a model without an iterative sequence batcher: nowhere to run again.
RESCHEDULED_NOWHERE = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [None for _ in requests]
"""
# BLS into the countdown (Triton's bls_request_rescheduling test_decoupled_e2e): OUTPUT0 = the values it got.
BLS_COUNTDOWN = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                call = pb_utils.InferenceRequest(model_name="countdown", requested_output_names=["OUTPUT0"],
                                                 inputs=[request.inputs()[0]])
                got = [float(r.output_tensors()[0].as_numpy()[0]) for r in call.exec(decoupled=True)
                       if not r.has_error() and r.output_tensors()]
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array(got, np.float32))]))
            return out
"""


@pytest.fixture(scope="module")
def rescheduling_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("triton_rescheduling")
    write_model(root, "countdown", COUNTDOWN, DECOUPLED + "\n" + ITERATIVE)
    write_model(root, "countdown_in_process", COUNTDOWN, DECOUPLED + "\n" + ITERATIVE + "\n" + IN_PROCESS)
    write_model(root, "twice", TWICE, ITERATIVE)
    write_model(root, "twice_in_process", TWICE, ITERATIVE + "\n" + IN_PROCESS)
    write_model(root, "rescheduled_with_response", RESCHEDULED_WITH_RESPONSE, ITERATIVE)
    write_model(root, "rescheduled_nowhere", RESCHEDULED_NOWHERE)
    write_model(root, "rescheduled_nowhere_sequence", RESCHEDULED_NOWHERE, "sequence_batching { }")
    write_model(root, "bls_countdown", BLS_COUNTDOWN)
    with ServerProcess(root) as proc:
        yield proc


def _stream_all(server: ServerProcess, model: str, values: list[float], **kwargs: object) -> list[object]:
    import queue
    import threading

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put(error if error is not None else result))
    client.async_stream_infer(model, _input(values), **kwargs)  # type: ignore[arg-type]
    stopper = threading.Thread(target=client.stop_stream)  # waits for the request's stream to end
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive(), f"the stream to {model} never ended"
    return list(answers.queue)


@pytest.mark.parametrize("model", ["countdown", "countdown_in_process"])
def test_a_rescheduled_decoupled_request_runs_again_until_it_finishes(
    rescheduling_server: ServerProcess, model: str
) -> None:
    got = _stream_all(rescheduling_server, model, [3.0])  # no sequence id: the batcher names the sequence
    values = [r.as_numpy("OUTPUT0").tolist() for r in got]  # type: ignore[attr-defined]
    # remaining 2, 1, 0; START on the first run only, as Triton's generative sequencer sets the flags
    assert values == [[2.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    # two sequences at once, each its own
    got = _stream_all(rescheduling_server, model, [2.0]) + _stream_all(rescheduling_server, model, [1.0])
    assert [r.as_numpy("OUTPUT0").tolist()[0] for r in got] == [1.0, 0.0, 0.0]  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", ["twice", "twice_in_process"])
def test_a_rescheduled_request_is_answered_by_its_next_run(rescheduling_server: ServerProcess, model: str) -> None:
    client = grpcclient.InferenceServerClient(rescheduling_server.grpc_url)
    assert client.infer(model, _input([5.0])).as_numpy("OUTPUT0").tolist() == [10.0, 2.0]
    assert client.infer(model, _input([6.0])).as_numpy("OUTPUT0").tolist() == [12.0, 3.0]


def test_a_rescheduled_request_with_a_response_gets_tritons_error(rescheduling_server: ServerProcess) -> None:
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(rescheduling_server.grpc_url)
    with pytest.raises(InferenceServerException, match="Expected a None object in the execute function return list "
                                                       "for reschduled request"):
        client.infer("rescheduled_with_response", _input([1.0]))


@pytest.mark.parametrize("model", ["rescheduled_nowhere", "rescheduled_nowhere_sequence"])
def test_rescheduling_without_an_iterative_sequence_batcher_fails_the_request_saying_why(
    rescheduling_server: ServerProcess, model: str
) -> None:
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(rescheduling_server.grpc_url)
    kwargs = {"sequence_id": 7, "sequence_start": True, "sequence_end": True} if "sequence" in model else {}
    with pytest.raises(InferenceServerException, match="Request is released with "
                                                       "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"):
        client.infer(model, _input([1.0]), **kwargs)  # type: ignore[arg-type]
    assert client.is_model_ready(model)


def test_bls_into_a_rescheduling_model_streams_every_run(rescheduling_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(rescheduling_server.grpc_url)
    assert client.infer("bls_countdown", _input([3.0])).as_numpy("OUTPUT0").tolist() == [2.0, 1.0, 0.0]


def test_a_worker_that_lies_on_its_readiness_socket_is_ended_and_restarted(readiness_server: ServerProcess) -> None:
    import time

    grpc = grpcclient.InferenceServerClient(readiness_server.grpc_url)
    pid = int(grpc.infer("ready_liar", _input([0.0])).as_numpy("OUTPUT0")[0])
    began = time.monotonic()
    assert not grpc.is_model_ready("ready_liar")  # its answer is not a record: the worker is ended
    # (promptly: the loop that holds the worker's socket is free to read its end; 10 s when it is not)
    assert time.monotonic() - began < 5.0
    assert "a readiness answer that is not one" in readiness_server.output()
    # the server lives on, and the next request starts a new worker
    assert int(grpc.infer("ready_liar", _input([0.0])).as_numpy("OUTPUT0")[0]) != pid
    assert grpc.is_model_ready("plain")

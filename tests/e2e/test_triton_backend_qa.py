"""What Triton's own Python-backend QA (qa/L0_backend_python) checks, each as a test of its own (issue 41).

No Triton file is needed: each model here is written for the behaviour it checks, after reading
python_backend's pb_stub.cc / python_be.cc for the semantics.  One real fastoip serves them; tritonclient
drives it.
"""

from __future__ import annotations

import queue
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

IDENTITY_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
"""


def write_model(root: Path, name: str, files: dict[str, str], extra: str = "") -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, source in files.items():
        (folder / file_name).write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_CONFIG.format(name=name, extra=extra)))


# python_backend's stub imports "<version>.model" with the version folder on sys.path: a helper beside model.py
# imports absolutely and relatively (Triton's multi_file model), and the model's own file imports again as
# "model" at execute time (Triton's QA models run unittest.main("model")).
MULTI_FILE = {
    "helper_abs.py": 'WORD = "absolute"\n',
    "helper_rel.py": 'WORD = "relative"\n',
    "model.py": """
        import helper_abs
        import triton_python_backend_utils as pb_utils
        import numpy as np

        from . import helper_rel

        MARK = np.float32(7)

        class TritonPythonModel:
            def initialize(self, args):
                if helper_abs.WORD != "absolute" or helper_rel.WORD != "relative":
                    raise pb_utils.TritonModelException("imports beside model.py do not work")

            def execute(self, requests):
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + MARK)]))
                return out
    """,
}
SELF_IMPORT = {
    "model.py": """
        import triton_python_backend_utils as pb_utils
        import numpy as np

        MARK = np.float32(5)

        class TritonPythonModel:
            def execute(self, requests):
                import sys

                import model
                if sys.argv != [""]:  # the stub's argv (unittest.main("model") reads it for test names)
                    raise pb_utils.TritonModelException(f"sys.argv is {sys.argv}")
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + model.MARK)]))
                return out
    """,
}


# A non-decoupled model answering through get_response_sender(), as Triton's response_sender QA model does;
# INPUT0[0] says how: 0 sends before execute returns (and returns None), 1 sends from a thread after it
# returned, 2 sends the final flag with no response (refused), 3 sends and also returns a response (the sent
# one stands, the returned one is refused), 4 returns its response as usual.
SENDER = {
    "model.py": """
        import threading
        import time
        import triton_python_backend_utils as pb_utils

        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def answer(x, plus):
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + plus)])

        class TritonPythonModel:
            def execute(self, requests):
                returned = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    how = int(x[0])
                    sender = request.get_response_sender()
                    if how == 0:
                        sender.send(answer(x, 100))
                        sender.send(flags=FINAL)
                        returned.append(None)
                    elif how == 1:
                        def later(sender=sender, x=x):
                            time.sleep(0.3)
                            sender.send(answer(x, 200), flags=FINAL)
                        threading.Thread(target=later).start()
                        returned.append(None)
                    elif how == 2:
                        sender.send(flags=FINAL)
                    elif how == 3:
                        sender.send(answer(x, 300), flags=FINAL)
                        returned.append(answer(x, 400))
                    else:
                        returned.append(answer(x, 500))
                return returned
    """,
}
# The same as an async def execute (its sends run on the worker's event loop, not on the thread that took the batch).
SENDER_ASYNC = {"model.py": SENDER["model.py"].replace("def execute(", "async def execute(")}
# A decoupled model that returns responses from execute: Triton answers with an error and ends the stream.
DECOUPLED_RETURNS = {
    "model.py": """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
    """,
}
# async def execute of a decoupled model: each call awaits INPUT0[0] seconds, then answers through its sender;
# a negative wait raises after the stream's final flag (Triton logs the traceback).
ASYNC_DECOUPLED = {
    "model.py": """
        import asyncio
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                waits = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                    if x[0] < 0:
                        request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        raise ValueError("wait_secs cannot be negative")
                    waits.append((request.get_response_sender(), x))
                await asyncio.gather(*(asyncio.sleep(float(x[0])) for _, x in waits))
                for sender, x in waits:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """,
}
# A response whose error is TritonError.UNKNOWN: Triton's gRPC status UNKNOWN, HTTP 500.
UNKNOWN_ERROR = {
    "model.py": """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                error = pb_utils.TritonError("error code: UNKNOWN", pb_utils.TritonError.UNKNOWN)
                return [pb_utils.InferenceResponse(error=error) for _ in requests]
    """,
}
DECOUPLED = "model_transaction_policy { decoupled: true }"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_qa")
    write_model(root, "multi_file", MULTI_FILE)
    write_model(root, "self_import", SELF_IMPORT)
    write_model(root, "sender", SENDER)
    write_model(root, "sender_async", SENDER_ASYNC)
    in_process = 'parameters { key: "hosting" value: { string_value: "in_process" } }'
    write_model(root, "sender_in_process", SENDER, in_process)
    write_model(root, "decoupled_returns", DECOUPLED_RETURNS, DECOUPLED)
    write_model(root, "unknown_error", UNKNOWN_ERROR)
    write_model(root, "idle", SELF_IMPORT)  # never asked: its counters are there from load
    write_model(root, "async_decoupled", ASYNC_DECOUPLED, DECOUPLED)
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo, http=True, metrics=True) as proc:
        yield proc


def _input(values: list[float]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return [tensor]


def test_model_file_imports_files_beside_it_and_itself_as_model(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("multi_file")
    result = client.infer("multi_file", _input([1.0, 2.0]))
    assert result.as_numpy("OUTPUT0").tolist() == [8.0, 9.0]
    result = client.infer("self_import", _input([1.0]))
    assert result.as_numpy("OUTPUT0").tolist() == [6.0]


@pytest.mark.parametrize("model", ["sender", "sender_async", "sender_in_process"])
def test_non_decoupled_model_answers_through_its_response_sender(server: ServerProcess, model: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.infer(model, _input([0.0])).as_numpy("OUTPUT0").tolist() == [100.0]
    assert client.infer(model, _input([1.0])).as_numpy("OUTPUT0").tolist() == [201.0]
    with pytest.raises(InferenceServerException, match="Non-decoupled model cannot send complete final before"):
        client.infer(model, _input([2.0]))
    for _ in range(30):  # (the sent answer must reach the server before the batch's error: each time)
        assert client.infer(model, _input([3.0])).as_numpy("OUTPUT0").tolist() == [303.0]  # the sent one stands
    assert client.infer(model, _input([4.0])).as_numpy("OUTPUT0").tolist() == [504.0]
    assert client.is_model_ready(model)


def _stream(server: ServerProcess, model: str, requests: list[list[float]], timeout: float = 30.0) -> list[Any]:
    """Every callback of a stream that sends ``requests``, read once the stream ended (stop_stream returned)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put((time.monotonic(), result, error)))
    started = time.monotonic()
    for values in requests:
        client.async_stream_infer(model, _input(values))
    stopper = threading.Thread(target=client.stop_stream)  # waits for every request's stream to end
    stopper.start()
    stopper.join(timeout)
    assert not stopper.is_alive(), f"the stream to {model} never ended"
    return [(at - started, result, error) for at, result, error in list(answers.queue)]


def test_decoupled_model_returning_responses_gets_tritons_error_and_its_stream_ends(server: ServerProcess) -> None:
    (_, result, error), = _stream(server, "decoupled_returns", [[1.0]])
    assert result is None
    # python_backend's sentence, naming the instance as the stub names itself
    assert ("Python model 'decoupled_returns_0' is using the decoupled mode and the execute function must return None."
            in error.message()), error.message()


def test_async_decoupled_execute_overlaps_its_calls(server: ServerProcess) -> None:
    answers = _stream(server, "async_decoupled", [[1.5]] * 4)
    assert [error for _, _, error in answers] == [None] * 4
    # one after the other they would end at 1.5, 3, 4.5 and 6 s; overlapped, all near 1.5 s
    assert max(at for at, _, _ in answers) < 3.0, [at for at, _, _ in answers]


def test_async_decoupled_execute_failure_is_logged_with_its_traceback(server: ServerProcess) -> None:
    _stream(server, "async_decoupled", [[-1.0]])
    deadline = time.monotonic() + 10
    while "ValueError: wait_secs cannot be negative" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ValueError: wait_secs cannot be negative" in server.output()
    assert "Traceback" in server.output()


def test_triton_error_unknown_is_status_unknown_as_triton_maps_it(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("unknown_error", _input([1.0]))
    assert str(raised.value) == "[StatusCode.UNKNOWN] error code: UNKNOWN"  # Triton's lifecycle QA reads it so
    http = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:
        http.infer("unknown_error", [tensor])
    assert raised.value.status() == "500"


def test_failure_counters_exist_at_zero_from_load_in_tritons_label_order(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert f'nv_inference_request_failure{{model="idle",reason="{reason}",version="1"}} 0' in text



# -- loading: one explicit-mode server whose models fail as Triton's QA models do ---------------------------------
BLS_IN_INITIALIZE = {
    "model.py": """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                pb_utils.InferenceRequest(model_name="anything", inputs=[pb_utils.Tensor("IN", np.zeros(1))],
                                          requested_output_names=["OUT"]).exec()

            def execute(self, requests):
                return None
    """,
}
BLS_IN_FINALIZE = {
    "model.py": """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return None

            def finalize(self):
                try:
                    pb_utils.InferenceRequest(model_name="anything", inputs=[pb_utils.Tensor("IN", np.zeros(1))],
                                              requested_output_names=["OUT"]).exec()
                except pb_utils.TritonModelException as exc:
                    pb_utils.Logger.log_error(f"finalize: {exc.message()}")
    """,
}
EXITS_IN_INITIALIZE = {
    "model.py": """
        import os
        import signal

        class TritonPythonModel:
            def initialize(self, args):
                os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would

            def execute(self, requests):
                return None
    """,
}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("triton_qa_explicit")
    write_model(root, "bls_init_error", BLS_IN_INITIALIZE)
    write_model(root, "bls_finalize_error", BLS_IN_FINALIZE)
    write_model(root, "init_exit", EXITS_IN_INITIALIZE, "instance_group [{ kind: KIND_CPU }]")  # as Triton's
    write_model(root, "non_existent_model", {})  # a version folder without model.py
    with ServerProcess(root, "--model-control-mode=explicit", http=True) as proc:
        yield proc


def test_bls_in_initialize_is_refused_with_tritons_words(explicit_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    with pytest.raises(InferenceServerException, match="BLS is only supported during the 'execute' function."):
        client.load_model("bls_init_error")


def test_bls_in_finalize_is_refused_with_tritons_words(explicit_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    client.load_model("bls_finalize_error")
    client.unload_model("bls_finalize_error", unload_dependents=False)
    deadline = time.monotonic() + 20
    said = "finalize: BLS is only supported during the 'execute' function."
    while said not in explicit_server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said in explicit_server.output()


def test_worker_dying_in_initialize_names_the_stub_as_triton_does(explicit_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("init_exit")
    assert "Stub process 'init_exit_0_0' is not healthy." in str(raised.value)  # Triton's QA greps it
    assert "SIGKILL" in str(raised.value)  # and how it ended


def test_a_version_folder_without_model_py_logs_pythons_backend_words_with_the_path(
    explicit_server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("non_existent_model")
    root = Path(explicit_server.args[explicit_server.args.index("--model-repository") + 1])
    assert str(root) not in str(raised.value)  # the client's error never carries the server's paths
    said = ("Failed to preinitialize Python stub: Python model file not found in "
            f"'{(root / 'non_existent_model' / '1' / 'model.py').absolute()}'")
    deadline = time.monotonic() + 10
    while said not in explicit_server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said in explicit_server.output()  # the operator's log does (Triton's QA greps it)

"""Python worker processes cannot harm the server or each other (issue 36): a worker that lies on its channel
(a pickle that would run code, a forged record, a 4 GiB frame length) is killed with the cause logged and
restarted; a worker that forks and dies is noticed by its exit; a model's many waiting BLS calls do not starve
another model's; a BLS call to the calling model itself is refused, not a deadlock; a slow BLS consumer of a
decoupled stream never stalls the gRPC frontend's event loop."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from models import identity_model_bytes, write_model
from python_models import write_python_model
from serverproc import ServerProcess, wait_until

HOW_CONFIG = """
    backend: "python"
    input [ { name: "HOW" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

#: A model that writes on its worker's channel to the server (the socket is the fd after `-m fastoip.pyworker`
#: in the worker's own argv: python_backend's stub leaves sys.argv [""]).
LIAR = """
    import os, pickle, struct, sys, time
    import msgpack
    import numpy as np
    import triton_python_backend_utils as pb_utils

    MARKER = os.path.join(os.path.dirname(__file__), "pwned")

    class Exploit:
        def __reduce__(self):  # what pickle.loads in the server would run
            return (os.system, (f"touch {MARKER}",))

    CHANNEL = int(sys.orig_argv[sys.orig_argv.index("fastoip.pyworker") + 1])

    def frame(payload):
        os.write(CHANNEL, struct.pack("!I", len(payload)) + payload)

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                how = int(pb_utils.get_input_tensor_by_name(request, "HOW").as_numpy()[0])
                if how == 1:
                    frame(pickle.dumps(("result", 1, Exploit(), None)))
                    time.sleep(60)
                elif how == 2:  # a batch to the server (a record only the server sends), fields of the wrong type
                    frame(msgpack.packb([4, "exec", [["x"]]]))
                    time.sleep(60)
                elif how == 3:  # a 4 GiB frame that never comes
                    os.write(CHANNEL, b"\\xff\\xff\\xff\\xff")
                    time.sleep(60)
                elif how == 5:  # a BLS request whose input names a segment the server never made for it
                    from fastoip.pyworker import channel
                    forged = ["", 0, 0, {}, [["HOW", "INT32", ["m", 99999, "<i4", [1]]]], ["PID"], None]
                    frame(channel.encode(channel.InferCall(1 << 40, "identity", None, forged, 0, False)))
                    time.sleep(60)
                elif how == 4:  # fork, then die: the child keeps the channel open
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                    os._exit(5)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
            return out
"""

#: SLEEPER: answers after 0.3 s (one instance: BLS calls to it wait in its queue).
SLEEPER = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.3)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([0], np.int64))]) for _ in requests]
"""

#: FANOUT: 40 BLS calls at once to the sleeper, from 40 threads.
FANOUT = """
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def call(_):
        request = pb_utils.InferenceRequest(
            model_name="sleeper", requested_output_names=["PID"],
            inputs=[pb_utils.Tensor("HOW", np.array([0], np.int32))])
        return request.exec().has_error()

    class TritonPythonModel:
        def execute(self, requests):
            with ThreadPoolExecutor(40) as pool:
                errors = sum(pool.map(call, range(40)))
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([errors], np.int64))])
                    for _ in requests]
"""

#: CALLER: one BLS call to the model HOW names: 0 the ONNX identity, 1 itself.
CALLER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                how = int(pb_utils.get_input_tensor_by_name(request, "HOW").as_numpy()[0])
                if how == 1:
                    bls = pb_utils.InferenceRequest(model_name="caller", requested_output_names=["PID"],
                                                    inputs=[pb_utils.Tensor("HOW", np.array([0], np.int32))])
                else:
                    bls = pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUTPUT0"],
                                                    inputs=[pb_utils.Tensor("INPUT0", np.array([[7]], np.int32))])
                response = bls.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException("BLS: " + response.error().message())
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([7], np.int64))]))
            return out
"""

#: GUSH: decoupled; IN = n answers n responses of 4 KiB each (inline in their messages), at once.
GUSH = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                sender = request.get_response_sender()
                for i in range(n):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.full(1024, i, dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

GUSH_CONFIG = """
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

#: SIPPER: reads gush's 300 responses through BLS, slowly (a consumer that does not keep up: 15 s).
SIPPER = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                bls = pb_utils.InferenceRequest(model_name="gush", requested_output_names=["OUT"],
                                                inputs=[pb_utils.Tensor("IN", np.array([300], np.int32))])
                count = 0
                for response in bls.exec(decoupled=True):
                    if response.output_tensors():
                        count += 1
                        time.sleep(0.05)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([count], np.int64))]))
            return out
"""


LIARS = ("liar_pickle", "liar_forged", "liar_frame", "liar_fork", "liar_segment")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("isolation")
    for name in LIARS:  # one each: a model that crashes 3 times within a minute stays down
        write_python_model(root, name, LIAR, HOW_CONFIG)
    write_python_model(root, "sleeper", SLEEPER, HOW_CONFIG)
    write_python_model(root, "fanout", FANOUT, HOW_CONFIG)
    write_python_model(root, "caller", CALLER, HOW_CONFIG)
    write_python_model(root, "gush", GUSH, GUSH_CONFIG)
    write_python_model(root, "sipper", SIPPER, HOW_CONFIG)
    write_model(root, "identity", identity_model_bytes(TensorProto.INT32, [1]))
    return root


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with ServerProcess(repo) as proc:
        yield proc


def _how(url: str, how: int, model: str, timeout: float = 60.0) -> int:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("HOW", [1], "INT32")
    x.set_data_from_numpy(np.array([how], dtype=np.int32))
    return int(client.infer(model, [x], client_timeout=timeout).as_numpy("PID")[0])


@pytest.mark.parametrize(
    ("model", "how", "logged"),
    [
        ("liar_pickle", 1, "a frame that is not a record"),
        ("liar_forged", 2, "a frame that is not a record"),
        ("liar_frame", 3, "a frame over the limit"),
        ("liar_segment", 5, "a segment it may not use"),  # issue 36: segments by index, checked
    ],
    ids=["pickle", "forged", "4GiB-frame", "segment-index"],
)
def test_a_worker_that_lies_on_its_channel_is_killed_logged_and_restarted(
    server: ServerProcess, repo: Path, model: str, how: int, logged: str
) -> None:
    before = _how(server.grpc_url, 0, model)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _how(server.grpc_url, how, model, timeout=30)
    assert time.monotonic() - started < 15  # ended at once, not when the model's sleep ends
    assert err.value.status() == "StatusCode.INTERNAL"
    assert model in err.value.message() and "broke the channel's protocol" in err.value.message()
    # (the client's answer can come before the server's log line reaches its stderr pipe)
    assert wait_until(lambda: f"model '{model}'" in server.output() and logged in server.output()
                      and "killing it" in server.output()), server.output()
    assert not (repo / model / "1" / "pwned").exists()  # the pickle ran nothing in the server
    assert _how(server.grpc_url, 0, model) != before  # its replacement answers; the server is up


def test_a_worker_that_forks_and_dies_is_noticed_by_its_exit(server: ServerProcess) -> None:
    before = _how(server.grpc_url, 0, "liar_fork")
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _how(server.grpc_url, 4, "liar_fork", timeout=25)  # (its child keeps the socket open for 30 s)
    assert time.monotonic() - started < 10
    assert err.value.status() == "StatusCode.INTERNAL" and "exited with code 5" in err.value.message()
    assert _how(server.grpc_url, 0, "liar_fork") != before


def test_many_waiting_bls_calls_of_one_model_do_not_starve_another_models(server: ServerProcess) -> None:
    """40 BLS calls of one model wait on a slow model (12 s of work behind one instance); another model's BLS
    call is answered meanwhile (before: one 32-thread pool served every worker's calls, all taken)."""
    with ThreadPoolExecutor(1) as pool:
        fanout = pool.submit(_how, server.grpc_url, 0, "fanout", 120.0)
        time.sleep(1.5)  # its 40 calls are waiting
        assert not fanout.done()
        started = time.monotonic()
        assert _how(server.grpc_url, 0, "caller", timeout=30) == 7
        assert time.monotonic() - started < 1.5  # (3.3 s before, behind the other model's calls)
        assert fanout.result(timeout=120) == 0  # each of its calls answered, none failed


def test_a_bls_call_to_the_calling_model_itself_is_refused_not_a_deadlock(server: ServerProcess) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _how(server.grpc_url, 1, "caller", timeout=30)
    assert time.monotonic() - started < 10
    assert "sent a BLS request to itself" in err.value.message()
    assert _how(server.grpc_url, 0, "caller") == 7  # it was not wedged


def test_a_slow_bls_consumer_of_a_stream_never_stalls_the_event_loop(server: ServerProcess) -> None:
    """A decoupled model whose worker is read on the gRPC frontend's event loop (after one direct request)
    streams 300 responses at once to a BLS consumer that reads one each 50 ms: the loop never waits for the
    consumer's socket, so a gRPC probe meanwhile is answered at once (before: 9 s here, the issue's 23.6 s, the
    loop blocked in ``sendall``)."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([3], dtype=np.int32))
        for _ in range(2):  # direct requests: gush's worker is now read on the frontend's loop
            client.async_stream_infer("gush", [inp], enable_empty_final_response=True)
            while True:
                result, error = results.get(timeout=30)
                assert error is None
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
    finally:
        client.stop_stream()
    probe = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[5]], dtype=np.int32))
    with ThreadPoolExecutor(1) as pool:
        consumer = pool.submit(_how, server.grpc_url, 0, "sipper", 120.0)
        time.sleep(1.5)  # the consumer's socket is full by now
        worst = 0.0
        for _ in range(10):
            started = time.monotonic()
            probe.infer("identity", [x], client_timeout=30)
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.2)
        assert not consumer.done()  # (the probes ran while the stream was being consumed)
        assert worst < 1.0
        assert consumer.result(timeout=120) == 300  # every response reached it
    assert threading.active_count() < 50


HUNG = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(600)

        def finalize(self):
            time.sleep(600)
"""


def test_sigterm_ends_within_the_exit_timeout_whatever_the_models_do(tmp_path: Path) -> None:
    """Three models hung in ``execute`` (and in ``finalize``), each with a request in flight: SIGTERM ends the
    server within ``--exit-timeout`` and a little (before: not exited after 150 s)."""
    for name in ("hung_a", "hung_b", "hung_c"):
        write_python_model(tmp_path, name, HUNG, HOW_CONFIG)
    with ServerProcess(tmp_path, "--exit-timeout", "3") as server:
        pool = ThreadPoolExecutor(3)
        calls = [pool.submit(_how, server.grpc_url, 0, name, 60.0) for name in ("hung_a", "hung_b", "hung_c")]
        time.sleep(1.5)  # the three requests are running
        started = time.monotonic()
        server.signal()
        code = server.wait(timeout=60)
        took = time.monotonic() - started
        for call in calls:
            with pytest.raises(InferenceServerException):
                call.result(timeout=30)
        pool.shutdown()
    assert took < 3 + 12, f"exited {took:.1f} s after SIGTERM"
    assert code == 0
    assert "past --exit-timeout" in server.output()
    assert "ended 3 Python worker process(es)" in server.output()  # each registered with its Core's link

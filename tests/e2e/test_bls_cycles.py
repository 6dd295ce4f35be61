"""BLS cycles are refused, not wedged (issue 36): a request that would re-enter a model every instance of which
waits for its answer (a -> b -> a, a -> b -> c -> a, in worker processes and in-process) gets a clear error in
the calling model's response at once, and so is the second of two requests entering one cycle from both ends at
once; a cycle through a model with a free instance runs; the server serves other clients after.  Triton has no
such check (its requests wait for good): COMPATIBILITY.md."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

#: HOP: STEPS = 0 answers OUT = 0; STEPS = n calls the model its "next" parameter names with n - 1 and answers
#: its OUT + 1 (an error of the call fails the request with the callee's words).
HOP = """
    import json
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.next = config["parameters"]["next"]["string_value"]
            self.delay_s = float(config["parameters"].get("delay_s", {}).get("string_value", "0"))

        def execute(self, requests):
            out = []
            for request in requests:
                steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0])
                value = 0
                if steps > 0:
                    time.sleep(self.delay_s)
                    bls = pb_utils.InferenceRequest(
                        model_name=self.next, requested_output_names=["OUT"],
                        inputs=[pb_utils.Tensor("STEPS", np.array([steps - 1], np.int32))])
                    response = bls.exec()
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    value = int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]) + 1
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            return out
"""


def _config(next_model: str, count: int, hosting: str, delay_s: float = 0.0) -> str:
    hosted = f'parameters {{ key: "hosting" value: {{ string_value: "{hosting}" }} }}' if hosting else ""
    hosted += f' parameters {{ key: "delay_s" value: {{ string_value: "{delay_s}" }} }}'
    return f"""
        backend: "python"
        input [ {{ name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        parameters {{ key: "next" value: {{ string_value: "{next_model}" }} }}
        {hosted}
    """


#: name -> (the model it calls, instances, hosting ("" for a worker process)[, seconds before it calls])
MODELS: dict[str, tuple] = {
    "a": ("b", 1, ""),
    "b": ("a", 1, ""),
    "c1": ("c2", 1, ""),
    "c2": ("c3", 1, ""),
    "c3": ("c1", 1, ""),
    "two": ("one", 2, ""),  # two instances: a cycle through it may run on its free one
    "one": ("two", 1, ""),
    "pair": ("pair", 2, ""),  # calls itself, with two instances
    "in_a": ("in_b", 1, "in_process"),
    "in_b": ("in_a", 1, "in_process"),
    "p": ("q", 1, "", 2.0),  # each sleeps 2 s before its call: two requests sent together enter the cycle at once
    "q": ("p", 1, "", 2.0),
    "in_p": ("in_q", 1, "in_process", 2.0),
    "in_q": ("in_p", 1, "in_process", 2.0),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root: Path = tmp_path_factory.mktemp("cycles")
    for name, spec in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(HOP))
        (root / name / "config.pbtxt").write_text(textwrap.dedent(_config(*spec)))
    with ServerProcess(root) as proc:
        yield proc


def _hop(url: str, model: str, steps: int, timeout: float = 30.0) -> int:
    client = grpcclient.InferenceServerClient(url)
    steps_input = grpcclient.InferInput("STEPS", [1], "INT32")
    steps_input.set_data_from_numpy(np.array([steps], dtype=np.int32))
    return int(client.infer(model, [steps_input], client_timeout=timeout).as_numpy("OUT")[0])


@pytest.mark.parametrize(
    ("model", "steps", "path"),
    [
        ("a", 2, "'a' -> 'b' -> 'a'"),
        ("c1", 3, "'c1' -> 'c2' -> 'c3' -> 'c1'"),
        ("in_a", 2, "'in_a' -> 'in_b' -> 'in_a'"),
    ],
    ids=["a-b-a", "three-models", "in-process"],
)
def test_a_bls_cycle_whose_model_has_no_free_instance_is_refused_at_once(
    server: ServerProcess, model: str, steps: int, path: str
) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _hop(server.grpc_url, model, steps)
    assert time.monotonic() - started < 10  # refused at once (before: the client's 30 s deadline, then wedged)
    message = err.value.message()
    assert f"sent a BLS request to model '{model}' that waits for itself ({path})" in message
    assert "its one instance is running a request that waits for this one's answer" in message
    # nothing is wedged: each model of the cycle answers, with and without calls, and so does a longer chain
    assert _hop(server.grpc_url, model, 0) == 0
    assert _hop(server.grpc_url, model, 1) == 1
    assert _hop(server.grpc_url, model, steps - 1) == steps - 1


def test_a_cycle_through_a_model_with_a_free_instance_runs(server: ServerProcess) -> None:
    assert _hop(server.grpc_url, "two", 2) == 2  # two -> one -> two (its other instance)
    assert _hop(server.grpc_url, "pair", 1) == 1  # pair -> pair (its other instance)
    with pytest.raises(InferenceServerException) as err:  # both of its instances on the chain: refused
        _hop(server.grpc_url, "pair", 2)
    assert "model 'pair' sent a BLS request to itself" in err.value.message()
    assert "all 2 of its instances are running a request" in err.value.message()
    assert _hop(server.grpc_url, "pair", 1) == 1


@pytest.mark.parametrize(("first", "second"), [("p", "q"), ("in_p", "in_q")], ids=["worker-processes", "in-process"])
def test_two_requests_entering_one_cycle_from_both_ends_are_not_wedged(
    server: ServerProcess, first: str, second: str
) -> None:
    """p -> q beside q -> p, each with one instance, at once: neither request's chain holds the other's instance,
    but each instance's call waits for the other; the second call is refused (the first then runs), where both
    would wait for good (Triton: until the clients' deadlines)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(model: str) -> object:
        try:
            return _hop(server.grpc_url, model, 1)
        except InferenceServerException as exc:
            return exc.message()

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(one, (first, second)))
    assert time.monotonic() - started < 20
    refused = [a for a in answers if isinstance(a, str)]
    assert len(refused) == 1 and answers.count(1) == 1, answers
    # (in worker processes the second call may also find the first's request in line behind the caller's own
    # batch: then the caller's chain holds the other instance, and the cycle is named)
    assert "refused" in refused[0] and "a deadlock" in refused[0], refused[0]
    assert _hop(server.grpc_url, first, 1) == 1 and _hop(server.grpc_url, second, 1) == 1  # each alone runs


def test_cycles_refused_while_other_clients_are_served(server: ServerProcess) -> None:
    """Cycles refused (in worker processes and in-process) while other clients' chains run: every answer is
    right, none waits."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> object:
        model, steps = (("a", 2), ("c3", 1), ("in_a", 2), ("c2", 2))[i % 4]
        try:
            return _hop(server.grpc_url, model, steps)
        except InferenceServerException as exc:
            return "refused" if "waits for itself" in exc.message() else exc.message()

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(32)))
    assert time.monotonic() - started < 60
    assert answers == ["refused", 1, "refused", 2] * 8

"""How a decoupled model's responses reach a streamed answer, in-process (the per-token path, issue 40):

- an async generator model is driven on the model loop in one go: responses in order, its failure, a cancel that
  stops it and runs its ``finally``, and concurrent generations taking turns on that loop;
- ``ModelCall``: responses that arrive while the event loop is busy ride one wake-up, in order;
- a streamed OpenAI answer writes the chunks queued at a wake-up as one piece, and a content chunk made from
  its template is the same bytes as the general chunk.

What crosses a socket (SSE, disconnects) is in tests/e2e/test_openai.py and test_generate.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from fastoip.core import CallContext, Core
from fastoip.demo_openai import write_openai_examples
from fastoip.scheduling.job import Job
from fastoip.server.http.model_call import ModelCall
from fastoip.server.http.openai import generation
from fastoip.types import InferInput, InferRequest, InferResponse
from fastoip.wire.openai import requests
from fastoip.wire.openai.answers import ChunkWriter, Envelope
from harness import core_on
from python_models import COUNTER, COUNTER_CONFIG, write_python_model

pytestmark = pytest.mark.timeout(120)

#: An async generator: COUNT responses; ``fail_at`` raises there; ``delay`` between responses; each response's
#: ``ORDER`` is a count shared by every request on the instance (which generation made a value when); its
#: ``finally`` appends the request's id to ``closed.txt`` beside the model.
ASYNC_TAKES_TURNS = """
    import asyncio
    import itertools
    from pathlib import Path

    import numpy as np
    import fastoip

    class Turns(fastoip.Model):
        def load(self):
            self.made = itertools.count()
            self.closed = Path(__file__).parent / "closed.txt"
            self.arrived = {}
            self.together = {}
            self.running = self.peak = 0

        async def predict(self, inputs, parameters):
            count = int(inputs["COUNT"].reshape(-1)[0])
            fail_at = int(parameters.get("fail_at", -1))
            delay = float(parameters.get("delay", 0))
            gather = int(parameters.get("gather", 0))
            if gather:  # the generations of a group start together, once ``gather`` of them run
                group = parameters["group"]
                event = self.together.setdefault(group, asyncio.Event())
                self.arrived[group] = self.arrived.get(group, 0) + 1
                if self.arrived[group] == gather:
                    event.set()
                await asyncio.wait_for(event.wait(), 30)
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                for index in range(count):
                    if index == fail_at:
                        raise ValueError(f"no response {index}")
                    if delay:
                        await asyncio.sleep(delay)
                    yield {"INDEX": np.array([index], dtype=np.int32),
                           "ORDER": np.array([next(self.made)], dtype=np.int32)}
            finally:
                self.running -= 1
                with self.closed.open("a") as out:
                    out.write(str(parameters.get("name", "")) + "\\n")
                (Path(__file__).parent / "peak.txt").write_text(str(self.peak))
"""
TURNS_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "ORDER" data_type: TYPE_INT32 dims: [ 1 ] } ]
    model_transaction_policy { decoupled: true }
    parameters { key: "max_concurrency" value: { string_value: "4" } }
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stream-path")
    write_python_model(folder, "turns", ASYNC_TAKES_TURNS, TURNS_CONFIG)
    write_python_model(folder, "wide", ASYNC_TAKES_TURNS, TURNS_CONFIG.replace('"4"', '"16"'))
    write_python_model(folder, "counter", COUNTER, COUNTER_CONFIG)
    write_openai_examples(folder)
    return folder


@pytest.fixture(scope="module")
def core(root: Path) -> Iterator[Core]:
    with core_on(root) as opened:
        yield opened


def count_request(n: int, model: str = "turns", **parameters: object) -> InferRequest:
    data = np.array([n], dtype=np.int32)
    return InferRequest(model, parameters=dict(parameters), inputs=[InferInput("COUNT", "INT32", (1,), data)])


class Collected:
    """Every response of one started request, then its finished job."""

    def __init__(self, core: Core, request: InferRequest) -> None:
        self.responses: list[InferResponse] = []
        #: The thread each response was handed over on.
        self.threads: set[str] = set()
        self.finished = threading.Event()
        self.job: Job | None = None
        self.ticket = core.start(request, CallContext(), self._done, self._response)

    def _response(self, job: Job, response: InferResponse) -> None:
        self.responses.append(response)
        self.threads.add(threading.current_thread().name)

    def _done(self, job: Job) -> None:
        self.job = job
        self.finished.set()

    def wait(self) -> Job:
        assert self.finished.wait(60)
        assert self.job is not None
        return self.job

    def values(self, output: str) -> list[int]:
        return [int(next(o for o in r.outputs if o.name == output).data[0]) for r in self.responses]


def closed_names(root: Path) -> list[str]:
    path = root / "turns" / "1" / "closed.txt"
    return path.read_text().split() if path.exists() else []


# -- async generators on the model loop -------------------------------------------------------------------------
def test_an_async_generators_responses_come_in_order_then_the_final_flag(core: Core, root: Path) -> None:
    call = Collected(core, count_request(40, name="in-order"))
    job = call.wait()
    assert call.values("INDEX") == list(range(40))
    assert job.decoupled and job.error is None and job.response is None
    # sent from the model loop as they are made (no hand-off per response to the thread that runs the request)
    assert call.threads == {"fastoip-python-loop"}
    assert "in-order" in closed_names(root)  # its finally ran, on the model loop


def test_an_async_generators_failure_after_some_responses_is_the_jobs_error(core: Core, root: Path) -> None:
    call = Collected(core, count_request(10, fail_at=3, name="fails"))
    job = call.wait()
    assert call.values("INDEX") == [0, 1, 2]
    assert job.error is not None and "no response 3" in job.error.message
    assert "fails" in closed_names(root)


def test_a_cancelled_async_generation_stops_and_runs_its_finally(core: Core, root: Path) -> None:
    call = Collected(core, count_request(2000, delay=0.005, name="cancelled"))
    deadline = time.monotonic() + 30
    while len(call.responses) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    call.ticket.cancel()
    call.wait()
    deadline = time.monotonic() + 30
    while "cancelled" not in closed_names(root) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "cancelled" in closed_names(root)  # the model stopped (2000 x 5 ms would take 10 s) and cleaned up
    settled = len(call.responses)
    time.sleep(0.2)
    assert len(call.responses) == settled < 2000


def test_concurrent_async_generations_take_turns_on_the_model_loop(core: Core) -> None:
    # a generator that never awaits would stream its whole answer before the other starts, were it not for the
    # turn the loop gives between two values
    calls = [Collected(core, count_request(20000, name=f"turn-{i}", gather=2, group="turns")) for i in range(2)]
    for call in calls:
        call.wait()
        assert call.values("INDEX") == list(range(20000))
    first, second = (call.values("ORDER") for call in calls)
    # each made values while the other was still making its own: they took turns (20000 values take tens of
    # turns of TURN_S each)
    assert min(first) < max(second) and min(second) < max(first)
    ordered = sorted(first)
    switches = sum(1 for index in range(1, len(ordered)) if ordered[index] != ordered[index - 1] + 1)
    assert switches >= 2, (first[:3], second[:3])


def test_async_generations_hold_no_executor_thread(core: Core) -> None:
    # 8 generations that all wait for each other run at once on a Core of 4 executor threads (holding a thread
    # each, 4 would wait for the others for ever)
    calls = [Collected(core, count_request(5, "wide", name=f"wide-{i}", gather=8, group="wide")) for i in range(8)]
    for call in calls:
        job = call.wait()
        assert job.error is None and call.values("INDEX") == list(range(5))


def test_async_generations_run_at_most_max_concurrency_at_once(core: Core, root: Path) -> None:
    calls = [Collected(core, count_request(20, delay=0.005, name=f"bounded-{i}")) for i in range(12)]
    for call in calls:
        assert call.wait().error is None
    assert 1 <= int((root / "turns" / "1" / "peak.txt").read_text()) <= 4  # max_concurrency


# -- ModelCall: one wake-up per burst -----------------------------------------------------------------------------
def test_responses_that_arrive_while_the_loop_is_busy_ride_one_wake_up_in_order(core: Core) -> None:
    async def read() -> tuple[list[int], int]:
        call = ModelCall(core, count_request(50, model="counter"))
        deadline = time.monotonic() + 30
        while len(call.answers) < 51 and time.monotonic() < deadline:  # the loop is busy: nothing is read
            time.sleep(0.01)
        got = []
        while (response := await call.next()) is not None:
            got.append(int(response.outputs[0].data[0]))
        return got, call.wakes

    got, wakes = asyncio.run(read())
    assert got == list(range(50))
    assert wakes == 1


def test_a_call_read_as_it_comes_gets_every_answer_in_order(core: Core) -> None:
    async def read() -> list[int]:
        call = ModelCall(core, count_request(300, delay=0.0005))
        got = []
        while (response := await call.next()) is not None:
            got.append(int(response.outputs[0].data[0]))
            await asyncio.sleep(0)
        return got

    assert asyncio.run(read()) == list(range(300))


# -- a streamed answer's writes -------------------------------------------------------------------------------------
def test_the_chunks_queued_at_a_wake_up_go_out_as_one_piece(core: Core) -> None:
    async def pieces() -> list[bytes]:
        parsed = requests.parse_completion(orjson.dumps(
            {"model": "tiny_chat", "prompt": "hello", "stream": True, "max_tokens": 20, "temperature": 0}))
        plan = generation.plan_completion(core, parsed, None, None)
        envelope = Envelope("cmpl", "tiny_chat")
        states = generation.start_choices(core, plan, envelope.id)
        call = states[0].call
        deadline = time.monotonic() + 30
        while (not call.answers or call.answers[-1] is not None) and time.monotonic() < deadline:
            time.sleep(0.01)  # the loop is busy while the model makes every token
        return [piece async for piece in generation.stream(plan, states, envelope)]

    got = asyncio.run(pieces())
    assert len(got) == 1
    events = got[0].split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(event[len(b"data: "):]) for event in events[:-1]]
    assert len(chunks) == 21  # 20 tokens, then the finish_reason alone
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 20 + ["length"]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
def test_a_content_chunk_from_its_template_is_the_general_chunk(chat: bool, include_usage: bool) -> None:
    writer = ChunkWriter(Envelope("chatcmpl", 'a "quoted" model \ue000'), chat, include_usage)
    for index in (0, 1, 7):
        for text in ("", " fox", 'say "hi"\n', "\ue000text\ue000", "naïve ✓"):
            assert writer.content(index, text) == writer.chunk(index, text)


def test_generate_streams_events_queued_at_a_wake_up_as_one_piece(core: Core) -> None:
    from fastoip.server.http.generate import _events
    from fastoip.wire.generate import generate_response_json

    async def pieces() -> list[bytes]:
        call = ModelCall(core, count_request(30, model="counter"))
        deadline = time.monotonic() + 30
        while len(call.answers) < 31 and time.monotonic() < deadline:  # the loop is busy: nothing is read
            time.sleep(0.01)
        first = await call.get()
        return [piece async for piece in _events(first, call, generate_response_json)]

    got = asyncio.run(pieces())
    assert len(got) == 1
    events = got[0].split(b"\n\n")[:-1]
    assert [orjson.loads(event[len(b"data: "):])["INDEX"] for event in events] == list(range(30))


def test_an_unload_waits_for_the_async_generations_running(tmp_path: Path) -> None:
    write_python_model(tmp_path, "turns", ASYNC_TAKES_TURNS, TURNS_CONFIG)
    with core_on(tmp_path, model_control_mode="explicit", startup_models=["turns"]) as own:
        call = Collected(own, count_request(200, delay=0.005, name="drained"))
        deadline = time.monotonic() + 30
        while not call.responses and time.monotonic() < deadline:
            time.sleep(0.01)
        unloaded = threading.Thread(target=own.unload_model, args=("turns",))
        unloaded.start()
        job = call.wait()
        unloaded.join(60)
        assert not unloaded.is_alive()
        assert job.error is None and call.values("INDEX") == list(range(200))  # it ran to its end
        assert "drained" in closed_names(tmp_path)


def test_answer_ids_are_unique_and_shaped_as_before() -> None:
    import re

    from fastoip.wire.openai.answers import new_id

    ids = [new_id("chatcmpl") for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", one) for one in ids)

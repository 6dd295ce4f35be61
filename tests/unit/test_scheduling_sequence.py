"""The sequence batcher's decisions in-process, with a controllable clock and a small deterministic backend.

The backend (``accumulate``) is a real RunBatch: OUTPUT = INPUT + STATE_IN, and the new state is the same
sum, so a sequence's answers show whether its state was carried, reset at START, and kept apart from other
sequences' state.  Control tensors are recorded per execution to check their values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from fastoip._proto import model_config_pb2 as mc
from fastoip.errors import InvalidArgument
from fastoip.scheduling.job import Job
from fastoip.scheduling.sequence_batcher import Batch, SequenceBatcher
from fastoip.scheduling.sequence_settings import sequence_settings
from fastoip.types import InferInput, InferOutput, InferRequest, InferResponse

MS = 1_000_000

CONFIG = """
name: "acc" max_batch_size: {max_batch}
input {{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }}
output {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }}
sequence_batching {{
  max_sequence_idle_microseconds: 5000
  {strategy}
  control_input {{ name: "START" control {{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }} }}
  control_input {{ name: "END" control {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1] }} }}
  control_input {{ name: "READY" control {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] }} }}
  control_input {{ name: "CORRID" control {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} }}
  state {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [1] }}
}}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * MS

    def __call__(self) -> int:
        return self.now


@dataclass
class Model:
    name: str
    config: mc.ModelConfig
    backends: list[Any]
    executions: list[list[dict[str, Any]]] = field(default_factory=list)


def accumulate(model: Model, backend: Any, jobs: Sequence[Job]) -> None:
    model.executions.append([{k: v.reshape(-1)[0] for k, v in job.feeds.items()} for job in jobs])
    for job in jobs:
        total = job.feeds["INPUT"] + job.feeds["STATE_IN"]
        outputs = [InferOutput(name, "INT32", total.shape, total.copy()) for name in job.output_names]
        job.finish(InferResponse(job.request.model_name, "1", job.request.id, outputs=outputs))


def make(max_batch: int = 2, instances: int = 1, strategy: str = "direct {}") -> tuple[SequenceBatcher, Model, Clock]:
    config = text_format.Parse(CONFIG.format(max_batch=max_batch, strategy=strategy), mc.ModelConfig())
    model = Model("acc", config, [f"instance{i}" for i in range(instances)])
    clock = Clock()
    batcher = SequenceBatcher(model, sequence_settings(config), lambda b, jobs: accumulate(model, b, jobs),
                              clock=clock, start_threads=False)
    return batcher, model, clock


def job(value: int, corrid: object, start: bool = False, end: bool = False, batched: bool = True) -> Job:
    data = np.array([[value]] if batched else [value], dtype=np.int32)
    params: dict[str, Any] = {"sequence_id": corrid}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    request = InferRequest("acc", parameters=params, inputs=[InferInput("INPUT", "INT32", data.shape, data)])
    return Job(request, {"INPUT": data}, 1, ["OUTPUT"])


def run_ready(batcher: SequenceBatcher, clock: Clock, instance: int = 0) -> Batch | int | None:
    decision = batcher.next_batch(instance, clock())
    if isinstance(decision, Batch):
        batcher.take(decision)
        batcher.execute(batcher.model.backends[instance], decision)
        batcher.complete(decision, clock())
    return decision


def answer(j: Job) -> int:
    assert j.finished and j.error is None, j.error
    assert j.response is not None
    assert [o.name for o in j.response.outputs] == ["OUTPUT"]  # the state output stays inside
    data = j.response.outputs[0].data
    assert data is not None
    return int(data.reshape(-1)[0])


def test_state_is_carried_within_a_sequence_and_reset_at_start() -> None:
    batcher, model, clock = make()
    jobs = [job(1, 7, start=True), job(2, 7), job(3, 7, end=True)]
    for j in jobs:
        batcher.enqueue(j)
        run_ready(batcher, clock)
    assert [answer(j) for j in jobs] == [1, 3, 6]
    again = job(10, 7, start=True)
    batcher.enqueue(again)
    run_ready(batcher, clock)
    assert answer(again) == 10


def test_control_inputs_carry_the_configured_values() -> None:
    batcher, model, clock = make()
    for j in (job(1, 42, start=True), job(1, 42), job(1, 42, end=True)):
        batcher.enqueue(j)
        run_ready(batcher, clock)
    rows = [execution[0] for execution in model.executions]
    assert [(r["START"], r["END"], r["READY"], r["CORRID"]) for r in rows] == [
        (1, 0.0, True, 42), (0, 0.0, True, 42), (0, 1.0, True, 42)]
    assert model.executions[0][0]["START"].dtype == np.int32
    assert model.executions[0][0]["END"].dtype == np.float32


def test_one_request_per_sequence_per_batch_and_sequences_batch_together() -> None:
    batcher, model, clock = make(max_batch=2)
    a1, a2, b1 = job(1, 1, start=True), job(2, 1), job(5, 2, start=True)
    for j in (a1, a2, b1):
        batcher.enqueue(j)
    first = run_ready(batcher, clock)
    assert isinstance(first, Batch)
    assert sorted(s.corrid for s, _ in first.entries) == [1, 2]
    run_ready(batcher, clock)
    assert (answer(a1), answer(a2), answer(b1)) == (1, 3, 5)
    assert [len(e) for e in model.executions] == [2, 1]


def test_more_sequences_than_slots_wait_in_the_backlog() -> None:
    batcher, model, clock = make(max_batch=1)
    first, second = job(1, 1, start=True), job(2, 2, start=True, end=True)
    batcher.enqueue(first)
    batcher.enqueue(second)
    run_ready(batcher, clock)
    assert answer(first) == 1 and not second.finished  # sequence 2 has no slot yet
    last = job(3, 1, end=True)
    batcher.enqueue(last)
    run_ready(batcher, clock)  # sequence 1 ends: its slot goes to sequence 2
    run_ready(batcher, clock)
    assert answer(last) == 4 and answer(second) == 2


def test_an_idle_sequence_is_released_and_a_late_request_is_refused() -> None:
    batcher, model, clock = make()
    batcher.enqueue(job(1, 9, start=True))
    run_ready(batcher, clock)
    clock.now += 6 * MS  # past max_sequence_idle_microseconds (5 ms)
    late = job(1, 9)
    batcher.enqueue(late)
    assert isinstance(late.error, InvalidArgument)
    assert late.error.message == ("inference request for sequence 9 to model 'acc' must specify the START flag on "
                                  "the first request of the sequence")


def test_the_idle_release_frees_a_slot_for_the_backlog() -> None:
    batcher, model, clock = make(max_batch=1)
    batcher.enqueue(job(1, 1, start=True))
    run_ready(batcher, clock)
    waiting = job(2, 2, start=True)
    batcher.enqueue(waiting)
    assert batcher.next_batch(0, clock()) == clock.now + 5 * MS + 1  # nothing runs before the idle release
    clock.now += 6 * MS
    run_ready(batcher, clock)
    assert answer(waiting) == 2


@pytest.mark.parametrize(
    ("params", "batch", "message"),
    [
        ({}, 1, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 0, "sequence_start": True}, 1, "non-zero or non-empty"),
        ({"sequence_id": 3, "sequence_start": True}, 2, "must specify batch-size 1 due to requirements of sequence"),
        ({"sequence_id": "text", "sequence_start": True}, 1,
         "sequence batching control 'CORRID' data-type is 'BYTES', but model 'acc' expects 'UINT64'"),
        ({"sequence_id": 4}, 1, "must specify the START flag"),
    ],
)
def test_requests_that_cannot_belong_to_a_sequence_fail_with_tritons_messages(
    params: dict[str, Any], batch: int, message: str
) -> None:
    batcher, _, _ = make()
    data = np.ones((batch, 1), dtype=np.int32)
    request = InferRequest("acc", parameters=params, inputs=[InferInput("INPUT", "INT32", data.shape, data)])
    bad = Job(request, {"INPUT": data}, batch, ["OUTPUT"])
    batcher.enqueue(bad)
    assert isinstance(bad.error, InvalidArgument) and message in bad.error.message


def test_oldest_waits_for_the_queue_delay_then_runs_what_it_has() -> None:
    batcher, model, clock = make(max_batch=4, strategy="oldest { max_candidate_sequences: 4 "
                                                           "max_queue_delay_microseconds: 1000 }")
    one = job(1, 1, start=True)
    batcher.enqueue(one)
    assert batcher.next_batch(0, clock()) == clock.now + 1 * MS
    clock.now += 1 * MS
    run_ready(batcher, clock)
    assert answer(one) == 1


def test_direct_runs_at_once_when_no_minimum_slot_utilization_is_set() -> None:
    # Triton's direct batcher ignores max_queue_delay_microseconds while minimum_slot_utilization is 0 (its
    # default): a lone request does not wait for the batch to fill (L0_sequence_batcher's queue delay cases)
    batcher, model, clock = make(max_batch=4, strategy="direct { max_queue_delay_microseconds: 3000000 }")
    one = job(1, 1, start=True)
    batcher.enqueue(one)
    assert isinstance(run_ready(batcher, clock), Batch)
    assert answer(one) == 1


def test_direct_waits_for_its_minimum_slot_utilization_or_the_queue_delay() -> None:
    batcher, model, clock = make(max_batch=4, strategy="direct { max_queue_delay_microseconds: 1000 "
                                                           "minimum_slot_utilization: 0.5 }")
    a, b = job(1, 1, start=True), job(2, 2, start=True)
    batcher.enqueue(a)
    assert batcher.next_batch(0, clock()) == clock.now + 1 * MS  # 1 of 4 slots ready: under half, so it waits
    batcher.enqueue(b)
    both = run_ready(batcher, clock)  # 2 of 4: half, it runs without waiting
    assert isinstance(both, Batch) and len(both.entries) == 2
    assert (answer(a), answer(b)) == (1, 2)
    c = job(10, 2, end=True)
    batcher.enqueue(c)
    assert batcher.next_batch(0, clock()) == clock.now + 1 * MS  # alone again: it waits for the delay
    clock.now += 1 * MS
    assert isinstance(run_ready(batcher, clock), Batch)
    assert answer(c) == 12


def test_direct_binds_each_sequence_to_one_instance() -> None:
    batcher, model, clock = make(max_batch=1, instances=2)
    a, b = job(1, 1, start=True), job(2, 2, start=True)
    batcher.enqueue(a)
    batcher.enqueue(b)
    first = batcher.next_batch(0, clock())
    second = batcher.next_batch(1, clock())
    assert isinstance(first, Batch) and isinstance(second, Batch)
    assert {first.entries[0][0].corrid, second.entries[0][0].corrid} == {1, 2}


def test_stop_fails_what_is_queued() -> None:
    batcher, _, _ = make()
    queued = job(1, 1, start=True)
    batcher.enqueue(queued)
    batcher.stop()
    assert queued.error is not None and "unloaded" in queued.error.message


def test_abandoned_sequences_free_their_slots_at_once() -> None:
    """Issue 27: 2,000 sequences whose client went away (their START cancelled while waiting) used to take a
    slot each for the whole idle timeout; now they leave at the next decision and a fresh sequence runs."""
    batcher, model, clock = make(max_batch=1)
    first = job(1, 1, start=True)
    batcher.enqueue(first)
    run_ready(batcher, clock)  # sequence 1 holds the only slot
    abandoned = [job(1, 100 + i, start=True) for i in range(2000)]
    for j in abandoned:
        batcher.enqueue(j)
    for j in abandoned:
        j.cancel()
    first_next = job(2, 1)
    batcher.enqueue(first_next)
    first_next.cancel()  # sequence 1's client goes away too: its slot is free without waiting for idle
    fresh = job(7, 9999, start=True)
    batcher.enqueue(fresh)
    assert isinstance(run_ready(batcher, clock), Batch)  # no idle wait: the clock has not moved
    assert answer(fresh) == 7
    assert batcher.pending() == 0
    late = job(3, 100)  # an abandoned sequence is gone: its next request must START again
    batcher.enqueue(late)
    assert isinstance(late.error, InvalidArgument)


def test_the_backlog_is_bounded() -> None:
    from fastoip.errors import Unavailable
    from fastoip.scheduling import sequence_batcher

    batcher, model, clock = make(max_batch=1)
    batcher.enqueue(job(1, 1, start=True))
    run_ready(batcher, clock)
    waiting = [job(1, 10 + i, start=True) for i in range(sequence_batcher.BACKLOG_LIMIT)]
    for j in waiting:
        batcher.enqueue(j)
    refused = job(1, 99_999, start=True)
    batcher.enqueue(refused)
    assert isinstance(refused.error, Unavailable) and "waiting for a slot" in refused.error.message
    waiting[0].cancel()  # one place frees up once a waiting client goes away
    accepted = job(1, 99_998, start=True)
    batcher.enqueue(accepted)
    assert not accepted.finished


def make_iterative(reschedule_first: int) -> tuple[SequenceBatcher, Model, Clock, list[dict[str, Any]]]:
    """A batcher with ``iterative_sequence: true`` whose backend releases each request with RESCHEDULE its first
    ``reschedule_first`` runs (Job.reschedule), then answers it; ``seen``: what each run was given."""
    config = text_format.Parse(CONFIG.format(max_batch=2, strategy="direct {}").replace(
        "max_sequence_idle_microseconds: 5000", "max_sequence_idle_microseconds: 5000 iterative_sequence: true"),
        mc.ModelConfig())
    model = Model("acc", config, ["instance0"])
    clock = Clock()
    seen: list[dict[str, Any]] = []
    runs: dict[str, int] = {}

    def run(backend: Any, jobs: Sequence[Job]) -> None:
        for j in jobs:
            params = j.request.parameters
            seen.append({"id": params.get("sequence_id"), "start": params.get("sequence_start"),
                         "end": params.get("sequence_end"), "START": int(j.feeds["START"].reshape(-1)[0])})
            runs[j.request.id] = runs.get(j.request.id, 0) + 1
            if runs[j.request.id] <= reschedule_first:
                assert j.reschedule()
            else:
                accumulate(model, backend, [j])

    batcher = SequenceBatcher(model, sequence_settings(config), run, clock=clock, start_threads=False)
    return batcher, model, clock, seen


def test_iterative_sequences_name_requests_without_an_id_and_run_rescheduled_ones_again() -> None:
    batcher, model, clock, seen = make_iterative(reschedule_first=2)
    first = job(5, 0)
    first.request.id = "a"
    second = job(7, 0)
    second.request.id = "b"
    batcher.enqueue(first)  # no correlation id: the batcher names a sequence for each
    batcher.enqueue(second)
    for _ in range(3):
        assert isinstance(run_ready(batcher, clock), Batch)
    assert answer(first) == 5 and answer(second) == 7  # each its own sequence: no state shared
    # the first run says START (Triton's generative sequencer), the rescheduled ones neither START nor END
    assert [(s["id"], s["start"], s["end"], s["START"]) for s in seen] == [
        (1, True, False, 1), (2, True, False, 1), (1, False, False, 0), (2, False, False, 0),
        (1, False, False, 0), (2, False, False, 0),
    ]
    assert batcher.pending() == 0
    assert batcher._active == []  # finished for good: each named sequence gave its slot back
    assert run_ready(batcher, clock) is None


def test_a_job_without_an_iterative_batcher_cannot_be_rescheduled() -> None:
    batcher, model, clock = make()
    j = job(1, 7, start=True, end=True)
    assert not j.reschedule()  # (no scheduler took it back: the backend then fails it, saying why)
    batcher.enqueue(j)
    run_ready(batcher, clock)
    assert answer(j) == 1


def test_without_iterative_sequence_a_request_still_needs_a_correlation_id() -> None:
    batcher, model, clock = make()
    j = job(1, 0)
    batcher.enqueue(j)
    assert isinstance(j.error, InvalidArgument) and "correlation ID" in j.error.message

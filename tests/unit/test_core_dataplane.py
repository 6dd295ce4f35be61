"""The Core's data plane in-process: start, infer, cancel, deadlines, statistics, shared-memory outputs."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

import fastoip.core.dataplane as dataplane  # noqa: E402
from fastoip.core import CallContext, Core, FinishedCall  # noqa: E402
from fastoip.demo import write_repository  # noqa: E402
from fastoip.errors import Cancelled, DeadlineExceeded, InvalidArgument, NotFound  # noqa: E402
from fastoip.shared_memory import BYTE_SIZE, REGION  # noqa: E402
from fastoip.types import InferInput, InferRequest, RequestedOutput  # noqa: E402
from harness import DIRECT_SIMPLE, HOLDING_BATCHER, core_on, fp32_request, simple_request, success_and_failure  # noqa: E402

EXPECTED_SUM = np.arange(16, dtype=np.int32).reshape(1, 16) + 1
EXPECTED_DIFFERENCE = np.arange(16, dtype=np.int32).reshape(1, 16) - 1


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    root = write_repository(tmp_path_factory.mktemp("repo"), ["simple", "identity_fp32", "image_identity"])
    (root / "simple" / "config.pbtxt").write_text(DIRECT_SIMPLE)
    # "held": identity_fp32 behind a batcher that keeps a lone request queued (to cancel it there);
    # "held_images": image_identity (602 KB an item) behind the same batcher
    for name, source in (("held", "identity_fp32"), ("held_images", "image_identity")):
        held = root / name
        (held / "1").mkdir(parents=True)
        (held / "1" / "model.onnx").write_bytes((root / source / "1" / "model.onnx").read_bytes())
        (held / "config.pbtxt").write_text(HOLDING_BATCHER)
    with core_on(root) as running:
        yield running


def wait_for(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_infer_answers_and_counts_once(core: Core) -> None:
    before = success_and_failure(core, "simple")
    response = core.infer(simple_request(request_id="r1"))
    assert response.id == "r1" and response.model_name == "simple"
    np.testing.assert_array_equal(response.output("OUTPUT0").data, EXPECTED_SUM)
    np.testing.assert_array_equal(response.output("OUTPUT1").data, EXPECTED_DIFFERENCE)
    assert success_and_failure(core, "simple") == (before[0] + 1, before[1])


def test_submit_calls_back_once_after_recording(core: Core) -> None:
    before = success_and_failure(core, "simple")
    seen: list[tuple[FinishedCall, tuple[int, int]]] = []
    finished = threading.Event()

    def on_done(call: FinishedCall) -> None:
        # statistics are written before the frontend hears of the result
        seen.append((call, success_and_failure(core, "simple")))
        finished.set()

    core.start(simple_request(request_id="s1"), None, on_done)
    assert finished.wait(30)
    time.sleep(0.05)  # a second callback would arrive here
    assert len(seen) == 1
    call, counts_then = seen[0]
    assert call.error is None and call.response is not None and call.request.id == "s1"
    np.testing.assert_array_equal(call.response.output("OUTPUT0").data, EXPECTED_SUM)
    assert counts_then == (before[0] + 1, before[1])
    assert success_and_failure(core, "simple") == (before[0] + 1, before[1])


def test_start_on_a_lent_thread_finishes_before_returning(core: Core) -> None:
    calls: list[FinishedCall] = []
    job = core.start(simple_request(), CallContext(caller_runs=True), calls.append)
    assert calls == [job] and job.response is not None  # direct model: ran on this thread


def test_invalid_request_raises_before_it_starts(core: Core) -> None:
    before = success_and_failure(core, "simple")
    wrong = simple_request(np.zeros((1, 8), dtype=np.int32), np.zeros((1, 8), dtype=np.int32))
    with pytest.raises(InvalidArgument, match="INPUT0"):
        core.infer(wrong)
    with pytest.raises(InvalidArgument):
        core.start(wrong, None, lambda call: None)
    with pytest.raises(NotFound):
        core.infer(simple_request(model="no_such_model"))
    assert success_and_failure(core, "simple") == before  # never started, never counted


def test_expired_deadline_fails_once_as_deadline_exceeded(core: Core) -> None:
    before = success_and_failure(core, "simple")
    with pytest.raises(DeadlineExceeded):
        core.infer(simple_request(), CallContext(deadline_ns=time.monotonic_ns() - 1))
    calls: list[FinishedCall] = []
    core.start(simple_request(), CallContext(time.monotonic_ns() - 1, caller_runs=True), calls.append)
    assert len(calls) == 1 and isinstance(calls[0].error, DeadlineExceeded) and calls[0].response is None
    assert success_and_failure(core, "simple") == (before[0], before[1] + 2)


def test_call_context_deadlines() -> None:
    assert CallContext(time_remaining=lambda: 1e12).queued_deadline_ns() == 0  # grpcio's "no deadline"
    now = time.monotonic_ns()
    lazy = CallContext(time_remaining=lambda: 2.0)
    assert lazy.deadline_ns == 0 and now + 1_900_000_000 < lazy.queued_deadline_ns() < now + 60_000_000_000
    assert CallContext(deadline_ns=5, time_remaining=lambda: 2.0).queued_deadline_ns() == 5
    assert CallContext(time_remaining=lambda: None).queued_deadline_ns() == 0


def test_time_remaining_is_read_only_for_queued_requests(core: Core) -> None:
    reads: list[str] = []

    def remaining() -> float:
        reads.append("read")
        return 3600.0

    core.infer(simple_request(), CallContext(time_remaining=remaining))
    assert reads == []  # a direct request runs at once: no deadline to read
    cancels: list[Callable[[], None]] = []
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            core.infer(fp32_request("held"), CallContext(on_cancel=cancels.append, time_remaining=remaining))
        except BaseException as exc:  # noqa: B036 - the test reports what the call raised
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: len(cancels) == 1, "the cancel registration")
    assert reads == ["read"]  # read once, for the queued request
    cancels[0]()
    caller.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)


def test_cancel_a_queued_start(core: Core) -> None:
    before = success_and_failure(core, "held")
    calls: list[FinishedCall] = []
    job = core.start(fp32_request("held"), None, calls.append)
    assert calls == []  # held in the batcher's queue
    job.cancel()
    assert len(calls) == 1 and isinstance(calls[0].error, Cancelled)
    job.cancel()  # a second cancel changes nothing
    assert len(calls) == 1
    assert success_and_failure(core, "held") == (before[0], before[1] + 1)


def test_infer_registers_cancel_only_for_queued_requests(core: Core) -> None:
    registered: list[Callable[[], None]] = []
    core.infer(simple_request(), CallContext(on_cancel=registered.append))
    assert registered == []  # a direct request runs on the caller's thread: nothing to cancel

    outcome: list[BaseException] = []

    def call() -> None:
        try:
            core.infer(fp32_request("held"), CallContext(on_cancel=registered.append))
        except BaseException as exc:  # noqa: B036 - the test reports what the call raised
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: len(registered) == 1, "the cancel registration")
    registered[0]()  # the client went away
    caller.join(30)
    assert not caller.is_alive() and len(outcome) == 1 and isinstance(outcome[0], Cancelled)


def test_infer_async_answers_on_the_loop(core: Core) -> None:
    async def main() -> np.ndarray:
        response = await core.infer_async(simple_request())
        data = response.output("OUTPUT0").data
        assert data is not None
        return data

    np.testing.assert_array_equal(asyncio.run(main()), EXPECTED_SUM)


@pytest.fixture
def region(core: Core) -> Iterator[tuple[str, shared_memory.SharedMemory]]:
    memory = shared_memory.SharedMemory(create=True, size=64)
    name = f"out-{memory.name.strip('/')}"
    core.register_system_shared_memory(name, memory.name, 0, 64)
    try:
        yield name, memory
    finally:
        core.unregister_shared_memory(name)
        memory.close()
        memory.unlink()


@pytest.mark.parametrize("entry", ["infer", "start"])
def test_shared_memory_output_written_once(
    core: Core, region: tuple[str, shared_memory.SharedMemory], entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, memory = region
    assert memory.buf is not None
    writes: list[str] = []
    real_write = dataplane.write_output

    def counted(output: str, *args: object) -> None:
        writes.append(output)
        real_write(output, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(dataplane, "write_output", counted)
    memory.buf[:64] = bytes(64)
    outputs = [RequestedOutput("OUTPUT0", {REGION: name, BYTE_SIZE: 64}), RequestedOutput("OUTPUT1")]
    request = simple_request(outputs=outputs)
    if entry == "infer":
        response = core.infer(request)
    else:
        calls: list[FinishedCall] = []
        core.start(request, CallContext(caller_runs=True), calls.append)
        assert len(calls) == 1 and calls[0].response is not None
        response = calls[0].response
    assert writes == ["OUTPUT0"]
    in_region = response.output("OUTPUT0")
    assert in_region.data is None and list(in_region.shape) == [1, 16]  # as Triton: no data, shape kept
    np.testing.assert_array_equal(np.frombuffer(memory.buf[:64], dtype=np.int32).reshape(1, 16), EXPECTED_SUM)
    np.testing.assert_array_equal(response.output("OUTPUT1").data, EXPECTED_DIFFERENCE)


def test_region_too_small_fails_the_request_once(core: Core, region: tuple[str, shared_memory.SharedMemory]) -> None:
    name, _ = region
    before = success_and_failure(core, "simple")
    outputs = [RequestedOutput("OUTPUT0", {REGION: name, BYTE_SIZE: 8})]
    with pytest.raises(InvalidArgument, match="OUTPUT0.*needs 64 bytes"):
        core.infer(simple_request(outputs=outputs))
    # the size is known only once the model has run: the write fails, and the request counts once, as failed
    assert success_and_failure(core, "simple") == (before[0], before[1] + 1)


def test_a_request_that_found_a_retired_version_runs_on_its_successor(tmp_path: Path) -> None:
    """A reload swaps versions, then retires the old one once idle; a request whose lookup raced the swap (it got
    the old version) moves to the new one instead of failing with "is being unloaded"."""
    root = write_repository(tmp_path, ["identity_fp32"])
    with core_on(root, model_control_mode="explicit", startup_models=["identity_fp32"]) as core:
        old = core.repository.get("identity_fp32", "")
        core.load_model("identity_fp32")  # reload: the old version is retired (its batcher stopped)
        new = core.repository.get("identity_fp32", "")
        assert new is not old and old.retiring and not new.retiring
        # the race, made deterministic in the request runner's look-up of the newest version (the data plane's and
        # ensemble steps'): it answers the old version, as if it ran before the swap
        runner = core.repository.runner
        assert runner.newest["identity_fp32"] is new
        runner.newest = {"identity_fp32": old}
        response = core.infer(fp32_request("identity_fp32", rows=2))
        np.testing.assert_array_equal(response.outputs[0].data, np.arange(32, dtype=np.float32).reshape(2, 16))
        assert (new.in_flight, old.in_flight) == (0, 0)
        assert success_and_failure(core, "identity_fp32") == (1, 0)  # counted on the new version


def test_on_loop_calls_back_on_the_loop_and_not_once_it_is_closed() -> None:
    from fastoip.core import on_loop

    loop = asyncio.new_event_loop()
    seen: list[tuple[str, bool]] = []

    def callback(value: str) -> None:
        seen.append((value, asyncio.get_running_loop() is loop))

    hop = on_loop(loop, callback)
    worker = threading.Thread(target=hop, args=("from a worker",))
    worker.start()
    worker.join(10)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert seen == [("from a worker", True)]
    loop.close()
    hop("too late")  # the loop is closed (a server stopped past its exit timeout): dropped, no error
    assert seen == [("from a worker", True)]


def test_on_loop_runs_at_once_while_the_loops_thread_runs_a_burst_and_queues_otherwise() -> None:
    """With the loop's thread known, a completion handed over on that thread waits for the loop's next pass
    (a connection may be mid-read), except while the thread runs its held wake-ups (``wakeups.release``: the
    batches of a burst, nothing being read): then it runs at once, and one that raises is reported as the loop
    reports a failing callback, without stopping the next."""
    from fastoip.core import on_loop
    from fastoip.scheduling import wakeups

    seen: list[str] = []
    reported: list[str] = []

    def callback(value: str) -> None:
        if value == "raises":
            raise ValueError("a failing completion")
        seen.append(value)

    def loop_thread() -> None:  # (its own thread: what it holds goes with it)
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda _, context: reported.append(str(context["exception"])))
        hop = on_loop(loop, callback, threading.get_ident())

        def burst() -> None:  # what a batcher's wake-up does on the loop: its completions call the hop
            hop("in the burst")
            hop("raises")
            hop("after the failure")
            seen.append("burst over")

        async def pass_of_the_loop() -> None:
            hop("while reading")  # not in a burst: queued for the loop's next pass
            assert seen == []
            wakeups.hold(lambda: loop.call_soon(wakeups.release))
            assert wakeups.wake_later(burst)
            await asyncio.sleep(0)  # the queued completion runs, then the release and its burst
            assert not wakeups.releasing()

        loop.run_until_complete(pass_of_the_loop())
        loop.close()

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join(10)
    assert seen == ["while reading", "in the burst", "after the failure", "burst over"]
    assert reported == ["a failing completion"]


def _tracked(request: InferRequest, refs: list[weakref.ref[np.ndarray]]) -> InferRequest:
    """``request``, with a weak reference to each input array (and to the array it views) added to ``refs``."""
    for tensor in request.inputs:
        assert tensor.data is not None
        refs.append(weakref.ref(tensor.data))
        if tensor.data.base is not None:
            refs.append(weakref.ref(tensor.data.base))
    return request


def _image_request(model: str) -> InferRequest:
    image = np.full((1, 3, 224, 224), 0.5, dtype=np.float32)  # 602 KB: over RELEASE_MIN_BYTES
    return InferRequest(model, inputs=[InferInput("INPUT0", "FP32", image.shape, image)])


@pytest.mark.parametrize(
    "model, requests, large",
    [("image_identity", 1, True), ("held_images", 8, True), ("simple", 1, False), ("held", 8, False)],
    ids=["large-alone", "large-merged-batch", "small-alone", "small-merged-batch"],
)
def test_the_core_lets_go_of_large_inputs_before_the_response_goes_out(
    core: Core, model: str, requests: int, large: bool
) -> None:
    """Triton releases a request when its execution ends: when the frontend hears of the result (and then
    encodes and sends the response), nothing in the Core holds input arrays of RELEASE_MIN_BYTES or more any
    more (refcount, not timing).  Small inputs stay with their request until it is answered (freeing them
    earlier would cost more than the memory they hold).  ``*-alone`` runs one request; eight ``held*`` requests
    reach the preferred size and run as one merged batch.  The caller's own request object is left as it was."""
    refs: list[list[weakref.ref[np.ndarray]]] = [[] for _ in range(requests)]
    seen: list[tuple[int, list[bool], FinishedCall]] = []
    lock = threading.Lock()
    finished = threading.Event()

    def on_done(index: int) -> Callable[[FinishedCall], None]:
        def done(call: FinishedCall) -> None:
            with lock:
                seen.append((index, [ref() is None for ref in refs[index]], call))
                if len(seen) == requests:
                    finished.set()

        return done

    for index in range(requests):
        # the request is built in the call: only the Core holds it (and its arrays) from here on
        made = (_image_request(model) if large else simple_request() if model == "simple" else fp32_request(model))
        core.start(_tracked(made, refs[index]), None, on_done(index))
        del made
    assert finished.wait(30)
    assert len(seen) == requests
    for index, freed, call in seen:
        assert call.error is None and call.response is not None
        if large:
            assert freed and all(freed), f"request {index}: an input array outlived the execution"
            assert [tensor.data for tensor in call.request.inputs] == [None] * len(call.request.inputs)
        else:
            assert freed and not any(freed), f"request {index}: a small input was copied away"
        output = call.response.output("OUTPUT0").data
        if model == "simple":
            np.testing.assert_array_equal(output, EXPECTED_SUM)
        elif large:
            np.testing.assert_array_equal(output, np.full((1, 3, 224, 224), 0.5, dtype=np.float32))
        else:
            np.testing.assert_array_equal(output, np.arange(16, dtype=np.float32)[None])


def test_the_callers_request_keeps_its_inputs(core: Core) -> None:
    """Only the Core's references go: a caller that holds its request can send it again."""
    request = simple_request()
    first = core.infer(request)
    assert all(tensor.data is not None for tensor in request.inputs)
    second = core.infer(request)
    np.testing.assert_array_equal(first.output("OUTPUT0").data, second.output("OUTPUT0").data)

"""tritonclient.grpc and tritonclient.grpc.aio against each gRPC frontend (issue 12's client list).

Every datatype, a stream with 1,000 requests in flight, system shared memory, model control, deadlines,
cancellation of queued requests (checked in the statistics), gzip/deflate requests, a 64 MB message, and
a 1 GB message when the machine has the memory for it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from fastoip.demo import write_repository
from memory import HUGE_NEEDS_GIB, mem_available_gib
from models import datatype_sample, identity_model_bytes, write_datatype_repository, write_model
from serverproc import ServerProcess, wait_until
from simple_model import ZERO_TO_15, simple_inputs

pytestmark = pytest.mark.timeout(300)

APIS = ["grpc", "aio"]
T = TypeVar("T")

#: The slow model holds its one instance for a second per request (a sleep: the same on any machine), so
#: requests behind it wait in the dynamic batcher's queue; max_batch_size 1 so each is its own execution.
SLOW_MODEL = """
import time
import fastoip

class Slow(fastoip.Model):
    def predict(self, inputs, parameters):
        time.sleep(1.0)
        return {"OUTPUT0": inputs["INPUT0"]}
"""
SLOW_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("clients"))
    write_datatype_repository(root)
    write_model(root, "big_fp32", identity_model_bytes(TensorProto.FLOAT, ["n"], "big_fp32"))
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (root / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    write_model(root, "spare", identity_model_bytes(TensorProto.FLOAT, [4], "spare"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path, grpc_frontend: str) -> Iterator[ServerProcess]:
    # explicit mode with every model loaded: the model-control tests may unload and load "spare".
    args = ("--model-control-mode", "explicit", "--load-model", "*")
    with ServerProcess(repo, *args, grpc_frontend=grpc_frontend) as proc:
        yield proc


def run(coroutine: Awaitable[T]) -> T:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def filled_inputs(value: int = 1) -> list[tg.InferInput]:
    """INPUT0 sixteen ``value``s, INPUT1 0..15."""
    return simple_inputs(tg, np.full((1, 16), value, dtype=np.int32), ZERO_TO_15)


def slow_input() -> list[tg.InferInput]:
    inp = tg.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [inp]


def inference_count(client: tg.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0))


def executions_settled(client: tg.InferenceServerClient, model: str, quiet_s: float = 2.0) -> int:
    """The model's inference count once it has stopped changing for ``quiet_s`` (bounded by the test timeout).

    Each test that queues requests on "slow" ends with this (or with a synchronous call), so the next one starts
    from a settled count and reads it directly.
    """
    last, since = inference_count(client, model), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.2)
        now = inference_count(client, model)
        if now != last:
            last, since = now, time.monotonic()
    return last


def assert_same(datatype: str, got: np.ndarray, data: np.ndarray) -> None:
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    elif datatype in ("FP16", "BF16"):
        assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()  # bit-exact: NaN, Inf, -0.0
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES", "BF16"]


def datatype_input(datatype: str) -> tuple[list[tg.InferInput], np.ndarray]:
    data = datatype_sample(datatype)
    if datatype == "BF16":
        import ml_dtypes  # tritonclient >= 2.67 carries BF16 as ml_dtypes.bfloat16

        data = data.astype(ml_dtypes.bfloat16)
    inp = tg.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    return [inp], data


# -- every datatype -----------------------------------------------------------------------------
@pytest.mark.parametrize("api", APIS)
def test_every_datatype(server: ServerProcess, api: str) -> None:
    def check(datatype: str, result: Any, data: np.ndarray) -> None:
        assert_same(datatype, result.as_numpy("OUTPUT0"), data)

    if api == "grpc":
        client = tg.InferenceServerClient(server.grpc_url)
        for datatype in DATATYPES:
            inputs, data = datatype_input(datatype)
            check(datatype, client.infer(f"identity_{datatype.lower()}", inputs), data)
        return

    async def main() -> None:
        async with tga.InferenceServerClient(server.grpc_url) as client:
            cases = [(datatype, *datatype_input(datatype)) for datatype in DATATYPES]
            results = await asyncio.gather(
                *(client.infer(f"identity_{datatype.lower()}", inputs) for datatype, inputs, _ in cases)
            )
            for (datatype, _, data), result in zip(cases, results, strict=True):
                check(datatype, result, data)

    run(main())


# -- streaming --------------------------------------------------------------------------------
def test_aio_stream_1000_in_flight(server: ServerProcess) -> None:
    """All 1,000 requests are written before any answer is read; errors come back in-stream."""

    async def main() -> tuple[dict, list]:
        async with tga.InferenceServerClient(server.grpc_url) as client:

            async def requests() -> Any:
                for i in range(1000):
                    if i % 50 == 7:
                        bad = tg.InferInput("INPUT0", [1, 8], "INT32")
                        bad.set_data_from_numpy(np.zeros((1, 8), np.int32))
                        yield {"model_name": "simple", "inputs": [bad, filled_inputs()[1]], "request_id": f"bad-{i}"}
                    else:
                        yield {"model_name": "simple", "inputs": filled_inputs(i), "request_id": f"ok-{i}"}

            answers, errors = {}, []
            stream = client.stream_infer(requests(), stream_timeout=240)
            async for result, error in stream:
                if error is not None:
                    errors.append(str(error))
                else:
                    answers[result.get_response().id] = result.as_numpy("OUTPUT0")
                if len(answers) + len(errors) == 1000:
                    break
            stream.cancel()
            return answers, errors

    answers, errors = run(main())
    assert len(errors) == 20 and all("INPUT0" in message for message in errors)
    assert len(answers) == 980
    for request_id, output in answers.items():
        i = int(request_id.split("-")[1])
        assert output.tolist() == [[i + k for k in range(16)]]


# -- system shared memory -------------------------------------------------------------------------
def test_aio_system_shared_memory(server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    size = a.nbytes
    key_in, key_out = f"/fastoip_aio_in_{os.getpid()}", f"/fastoip_aio_out_{os.getpid()}"
    handle_in = shm.create_shared_memory_region("aio_in", key_in, size * 2)
    handle_out = shm.create_shared_memory_region("aio_out", key_out, size * 2)

    async def main() -> None:
        async with tga.InferenceServerClient(server.grpc_url) as client:
            await client.register_system_shared_memory("aio_in", key_in, size * 2)
            await client.register_system_shared_memory("aio_out", key_out, size * 2)
            try:
                status = await client.get_system_shared_memory_status(as_json=True)
                assert {"aio_in", "aio_out"} <= set(status["regions"])
                inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
                inputs[0].set_shared_memory("aio_in", size)
                inputs[1].set_shared_memory("aio_in", size, offset=size)
                outputs = [tg.InferRequestedOutput("OUTPUT0"), tg.InferRequestedOutput("OUTPUT1")]
                outputs[0].set_shared_memory("aio_out", size)
                outputs[1].set_shared_memory("aio_out", size, offset=size)
                result = await client.infer("simple", inputs, outputs=outputs)
                assert [len(raw) for raw in result.get_response().raw_output_contents] == [0, 0]
            finally:
                await client.unregister_system_shared_memory("aio_in")
                await client.unregister_system_shared_memory("aio_out")
            remaining = (await client.get_system_shared_memory_status(as_json=True)).get("regions", {})
            assert not {"aio_in", "aio_out"} & set(remaining)

    try:
        shm.set_shared_memory_region(handle_in, [a])
        shm.set_shared_memory_region(handle_in, [b], offset=size)
        run(main())
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=size), a - b)
    finally:
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


# -- model control ----------------------------------------------------------------------------
def spare_input() -> list[tg.InferInput]:
    inp = tg.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.full((1, 4), 2.5, np.float32))
    return [inp]


@pytest.mark.parametrize("api", APIS)
def test_model_control_unload_and_load(server: ServerProcess, api: str) -> None:
    if api == "grpc":
        client = tg.InferenceServerClient(server.grpc_url)
        client.unload_model("spare")
        assert not client.is_model_ready("spare")
        with pytest.raises(InferenceServerException) as err:
            client.infer("spare", spare_input())
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        client.load_model("spare")
        assert client.is_model_ready("spare")
        assert client.infer("spare", spare_input()).as_numpy("OUTPUT0").tolist() == [[2.5] * 4]
        return

    async def main() -> None:
        async with tga.InferenceServerClient(server.grpc_url) as client:
            await client.unload_model("spare")
            assert not await client.is_model_ready("spare")
            with pytest.raises(InferenceServerException) as err:
                await client.infer("spare", spare_input())
            assert err.value.status() == "StatusCode.UNAVAILABLE"
            await client.load_model("spare")
            assert await client.is_model_ready("spare")
            index = {m["name"]: m for m in (await client.get_model_repository_index(as_json=True))["models"]}
            assert index["spare"]["state"] == "READY"
            result = await client.infer("spare", spare_input())
            assert result.as_numpy("OUTPUT0").tolist() == [[2.5] * 4]

    run(main())


# -- deadlines and cancellation -------------------------------------------------------------------
def occupy_slow_model(client: tg.InferenceServerClient) -> list:
    """One slow request running (or about to): whatever follows waits in the queue behind it.

    Returns the list its (result, error) lands in when it finishes.
    """
    done: list = []
    client.async_infer("slow", slow_input(), callback=lambda result, error: done.append((result, error)))
    return done


@pytest.mark.parametrize("api", APIS)
def test_deadline_exceeded_while_queued(server: ServerProcess, api: str) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    before = inference_count(client, "slow")  # the test before left "slow" settled (see executions_settled)
    done = occupy_slow_model(client)
    time.sleep(0.2)
    if api == "grpc":
        with pytest.raises(InferenceServerException) as err:
            client.infer("slow", slow_input(), client_timeout=0.3)
    else:

        async def main() -> None:
            async with tga.InferenceServerClient(server.grpc_url) as aio_client:
                await aio_client.infer("slow", slow_input(), client_timeout=0.3)

        with pytest.raises(InferenceServerException) as err:
            run(main())
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED", err.value
    assert wait_until(lambda: len(done) == 1, timeout=120)  # the request that was running still finishes
    assert done[0][1] is None, done[0][1]
    # the expired request left the queue: only the occupying request executed
    assert executions_settled(client, "slow") - before == 1
    assert client.is_server_live()


@pytest.mark.parametrize("api", APIS)
def test_cancelled_unary_requests_leave_the_queue(server: ServerProcess, api: str) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    before = inference_count(client, "slow")  # the test before left "slow" settled (see executions_settled)
    done = occupy_slow_model(client)
    time.sleep(0.2)
    queued = 6
    if api == "grpc":
        handles = [
            client.async_infer("slow", slow_input(), callback=lambda result, error: None) for _ in range(queued)
        ]
        time.sleep(0.3)  # they reach the server's queue
        for handle in handles:
            handle.cancel()
    else:

        async def main() -> None:
            async with tga.InferenceServerClient(server.grpc_url) as aio_client:
                tasks = [asyncio.ensure_future(aio_client.infer("slow", slow_input())) for _ in range(queued)]
                await asyncio.sleep(0.3)
                for task in tasks:
                    task.cancel()
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
                expected = (asyncio.CancelledError, InferenceServerException)
                assert all(isinstance(outcome, expected) for outcome in outcomes), outcomes

        run(main())
    assert wait_until(lambda: len(done) == 1, timeout=120)
    ran = executions_settled(client, "slow") - before
    # The occupying request ran; at most one queued request may have been taken before its cancel arrived.
    assert 1 <= ran <= 2, f"{ran - 1} of {queued} cancelled requests ran anyway"
    assert client.infer("slow", slow_input()).as_numpy("OUTPUT0").shape == (1, 1)


def test_stream_stop_cancels_queued_requests(server: ServerProcess) -> None:
    client = tg.InferenceServerClient(server.grpc_url)
    before = inference_count(client, "slow")  # the test before left "slow" settled (see executions_settled)
    client.start_stream(callback=lambda result, error: None)
    for i in range(6):
        client.async_stream_infer("slow", slow_input(), request_id=str(i))
    time.sleep(0.5)
    client.stop_stream(cancel_requests=True)
    ran = executions_settled(client, "slow") - before
    assert ran <= 2, f"{ran} of 6 stream requests ran after the stream was cancelled"


# -- compression ------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("api", APIS)
def test_compressed_requests(server: ServerProcess, api: str, algorithm: str) -> None:
    x = np.zeros((1, 600_000), np.float32)  # compresses well: the wire really carries a compressed message
    x[0, ::1000] = np.arange(600, dtype=np.float32)
    inp = tg.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    if api == "grpc":
        client = tg.InferenceServerClient(server.grpc_url)
        got = client.infer("big_fp32", [inp], compression_algorithm=algorithm).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(got, x)
        results: list = []
        client.start_stream(
            callback=lambda result, error: results.append((result, error)), compression_algorithm=algorithm
        )
        client.async_stream_infer("simple", filled_inputs(3), request_id="z")
        assert wait_until(lambda: len(results) == 1, timeout=60)
        client.stop_stream()
        assert results[0][1] is None and results[0][0].as_numpy("OUTPUT0").tolist() == [[3 + k for k in range(16)]]
        return

    async def main() -> None:
        async with tga.InferenceServerClient(server.grpc_url) as aio_client:
            result = await aio_client.infer("big_fp32", [inp], compression_algorithm=algorithm)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)

    run(main())


# -- large messages ---------------------------------------------------------------------------
def test_64_mb_message(server: ServerProcess) -> None:
    x = np.arange(16 * 1024 * 1024, dtype=np.float32).reshape(1, -1)  # 64 MiB of FP32 each way
    inp = tg.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = tg.InferenceServerClient(server.grpc_url).infer("big_fp32", [inp], client_timeout=240).as_numpy("OUTPUT0")
    assert got.shape == x.shape and np.array_equal(got, x)




@pytest.mark.slow
@pytest.mark.timeout(600)
def test_1_gb_message(server: ServerProcess) -> None:
    if os.environ.get("FASTOIP_TEST_HUGE") != "1" and mem_available_gib() < HUGE_NEEDS_GIB:
        pytest.skip(
            f"1 GiB message needs ~11 GiB across client and server; {mem_available_gib():.1f} GiB free "
            f"(< {HUGE_NEEDS_GIB:.0f}): set FASTOIP_TEST_HUGE=1 to run it anyway"
        )
    count = 256 * 1024 * 1024  # 1 GiB of FP32
    x = np.empty((1, count), np.float32)
    x[0, :] = 1.0
    x[0, ::4096] = np.arange(count // 4096, dtype=np.float32)
    inp = tg.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = tg.InferenceServerClient(server.grpc_url).infer("big_fp32", [inp], client_timeout=540).as_numpy("OUTPUT0")
    assert got.shape == x.shape
    assert np.array_equal(got[0, ::4096], x[0, ::4096]) and np.array_equal(got, x)


def test_server_alive_after_the_client_suite(server: ServerProcess) -> None:
    assert server.proc is not None and server.proc.poll() is None
    assert tg.InferenceServerClient(server.grpc_url).is_server_live()
    channel = grpc.insecure_channel(server.grpc_url)
    grpc.channel_ready_future(channel).result(timeout=30)
    channel.close()

"""Many open, idle ModelStreamInfer streams must not starve the server (issue 12).

1,000 streams over 50 connections each send one request and stay open, as sequence and streaming clients
do.  Every stream gets its first answer, and a unary infer and ServerLive from another client still answer
promptly.  The grpcio frontend holds a handler thread per open stream (16 by default), so it cannot pass:
that case is an expected failure, kept to show the difference.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fastoip._proto import grpc_service_pb2 as pb
from h2raw import MODEL_INFER, SERVICE, simple_request_bytes
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(300)

STREAMS = 1000
CONNECTIONS = 50
#: Time for all 1,000 first answers on a slow shared machine: a bound, not a benchmark.
FIRST_ANSWERS_S = 30.0
#: The issue asks for 1 s on a quiet machine; this is the correctness bound on a shared 2-core one
#: (grpcio never answers at all here: its 16 handler threads are all held by streams).
OTHER_CLIENT_S = 5.0
#: grpcio's expected failure needs no 30 s to show: its 16 handler threads are held by the first 16 streams, so
#: stream 17 is not answered at all (it waits for a thread, however long the bound).
GRPCIO_FIRST_ANSWERS_S = 5.0
GRPCIO_REASON = "grpcio holds a handler thread per open stream (--grpc-workers 16): stream 17 and every other call wait"


@pytest.fixture()
def stream_server(demo_repo: Path, grpc_frontend: str) -> Iterator[ServerProcess]:
    # A server of its own: against grpcio the open streams leave it saturated until they close, and
    # its shutdown may then hang on handler threads: stop it with a short bound (then SIGKILL).
    proc = ServerProcess(demo_repo, "--exit-timeout", "5", grpc_frontend=grpc_frontend).start()
    try:
        yield proc
    finally:
        proc.stop(timeout=10)


def new_connection(url: str) -> grpc.aio.Channel:
    """A channel with its own subchannel pool: its own TCP connection, not one shared with other channels."""
    return grpc.aio.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)])


async def first_answer(call: grpc.aio.StreamStreamCall, request_id: str) -> pb.ModelStreamInferResponse:
    await call.write(simple_request_bytes(request_id))
    answer = await call.read()
    assert answer is not grpc.aio.EOF, f"stream {request_id} ended without an answer"
    return pb.ModelStreamInferResponse.FromString(answer)


async def idle_streams_then_other_calls(url: str, first_answers_s: float = FIRST_ANSWERS_S) -> None:
    channels = [new_connection(url) for _ in range(CONNECTIONS)]
    other = new_connection(url)
    try:
        calls = []
        for index in range(STREAMS):
            open_stream = channels[index % CONNECTIONS].stream_stream(SERVICE + "ModelStreamInfer")
            calls.append(open_stream())  # no deadline: the stream stays open as long as the client wants
        started = time.monotonic()
        answers = await asyncio.wait_for(
            asyncio.gather(*(first_answer(call, f"idle-{i}") for i, call in enumerate(calls))), first_answers_s
        )
        assert [a.error_message for a in answers] == [""] * STREAMS
        assert [a.infer_response.id for a in answers] == [f"idle-{i}" for i in range(STREAMS)]
        opened_s = time.monotonic() - started

        # All 1,000 streams are open and idle now.  Another client's calls are answered within the bound
        # (the deadline is the assertion: DEADLINE_EXCEEDED fails the test).
        live = other.unary_unary(
            SERVICE + "ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        assert (await live(pb.ServerLiveRequest(), timeout=OTHER_CLIENT_S)).live
        infer = other.unary_unary(MODEL_INFER)
        response = await infer(simple_request_bytes("other-client"), timeout=OTHER_CLIENT_S)
        assert pb.ModelInferResponse.FromString(response).id == "other-client"

        # The idle streams are still usable: a second request on a few of them is answered too.
        for index in (0, STREAMS // 2, STREAMS - 1):
            again = await asyncio.wait_for(first_answer(calls[index], f"again-{index}"), OTHER_CLIENT_S)
            assert again.infer_response.id == f"again-{index}"
        for call in calls:
            await call.done_writing()
        leftovers = await asyncio.wait_for(asyncio.gather(*(call.read() for call in calls)), FIRST_ANSWERS_S)
        assert all(item is grpc.aio.EOF for item in leftovers)  # each stream then ends cleanly
        assert opened_s < first_answers_s
    finally:
        for channel in [*channels, other]:
            await channel.close(grace=None)


def test_1000_idle_streams_do_not_starve_other_calls(
    stream_server: ServerProcess, grpc_frontend: str, request: pytest.FixtureRequest
) -> None:
    bound = FIRST_ANSWERS_S
    if grpc_frontend == "grpcio":
        request.applymarker(pytest.mark.xfail(strict=False, reason=GRPCIO_REASON))
        bound = GRPCIO_FIRST_ANSWERS_S
    asyncio.run(idle_streams_then_other_calls(stream_server.grpc_url, bound))
    assert stream_server.proc is not None and stream_server.proc.poll() is None

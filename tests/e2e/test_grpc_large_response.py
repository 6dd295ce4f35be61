"""Large responses on the native gRPC frontend: outputs sent from their arrays (codec parts), byte for byte.

A response with an output of 64 KiB or more leaves as parts (``_codec.encode_infer_response_parts``): the
header stretches are copied, the large outputs go out as views of the arrays the model produced.  These
tests check what a client receives, through the flow-control windows of several frames, against what it sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
from onnx import TensorProto

from models import identity_model_bytes, write_model
from serverproc import ServerProcess

pytest.importorskip("fastoip.server.grpc._http2", reason="the native gRPC frontend was not built (libnghttp2-dev)")


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("large-response")
    write_model(root, "big", identity_model_bytes(TensorProto.FLOAT, ["n"], "big"))
    write_model(root, "small", identity_model_bytes(TensorProto.INT32, [4], "small"))
    with ServerProcess(root, "--grpc-frontend", "native") as proc:
        yield proc


def identity_call(client: tg.InferenceServerClient, model: str, x: np.ndarray, datatype: str) -> np.ndarray:
    inp = tg.InferInput("INPUT0", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("count", [16_383, 16_384, 100_000, 3 << 20])  # around the 64 KiB part threshold, 12 MiB
def test_large_outputs_arrive_byte_for_byte(native: ServerProcess, count: int) -> None:
    client = tg.InferenceServerClient(native.grpc_url)
    x = np.random.default_rng(count).standard_normal((1, count)).astype(np.float32)
    got = identity_call(client, "big", x, "FP32")
    assert got.shape == x.shape and np.array_equal(got, x)
    # the small model after a large answer on the same connection: the stream bookkeeping is intact
    y = np.arange(4, dtype=np.int32).reshape(1, 4)
    assert np.array_equal(identity_call(client, "small", y, "INT32"), y)


def test_concurrent_large_responses_keep_their_own_bytes(native: ServerProcess) -> None:
    """Many large answers in flight on one connection interleave as DATA frames; each gets its own bytes."""

    async def run() -> None:
        async with tga.InferenceServerClient(native.grpc_url) as client:

            async def one(k: int) -> None:
                x = np.full((1, 200_000), float(k), np.float32)
                x[0, ::1000] = np.arange(200, dtype=np.float32) + k
                inp = tga.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                got = (await client.infer("big", [inp])).as_numpy("OUTPUT0")
                assert np.array_equal(got, x), f"call {k}"

            await asyncio.gather(*(one(k) for k in range(24)))

    asyncio.run(asyncio.wait_for(run(), 120))


"""What Triton's sequence and ensemble client examples do and check, against a real fastoip.

Each test makes the calls of one example of ``triton-inference-server/client`` (``src/python/examples``)
and asserts what the example asserts (our own code, the examples' expectations):

- ``simple_grpc_sequence_sync_infer_client.py``, ``simple_grpc_sequence_stream_infer_client.py``,
  ``simple_grpc_aio_sequence_stream_infer_client.py`` and ``simple_http_sequence_sync_infer_client.py``,
  each plain and with ``--dyna``: two integer sequences and one string sequence, sent step by step (sync)
  or all at once on one stream (answers routed by the echoed request id);
- ``ensemble_image_client.py``: encoded image files (BYTES) into an ensemble of an image decoder and a
  classifier, ``class_count`` answers "score:index:label".

The models are ONNX stand-ins built in ``tests/models.py`` with the semantics of Triton's example models:
``simple_sequence`` (INPUT + START) * READY, direct strategy; ``simple_dyna_sequence``
(INPUT + START + END * CORRID) * READY, oldest strategy; ``simple_string_dyna_sequence`` the dyna_sequence
backend's accumulator with a string correlation id, here an implicit state.
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from models import (
    accumulator_sequence_model_bytes,
    dyna_sequence_model_bytes,
    image_model_bytes,
    ppm_decoder_model_bytes,
    sequence_controls,
    simple_sequence_model_bytes,
    write_model,
)
from serverproc import ServerProcess

VALUES = [11, 7, 5, 3, 2, 0, 1]
IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
OLDEST = "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }"
CLASSES = [f"class_{i}" for i in range(10)]
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" } ]
ensemble_scheduling { step [
  { model_name: "image_preprocess" model_version: -1
    input_map { key: "IMAGE" value: "INPUT" } output_map { key: "SCALED" value: "preprocessed_image" } },
  { model_name: "image_classifier" model_version: -1
    input_map { key: "INPUT" value: "preprocessed_image" } output_map { key: "OUTPUT" value: "OUTPUT" } }
] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequence_examples")
    write_model(root, "simple_sequence", simple_sequence_model_bytes(), config=(
        "max_batch_size: 8\n" + IO + "sequence_batching { " + sequence_controls("START", "READY") + " }\n"))
    write_model(root, "simple_dyna_sequence", dyna_sequence_model_bytes(), config=(
        "max_batch_size: 8\n" + IO + "sequence_batching { max_sequence_idle_microseconds: 10000000 " + OLDEST
        + sequence_controls("START", "END", "READY", "CORRID") + " }\n"))
    write_model(root, "simple_string_dyna_sequence", accumulator_sequence_model_bytes(), config=(
        "max_batch_size: 8\n" + IO + "sequence_batching { max_sequence_idle_microseconds: 10000000 " + OLDEST
        + sequence_controls("START", "END", "READY", "CORRID", corrid_type="TYPE_STRING")
        + ' state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] }\n'))
    write_model(root, "image_preprocess", ppm_decoder_model_bytes(), config="max_batch_size: 4\n")
    write_model(root, "image_classifier", image_model_bytes(), config="max_batch_size: 4\n")
    (root / "preprocess_inception_ensemble" / "1").mkdir(parents=True)
    (root / "preprocess_inception_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    (root / "preprocess_inception_ensemble" / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    with ServerProcess(root, http=True) as proc:
        yield proc


def model_names(dyna: bool) -> tuple[str, str]:
    """The (integer, string) sequence models the examples pick."""
    return ("simple_dyna_sequence", "simple_string_dyna_sequence") if dyna else ("simple_sequence", "simple_sequence")


def sequences(dyna: bool, string_id: str | None = None) -> list[tuple[Any, list[int]]]:
    """The examples' three sequences: (sequence id, values sent)."""
    string_id = string_id or ("1002" if dyna else str(uuid.uuid4()))
    return [(1000, [0, *VALUES]), (1001, [100, *(-v for v in VALUES)]), (string_id, [20, *(-v for v in VALUES)])]


def check_results(dyna: bool, results: list[list[int]], ids: list[Any]) -> None:
    """The examples' final loop: what each step of each sequence must answer."""
    int0, int1, string0 = results
    assert len(int0) == len(int1) == len(string0) == len(VALUES) + 1
    for i in range(len(int0)):
        int0_expected = 1 if i == 0 else VALUES[i - 1]
        int1_expected = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            string0_expected = 20 if dyna else 21
        elif dyna:
            string0_expected = -VALUES[i - 1] + string0[i - 1]
        else:
            string0_expected = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:  # the dyna models add the correlation id at the end
            int0_expected += ids[0]
            int1_expected += ids[1]
            string0_expected += int(ids[2])
        assert (int0[i], int1[i], string0[i]) == (int0_expected, int1_expected, string0_expected), i


def sync_send(module: ModuleType, client: Any, values: list[int], sequence_id: Any, model: str) -> list[int]:
    """The examples' ``sync_send``: one blocking request per value, START on the first, END on the last."""
    answers = []
    for count, value in enumerate(values, start=1):
        data = np.full(shape=[1, 1], fill_value=value, dtype=np.int32)
        inputs = [module.InferInput("INPUT", data.shape, "INT32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer(model_name=model, inputs=inputs, outputs=[module.InferRequestedOutput("OUTPUT")],
                              sequence_id=sequence_id, sequence_start=count == 1,
                              sequence_end=count == len(values))
        answers.append(int(result.as_numpy("OUTPUT")[0][0]))
    return answers


# -- simple_grpc_sequence_sync_infer_client.py / simple_http_sequence_sync_infer_client.py [-d] -----------
@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sequence_sync_examples(server: ServerProcess, protocol: str, dyna: bool) -> None:
    module: ModuleType = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    int_model, string_model = model_names(dyna)
    plan = sequences(dyna)
    results = [sync_send(module, client, values, sequence_id, model)
               for (sequence_id, values), model in zip(plan, [int_model, int_model, string_model], strict=True)]
    check_results(dyna, results, [sequence_id for sequence_id, _ in plan])


# -- simple_grpc_sequence_stream_infer_client.py [-d] ---------------------------------------------------
@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_sequence_stream_example(server: ServerProcess, dyna: bool) -> None:
    int_model, string_model = model_names(dyna)
    # the example's stream run uses its own ids (offset 0 as well); a fresh string id keeps runs apart
    plan = sequences(dyna, "1003" if dyna else None)
    completed: queue.Queue = queue.Queue()

    def callback(user_data: queue.Queue, result: Any, error: Any) -> None:
        user_data.put(error if error else result)

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=partial(callback, completed))
        for (sequence_id, values), model in zip(plan, [int_model, int_model, string_model], strict=True):
            for count, value in enumerate(values, start=1):  # the example's async_stream_send
                data = np.full(shape=[1, 1], fill_value=value, dtype=np.int32)
                inputs = [grpcclient.InferInput("INPUT", data.shape, "INT32")]
                inputs[0].set_data_from_numpy(data)
                client.async_stream_infer(model_name=model, inputs=inputs,
                                          outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                                          request_id=f"{sequence_id}_{count}", sequence_id=sequence_id,
                                          sequence_start=count == 1, sequence_end=count == len(values))
        items = [completed.get(timeout=60) for _ in range(3 * (len(VALUES) + 1))]
        client.stop_stream()
    check_stream_results(dyna, plan, items)


def check_stream_results(dyna: bool, plan: list[tuple[Any, list[int]]], items: list[Any]) -> None:
    """The stream examples route each answer to its sequence by the echoed request id, then check as the others."""
    by_sequence: dict[str, list[int]] = {str(sequence_id): [] for sequence_id, _ in plan}
    assert len(items) == 3 * (len(VALUES) + 1)
    for item in items:
        assert not isinstance(item, Exception), item
        this_id = item.get_response().id.split("_")[0]
        by_sequence[this_id].append(int(item.as_numpy("OUTPUT")[0][0]))
    check_results(dyna, [by_sequence[str(sequence_id)] for sequence_id, _ in plan],
                  [sequence_id for sequence_id, _ in plan])


# -- simple_grpc_aio_sequence_stream_infer_client.py [-d] -----------------------------------------------
@pytest.mark.parametrize("dyna", [False, True], ids=["plain", "dyna"])
def test_sequence_aio_stream_example(server: ServerProcess, dyna: bool) -> None:
    import tritonclient.grpc.aio as aioclient

    int_model, string_model = model_names(dyna)
    plan = sequences(dyna, "1004" if dyna else None)

    async def requests() -> AsyncIterator[dict[str, Any]]:  # the example's async_stream_yield, three times
        for (sequence_id, values), model in zip(plan, [int_model, int_model, string_model], strict=True):
            for count, value in enumerate(values, start=1):
                data = np.full(shape=[1, 1], fill_value=value, dtype=np.int32)
                inputs = [aioclient.InferInput("INPUT", data.shape, "INT32")]
                inputs[0].set_data_from_numpy(data)
                yield {"model_name": model, "inputs": inputs, "outputs": [aioclient.InferRequestedOutput("OUTPUT")],
                       "request_id": f"{sequence_id}_{count}", "sequence_id": sequence_id,
                       "sequence_start": count == 1, "sequence_end": count == len(values)}

    async def run() -> list[Any]:
        items = []
        async with aioclient.InferenceServerClient(url=server.grpc_url) as client:
            # the example reads until the server ends the stream: every answer must come before that
            async for result, error in client.stream_infer(inputs_iterator=requests(), stream_timeout=60):
                items.append(error if error else result)
        return items

    check_stream_results(dyna, plan, asyncio.run(run()))


# -- ensemble_image_client.py -m preprocess_inception_ensemble -c 1 [-i grpc] <folder> -----------------
def ppm(pixels: np.ndarray) -> bytes:
    """A plain PPM file of an HWC uint8 image, tokens separated by single spaces."""
    height, width, _ = pixels.shape
    return " ".join(["P3", str(width), str(height), "255", *map(str, pixels.reshape(-1))]).encode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_image_client_example(server: ServerProcess, protocol: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8) for _ in range(3)]
    for index, image in enumerate(images):
        (tmp_path / f"img{index}.ppm").write_bytes(ppm(image))
    module: ModuleType = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    name = "preprocess_inception_ensemble"

    metadata = client.get_model_metadata(model_name=name)
    config = client.get_model_config(model_name=name)
    if protocol == "grpc":  # parse_model_grpc / parse_model_http
        assert len(metadata.inputs) == 1 and len(config.config.input) == 1
        input_name, output_names, batch_size = (metadata.inputs[0].name, [o.name for o in metadata.outputs],
                                                config.config.max_batch_size)
    else:
        assert len(metadata["inputs"]) == 1 and len(config["input"]) == 1
        input_name, output_names, batch_size = (metadata["inputs"][0]["name"],
                                                [o["name"] for o in metadata["outputs"]], config["max_batch_size"])
    filenames = sorted(str(path) for path in tmp_path.iterdir())
    batch_size = min(batch_size, len(filenames))
    image_data = [np.array([Path(f).read_bytes()], dtype=bytes) for f in filenames[:batch_size]]
    batched = np.stack(image_data, axis=0)
    inputs = [module.InferInput(input_name, batched.shape, "BYTES")]
    if protocol == "grpc":
        inputs[0].set_data_from_numpy(batched)
        outputs = [grpcclient.InferRequestedOutput(n, class_count=1) for n in output_names]
    else:
        inputs[0].set_data_from_numpy(batched, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True, class_count=1) for n in output_names]
    result = client.infer(name, inputs, outputs=outputs)

    answers = result.as_numpy("OUTPUT")  # postprocess: one "score:index:label" per image
    assert len(answers) == batch_size == 3
    weights = np.arange(30, dtype=np.float32).reshape(3, 10) / 10.0
    for image, answer in zip(images, answers, strict=True):
        scores = (image.astype(np.float32) / 255.0).mean(axis=(0, 1)) @ weights
        score, index, label = answer[0].decode().split(":")
        assert (int(index), label) == (int(scores.argmax()), CLASSES[int(scores.argmax())])
        assert float(score) == pytest.approx(float(scores.max()), rel=1e-5)

"""Triton's generate extension over a real HTTP server: ``/generate`` (one JSON) and ``/generate_stream`` (SSE).

The stream is read by a real streaming client (httpx) and a real SSE parser
(httpx-sse), event by event.  Models: a decoupled async generator streaming
one response per word, and an ordinary (non-decoupled) Python model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from python_models import COUNTER, COUNTER_CONFIG, WORDS, WORDS_CONFIG, write_python_model
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(180)

#: Not decoupled: one response; inputs of several kinds to check Triton's JSON -> tensor mapping.
SHOUT = """
    import numpy as np
    import fastoip

    class Shout(fastoip.Model):
        def predict(self, inputs, parameters):
            text = inputs["text_input"].reshape(-1)[0].decode()
            return {
                "text_output": [text.upper() + "!" * int(parameters.get("excitement", 0))],
                "scores": inputs["scores"].astype(np.float32) * 2,
                "shape": np.array(inputs["scores"].shape, dtype=np.int64),
                "seen": [" ".join(sorted(k for k in parameters))],
            }
"""

SHOUT_CONFIG = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
            { name: "scores" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
             { name: "scores" data_type: TYPE_FP32 dims: [ -1, 2 ] },
             { name: "shape" data_type: TYPE_INT64 dims: [ -1 ] },
             { name: "seen" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("generate")
    write_python_model(root, "words", WORDS, WORDS_CONFIG)
    write_python_model(root, "counter", COUNTER, COUNTER_CONFIG)
    write_python_model(root, "shout", SHOUT, SHOUT_CONFIG)
    with ServerProcess(root, http=True) as proc:
        yield proc


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=60) as opened:
        yield opened


def stream_events(client: httpx.Client, path: str, body: Any) -> tuple[int, str, list[dict]]:
    """Status, content type and every SSE event's JSON, read as the events arrive."""
    with connect_sse(client, "POST", path, json=body) as source:
        response = source.response
        sse = list(source.iter_sse())
        assert all(event.event == "message" for event in sse)  # data-only events: the default type
        return response.status_code, response.headers["content-type"], [json.loads(event.data) for event in sse]


def test_generate_stream_sends_one_event_per_response(client: httpx.Client) -> None:
    status, content_type, events = stream_events(
        client, "/v2/models/words/generate_stream", {"id": "42", "text_input": "the quick brown fox"}
    )
    assert status == 200 and content_type == "text/event-stream; charset=utf-8"
    assert [e["text_output"] for e in events] == ["the", "quick", "brown", "fox"]
    assert [e["position"] for e in events] == [0, 1, 2, 3]
    assert all(e["id"] == "42" and e["model_name"] == "words" and e["model_version"] == "1" for e in events)
    # Triton's flat object: outputs, parameters and the reserved fields at one level, keys sorted
    assert list(events[0]) == sorted(events[0])


def test_generate_stream_parameters_reach_the_model(client: httpx.Client) -> None:
    _, _, events = stream_events(
        client, "/v2/models/words/generate_stream", {"text_input": "a b", "parameters": {"upper": True}}
    )
    assert [e["text_output"] for e in events] == ["A", "B"]
    assert "id" not in events[0]  # no id asked: none answered


def test_generate_stream_with_no_response_is_an_empty_stream(client: httpx.Client) -> None:
    status, _, events = stream_events(client, "/v2/models/words/generate_stream", {"text_input": ""})
    assert status == 200 and events == []


def test_generate_stream_of_a_long_stream(client: httpx.Client) -> None:
    status, _, events = stream_events(client, "/v2/models/counter/generate_stream", {"COUNT": 1000})
    assert status == 200 and [e["INDEX"] for e in events] == list(range(1000))


def test_an_error_mid_stream_is_an_error_event_under_200(client: httpx.Client) -> None:
    status, _, events = stream_events(client, "/v2/models/words/generate_stream", {"text_input": "one two boom x"})
    assert status == 200
    assert [e.get("text_output") for e in events[:2]] == ["one", "two"]
    assert len(events) == 3 and "boom in the middle" in events[2]["error"]


def test_an_error_first_sets_the_stream_status(client: httpx.Client) -> None:
    status, content_type, events = stream_events(client, "/v2/models/words/generate_stream", {"text_input": "fail"})
    assert status == 400 and content_type.startswith("text/event-stream")
    assert events == [{"error": "the model refuses 'fail'"}]


def test_generate_on_an_ordinary_model_maps_json_fields_to_inputs_and_parameters(client: httpx.Client) -> None:
    answer = client.post(
        "/v2/models/shout/generate",
        json={"text_input": "hi", "scores": [1, 2, 3, 4], "parameters": {"excitement": 2, "note": "x"}, "t": 0.5},
    )
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    doc = answer.json()
    assert doc["text_output"] == "HI!!"  # one element: the value itself
    assert doc["scores"] == [2, 4, 6, 8]  # more: a flat list
    # scores [-1, -1, 2] (batch, variable, 2): 4 elements -> 2 rows, the batch dim 1
    assert doc["shape"] == [1, 2, 2]
    assert doc["seen"] == "excitement note t"  # non-input fields are parameters, at any level
    assert doc["model_name"] == "shout" and doc["model_version"] == "1" and "id" not in doc


def test_generate_stream_on_an_ordinary_model_is_one_event(client: httpx.Client) -> None:
    status, _, events = stream_events(client, "/v2/models/shout/versions/1/generate_stream",
                                      {"text_input": "yo", "scores": [0.5, 1.5]})
    assert status == 200 and len(events) == 1 and events[0]["text_output"] == "YO"


def test_generate_on_a_decoupled_model_with_one_response(client: httpx.Client) -> None:
    answer = client.post("/v2/models/words/generate", json={"id": "7", "text_input": "single"})
    assert answer.status_code == 200
    assert answer.json() == {"id": "7", "model_name": "words", "model_version": "1", "position": 0,
                             "text_output": "single"}


@pytest.mark.parametrize("text", ["two words", ""])
def test_generate_wants_exactly_one_response(client: httpx.Client, text: str) -> None:
    answer = client.post("/v2/models/words/generate", json={"text_input": text})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "generate expects model to produce exactly 1 response, use generate stream for model that "
        "generates various number of responses"
    }


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"{not json", 400, "malformed JSON"),
        ({"text_input": "x", "id": 5}, 400, "Unable to parse 'id'"),
        ({"text_input": "x", "k": [1, 2]}, 400,
         "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ({"text_input": "x", "parameters": "loud"}, 400, "Expected JSON object for keyword: 'parameters'"),
        # two strings fill the batch dim of text_input [-1, 1] (Triton's mapping), so the batches disagree
        ({"text_input": ["a", "b"], "scores": [1.0, 2.0]}, 400, "batch size does not match other inputs"),
        ({"text_input": "x", "scores": [1.0, 2.0, 3.0]}, 400,
         "The schema can not convert input 'scores' to tensor with proper shape"),
        ({"text_input": 3, "scores": [1.0, 2.0]}, 400, "BYTES data must be strings"),
        ({"scores": [1.0, 2.0]}, 400, "missing required input(s) ['text_input']"),
    ],
)
@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_bad_requests_answer_a_json_error_before_anything_runs(
    client: httpx.Client, body: Any, status: int, words: str, endpoint: str
) -> None:
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    answer = client.post(f"/v2/models/shout/{endpoint}", **sent)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    assert words in answer.json()["error"]


def test_unknown_model_and_wrong_method(client: httpx.Client) -> None:
    answer = client.post("/v2/models/nope/generate", json={"text_input": "x"})
    assert answer.status_code == 404 and "nope" in answer.json()["error"]
    assert client.get("/v2/models/words/generate_stream").status_code == 405
    # the server is still up and serving
    assert client.post("/v2/models/words/generate", json={"text_input": "ok"}).json()["text_output"] == "ok"


def test_a_client_that_leaves_mid_stream_stops_the_model(client: httpx.Client) -> None:
    endless = {"COUNT": 1_000_000, "delay": 0.01}
    with connect_sse(client, "POST", "/v2/models/counter/generate_stream", json=endless) as source:
        for index, event in enumerate(source.iter_sse()):
            assert json.loads(event.data)["INDEX"] == index
            if index == 5:
                break
    # the cancelled request ends (the generator stops; 1,000,000 x 10 ms would take hours): the model's
    # one instance serves the next request
    assert client.post("/v2/models/counter/generate", json={"COUNT": 1}).json()["INDEX"] == 0


def test_the_ordinary_infer_endpoint_still_answers(client: httpx.Client) -> None:
    doc = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]},
                      {"name": "scores", "datatype": "FP32", "shape": [1, 1, 2], "data": [1, 2]}]}
    answer = client.post("/v2/models/shout/infer", json=doc)
    assert answer.status_code == 200, answer.text
    assert {o["name"] for o in answer.json()["outputs"]} == {"text_output", "scores", "shape", "seen"}



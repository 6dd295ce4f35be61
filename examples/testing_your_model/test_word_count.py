from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import fastoip
from fastoip.testing import InProcessClient

REPOSITORY = Path(__file__).parent / "repository"


@pytest.fixture(scope="module")
def client():
    with InProcessClient(REPOSITORY) as client:  # loads the models, no server, no socket
        yield client


def test_counts_words(client):
    texts = np.array([["hello world"], ["ONE TWO THREE"]], dtype=object)
    outputs = client.infer("word_count", {"TEXT": texts})
    assert outputs["WORDS"].tolist() == [[2], [3]]
    assert outputs["SHOUTING"].tolist() == [[False], [True]]


def test_refuses_empty_text(client):
    with pytest.raises(fastoip.InvalidArgument, match="TEXT must not be empty"):
        client.infer("word_count", {"TEXT": [[" "]]})


def test_over_grpc():
    # the whole server in this process, on free ports, stopped at the end of the block
    with fastoip.Server(REPOSITORY) as server:
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"served in-process"]], dtype=object))
        result = triton.infer("word_count", [text])
        assert result.as_numpy("WORDS").tolist() == [[2]]

"""JSON ``data`` nested any way is read in row-major order and checked by element count only, as Triton does.

Triton's http_server.cc (ReadDataFromJsonHelper) recurses into every array and counts the leaf values against
the shape's element count; the nesting itself is not checked.  So ``[[8 values], [8 values]]`` for shape [1, 16]
is accepted, as are uneven nestings, and a count that does not match is refused with Triton's words.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastoip.errors import InvalidArgument
from fastoip.wire.http import decode_infer_request


def decode(datatype: str, shape: list[int], data: object) -> np.ndarray:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data}]})
    request, _ = decode_infer_request("m", "", body.encode(), None)
    return request.inputs[0].data


@pytest.mark.parametrize("data", [
    list(range(16)),
    [list(range(8)), list(range(8, 16))],               # nested differently from [1, 16]
    [[0, 1, 2], list(range(3, 16))],                    # uneven
    [[[0], [1, 2]], 3, [list(range(4, 16))]],           # mixed depths
])
def test_any_nesting_with_the_right_count_is_read_in_order(data: object) -> None:
    values = decode("INT32", [1, 16], data)
    assert values.shape == (1, 16) and values.dtype == np.int32
    assert values.reshape(-1).tolist() == list(range(16))


def test_bytes_any_nesting() -> None:
    values = decode("BYTES", [1, 4], [["a", "b"], ["c"], "d"])
    assert values.shape == (1, 4)
    assert [bytes(v) for v in values.reshape(-1)] == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize("data", [[list(range(8)), list(range(7))], [[0, 1, 2], list(range(3, 17))]])
def test_a_wrong_count_is_refused_with_tritons_words(data: object) -> None:
    with pytest.raises(InvalidArgument) as raised:
        decode("INT32", [1, 16], data)
    assert str(raised.value).startswith("Unable to parse 'data': Shape does not match true shape of 'data' field")


def test_a_value_of_another_type_in_an_uneven_nesting_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        decode("INT32", [1, 3], [[1, 2], ["x"]])

"""Checks that a server process is still up and answering after an attack."""

from __future__ import annotations

import http.client
import json

import tritonclient.http as th

from serverproc import ServerProcess
from simple_model import simple_inputs


def assert_serving(server: ServerProcess) -> None:
    """The server is up and answers a real inference."""
    assert server.proc is not None and server.proc.poll() is None
    client = th.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_ready()
        assert client.infer("simple", simple_inputs(th)).as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
    finally:
        client.close()


def post_infer(port: int, body: bytes, encoding: str = "gzip") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v2/models/simple/infer", body, {"Content-Encoding": encoding,
                                                                "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def assert_good_infer(port: int) -> None:
    request = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                          {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [3] * 16}]}
    status, answer = post_infer(port, json.dumps(request).encode(), "identity")
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [i + 3 for i in range(16)]

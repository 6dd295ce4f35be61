"""The frontends' timestamps in Triton's trace file: HTTP_RECV_START/END and HTTP_SEND_START/END on HTTP,
GRPC_WAITREAD_START/END and GRPC_SEND_START/END on the native gRPC frontend, in the same trace as the Core's,
ordered as Triton's ``trace_summary.py`` needs them (it computes HTTP_INFER = HTTP_SEND_END - HTTP_RECV_START,
GRPC_INFER = GRPC_SEND_END - GRPC_WAITREAD_END, and the receive/send spans, and refuses an end before a start)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serverproc import ServerProcess

CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
        "REQUEST_END"]


def _inputs(module: object) -> list:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),  # type: ignore[attr-defined]
              module.InferInput("INPUT1", [1, 16], "INT32")]  # type: ignore[attr-defined]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _traces(path: Path) -> dict[int, dict[str, int]]:
    """id -> {timestamp name: ns}, merged over the entries of each id (as trace_summary.py merges them)."""
    merged: dict[int, dict[str, int]] = {}
    for entry in json.loads(path.read_text()):
        for stamp in entry.get("timestamps", []):
            merged.setdefault(entry["id"], {})[stamp["name"]] = stamp["ns"]
    return merged


def test_http_and_grpc_timestamps_in_the_trace(demo_repo: Path, tmp_path: Path, native_frontend: str) -> None:
    path = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"]
    with ServerProcess(demo_repo, *args, http=True, grpc_frontend=native_frontend) as server:
        grpcclient.InferenceServerClient(server.grpc_url).infer("simple", _inputs(grpcclient))
        httpclient.InferenceServerClient(server.http_url).infer("simple", _inputs(httpclient))
        (grpc, http) = [stamps for _, stamps in sorted(_traces(path).items())]
    grpc_names = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    http_names = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert set(grpc) == set(CORE + grpc_names)
    assert set(http) == set(CORE + http_names)
    orders = ((grpc, grpc_names[:2] + CORE + grpc_names[2:]), (http, http_names[:2] + CORE + http_names[2:]))
    for stamps, order in orders:
        times = [stamps[name] for name in order]
        assert times == sorted(times), order


def test_grpc_timestamps_on_every_frontend_and_on_streams(demo_repo: Path, tmp_path: Path, grpc_frontend: str) -> None:
    """ModelInfer and ModelStreamInfer on the native and the grpcio frontend: every traced request carries
    GRPC_WAITREAD_START/END and GRPC_SEND_START/END around the Core's timestamps."""
    import queue

    path = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1"]
    with ServerProcess(demo_repo, *args, grpc_frontend=grpc_frontend) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.infer("simple", _inputs(grpcclient), request_id="unary")
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index in range(3):
            client.async_stream_infer("simple", _inputs(grpcclient), request_id=f"stream-{index}")
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
        client.stop_stream()
        client.close()
    traces = _traces(path)
    assert len(traces) == 4
    grpc_names = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    order = grpc_names[:2] + CORE + grpc_names[2:]
    for stamps in traces.values():
        assert set(stamps) == set(CORE + grpc_names), stamps
        times = [stamps[name] for name in order]
        assert times == sorted(times), (grpc_frontend, stamps)

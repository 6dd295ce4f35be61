"""The probe: each distinct request sent once before the load, its response fully checked.

It proves the requests are valid (a failure here ends the run with the
server's status, before any measurement), learns the response lengths the
load then checks cheaply, captures the response the ceiling server replays,
and with ``--verify`` compares the demo models' outputs with reference values.
A response that does not match the model's metadata fails ``--verify``;
without it the mismatch is a note and the load only checks lengths.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .target import BenchError, Target
from .tls import grpc_channel, ssl_context
from .verify import KNOWN_MODELS, check_shapes, check_values, decode_grpc, decode_http

if TYPE_CHECKING:  # grpc is imported by the gRPC probes only: an HTTP bench does without it
    import grpc


@dataclass
class Probe:
    """What one call per distinct request taught us before the load."""

    lengths: set[int]
    response: bytes  # the first response (gRPC message bytes, or a whole HTTP response)
    notes: list[str]


class _GrpcCaller:
    """Blocking raw-bytes ModelInfer calls on one channel."""

    def __init__(self, target: Target, timeout: float) -> None:
        import grpc

        from .load import INFER_METHOD, channel_options

        self._grpc = grpc
        self.timeout = timeout
        self.channel = grpc_channel(target.address, channel_options(0), target.tls)
        self.call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            INFER_METHOD, request_serializer=None, response_deserializer=None
        )

    def __call__(self, request: bytes) -> bytes:
        try:
            return self.call(request, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            code = exc.code().name if exc.code() else "UNKNOWN"
            raise BenchError(f"probe request failed: {code}: {exc.details()}", stage="probe", status=code) from None

    def close(self) -> None:
        self.channel.close()


def _grpc_stream_probe(target: Target, request: bytes, timeout: float) -> bytes:
    import grpc

    from .load import STREAM_METHOD, channel_options
    from .verify import decode_stream_frame

    channel = grpc_channel(target.address, channel_options(0), target.tls)
    try:
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            STREAM_METHOD, request_serializer=None, response_deserializer=None
        )
        responses = call(iter([request]), timeout=timeout)
        try:
            frame = next(responses)
        except grpc.RpcError as exc:
            code = exc.code().name if exc.code() else "UNKNOWN"
            if code == "UNIMPLEMENTED":
                raise BenchError(
                    f"--streaming: the server does not implement ModelStreamInfer ({code}: {exc.details()})",
                    stage="probe",
                    status=code,
                ) from None
            raise BenchError(f"--streaming probe failed: {code}: {exc.details()}", stage="probe", status=code) from None
        except StopIteration:
            raise BenchError("--streaming: the server closed the stream without a response", stage="probe") from None
        responses.cancel()
        message, inner = decode_stream_frame(frame)
        if message or inner is None:
            raise BenchError(f"--streaming probe: the server answered with an error: {message!r}", stage="probe")
        return frame
    finally:
        channel.close()


def _http_probe(target: Target, request: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
    try:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
        if target.tls is not None:
            sock = ssl_context(target.tls).wrap_socket(sock, server_hostname=target.host)
    except ssl.SSLError as exc:
        raise BenchError(
            f"probe request failed: TLS with {target.address}: {exc}", stage="probe", status="TLS_ERROR"
        ) from None
    except OSError as exc:
        raise BenchError(
            f"probe request failed: cannot connect to {target.address}: {exc}",
            stage="probe",
            status="CONNECTION_REFUSED",
        ) from None
    try:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        sock.close()


def probe(
    target: Target,
    plan: Any,
    requests: list[bytes],
    tensors: list[dict],
    *,
    verify: bool = False,
    streaming: bool = False,
    timeout: float = 30.0,
    regions: Any = None,
) -> Probe:
    """Send each distinct request once, one at a time; check shapes (and values with --verify).

    With shared memory (``regions``) the outputs written into the region are
    read back after each call, for the checks.
    """
    notes: list[str] = []
    lengths: set[int] = set()
    first = b""
    elsewhere = frozenset(regions.shm_outputs) if regions is not None else frozenset()
    if target.protocol == "grpc":
        caller = _GrpcCaller(target, timeout)
        try:
            for index, request in enumerate(requests):
                response = caller(request)
                try:
                    outputs = decode_grpc(response, elsewhere)
                except Exception as exc:  # noqa: BLE001 - CodecError or protobuf DecodeError
                    raise BenchError(f"probe: the response does not decode: {exc}", stage="probe") from None
                if regions is not None:  # read the outputs before the next call overwrites them
                    regions.fill_outputs(outputs)
                _judge(verify, plan, outputs, tensors[index], notes, elsewhere)
                lengths.add(len(response))
                first = first or response
        finally:
            caller.close()
        if streaming:
            frame = _grpc_stream_probe(target, requests[0], timeout)
            lengths = {len(frame)}
            # The load checks whole stream frames; lengths of every distinct request are learnt on the fly.
    else:
        for index, request in enumerate(requests):
            status, headers, body = _http_probe(target, request, timeout)
            if status != 200:
                raise BenchError(
                    f"probe request failed: HTTP {status}: {body[:300].decode('latin-1')}",
                    stage="probe",
                    status=str(status),
                )
            header_length = headers.get("inference-header-content-length")
            try:
                outputs = decode_http(body, int(header_length) if header_length else None)
            except Exception as exc:  # noqa: BLE001
                raise BenchError(f"probe: the response does not decode: {exc}", stage="probe") from None
            if regions is not None:
                regions.fill_outputs(outputs)
            _judge(verify, plan, outputs, tensors[index], notes, elsewhere)
            lengths.add(len(body))
            if not first:
                head = ["HTTP/1.1 200 OK", f"Content-Type: {headers.get('content-type', 'application/json')}"]
                if header_length:
                    head.append(f"Inference-Header-Content-Length: {header_length}")
                head.append(f"Content-Length: {len(body)}")
                first = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    return Probe(lengths, first, sorted(set(notes)))


def _judge(verify: bool, plan: Any, outputs: list, tensors: dict, notes: list[str], elsewhere: frozenset) -> None:
    problems = check_shapes(plan.outputs, outputs, elsewhere)
    if problems:
        message = f"model '{plan.model}': response does not match the metadata: " + "; ".join(problems)
        if verify:
            raise BenchError(f"--verify: {message}", stage="verify")
        notes.append(message + " (load continues: only lengths are checked)")
        plan.outputs = []
    if verify:
        value_problems = check_values(plan.model, tensors, outputs)
        if value_problems is None:
            notes.append(
                f"--verify: no reference for model '{plan.model}' (known: {', '.join(KNOWN_MODELS)}); shapes checked"
            )
        elif value_problems:
            raise BenchError(f"--verify: model '{plan.model}': " + "; ".join(value_problems), stage="verify")
        else:
            notes.append(f"--verify: model '{plan.model}' outputs match the reference")

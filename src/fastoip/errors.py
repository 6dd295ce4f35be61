"""One error family for the whole server.

Every failure the server reports to a client is an :class:`InferenceError`
subclass.  Each class knows its gRPC status name and its HTTP status, following
Triton's mapping (``GrpcStatusUtil::CodeToStatus`` and ``HttpCodeFromError``):
frontends never decide a status themselves, they read it from the error.
"""

from __future__ import annotations


class InferenceError(Exception):
    """Base of every error that is reported to a client."""

    grpc_code: str = "UNKNOWN"
    http_status: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(InferenceError):
    """The request is malformed or does not match the model (INVALID_ARGUMENT / 400)."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class CodecError(InvalidArgument):
    """Wire bytes that do not parse: truncated, out of bounds, inconsistent sizes."""


class NotFound(InferenceError):
    """Unknown model, version or shared-memory region (NOT_FOUND / 404)."""

    grpc_code = "NOT_FOUND"
    http_status = 404


class Unavailable(InferenceError):
    """Not ready, queue full, queue timeout, shutting down (UNAVAILABLE / 503)."""

    grpc_code = "UNAVAILABLE"
    http_status = 503


class ResourceExhausted(InferenceError):
    """A bound of the server is reached: RESOURCE_EXHAUSTED on gRPC, as grpc's own limits answer (issue 37: one
    class for every bound, so frontends and clients see one status; the HTTP status says who may act):

    - 429 (the default): this caller's own share is used up (its shared-memory registrations); it gives some back.
    - 503 with ``Retry-After`` (``retry_after`` given): a queue or memory budget the server shares is full for now
      (the JSON and inflation pools, /dev/shm); the same request may pass in a moment.
    - ``http_status`` given: a bound on one request's own size (a model's output over --onnx-max-tensor-bytes: 500,
      as the model, not the client, made it).
    """

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429
    #: Seconds the HTTP answer's Retry-After asks the client to wait (None: no header).
    retry_after: int | None = None

    def __init__(self, message: str, retry_after: int | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        if retry_after is not None:
            self.retry_after = retry_after
            self.http_status = 503
        if http_status is not None:
            self.http_status = http_status


class Unsupported(InferenceError):
    """A feature this server does not implement (UNIMPLEMENTED / 501)."""

    grpc_code = "UNIMPLEMENTED"
    http_status = 501


class AlreadyExists(InferenceError):
    """A shared-memory region or similar name is already taken (ALREADY_EXISTS / 400)."""

    grpc_code = "ALREADY_EXISTS"
    http_status = 400


class Cancelled(InferenceError):
    """The client went away or cancelled before the request ran (CANCELLED / 400)."""

    grpc_code = "CANCELLED"
    http_status = 400


class DeadlineExceeded(InferenceError):
    """The client's deadline passed before the request ran."""

    grpc_code = "DEADLINE_EXCEEDED"
    http_status = 504


class InternalError(InferenceError):
    """A bug or a backend failure (INTERNAL / 500)."""

    grpc_code = "INTERNAL"
    http_status = 500


class UnknownError(InferenceError):
    """An error whose kind its source did not know: a model's ``TritonError.UNKNOWN`` (UNKNOWN / 500, as Triton)."""

    grpc_code = "UNKNOWN"
    http_status = 500


class OneResponseCall(Unsupported):
    """A call that takes exactly one response (ModelInfer, HTTP infer) made to a decoupled model.

    Worded per protocol as Triton words it; the frontend picks the wording.
    """

    GRPC = "ModelInfer RPC doesn't support models with decoupled transaction policy"
    HTTP = "HTTP end point doesn't support models with decoupled transaction policy"

    def __init__(self, message: str = GRPC) -> None:
        super().__init__(message)

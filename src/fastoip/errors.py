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
    """A bounded resource is full for this caller: too many shared-memory registrations, no room in /dev/shm
    for a Python model's tensors (RESOURCE_EXHAUSTED / 429); the next try may succeed once some is given back."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429


class ServerBusy(InferenceError):
    """A bounded queue or memory budget of the server is full: try again shortly (RESOURCE_EXHAUSTED / 503 with
    Retry-After; issue 37: a bound answers at once instead of making the request wait)."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 503
    #: Seconds the HTTP answer's Retry-After asks the client to wait.
    retry_after = 1


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

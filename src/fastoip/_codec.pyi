"""Type stubs for the native KServe V2 / Triton gRPC codec (``fastoip/_codec.pyx``)."""


import numpy as np

from .types import InferOutput, InferRequest, InferResponse

_Buffer = bytes | bytearray | memoryview

#: True when the decoder fills the slots of fastoip.types objects in place.
FAST_SLOTS: bool

def decode_infer_request(data: _Buffer) -> InferRequest:
    """Parse ModelInferRequest wire bytes; raw inputs are read-only zero-copy views on ``data``."""

def decode_infer_response(data: _Buffer) -> InferResponse:
    """Parse ModelInferResponse wire bytes; raw outputs are read-only zero-copy views on ``data``."""

def encode_infer_response(response: InferResponse) -> bytes:
    """Serialize an InferResponse as ModelInferResponse bytes, all data in raw_output_contents."""

def encode_infer_response_parts(response: InferResponse, min_ref: int = 65536) -> list[bytes | memoryview]:
    """The response's message as parts; outputs of at least ``min_ref`` bytes are views of their arrays."""

def pack_inline(array: object, limit: int) -> tuple | None: ...
def unpack_inline(packed: tuple) -> np.ndarray: ...
def split_rows(array: np.ndarray, counts: list[int]) -> list[np.ndarray] | None:
    """Views of ``array``'s consecutive row ranges, ``counts[i]`` rows each (None: not a C-contiguous ndarray
    of one dimension or more; slice it)."""
def gather_rows(parts: list[np.ndarray], out: np.ndarray) -> bool:
    """``np.concatenate(parts, axis=0, out=out)`` by a memcpy a part; False (out not written) where it cannot."""

def new_output(name: str, datatype: str, data: np.ndarray) -> InferOutput:
    """``InferOutput(name, datatype, data.shape, data)``, built as the decoder builds it."""

def new_response(model_name: str, model_version: str, request_id: str, outputs: list[InferOutput]) -> InferResponse:
    """``InferResponse(model_name, model_version, request_id, None, outputs)``, built as the decoder builds it."""

def request_without_data(request: InferRequest) -> InferRequest:
    """A copy of ``request`` whose inputs keep name, datatype, shape and parameters but no data."""

def encode_infer_request(request: InferRequest) -> bytes:
    """Serialize an InferRequest as ModelInferRequest bytes, data in raw_input_contents."""

def encode_stream_response(
    response: InferResponse | None = None, error_message: str = ""
) -> bytes:
    """Serialize a ModelStreamInferResponse (error_message=1, infer_response=2)."""

def serialize_bytes_tensor(array: np.ndarray | list[object]) -> bytes:
    """BYTES framing: per element a uint32 little-endian length, then the element's bytes."""

def deserialize_bytes_tensor(buffer: _Buffer, count: int) -> np.ndarray:
    """Decode exactly ``count`` length-prefixed elements filling ``buffer`` into an object array."""

DEFAULT_MAX_BYTES_ELEMENTS: int

def set_max_bytes_elements(limit: int) -> None: ...
def max_bytes_elements() -> int: ...
def set_max_bytes_memory(limit: int) -> None: ...
def max_bytes_memory() -> int: ...

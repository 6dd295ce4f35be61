# Wire types and field numbers, named after proto/grpc_service.proto (package ``inference``), one enum per
# message.  Cython puts the members of every C enum in one module namespace, so each member carries its
# message as a prefix (``ModelInferRequestField.REQUEST_INPUTS``); the bare member names are used below.

cdef enum WireType:
    WT_VARINT = 0
    WT_I64 = 1          # fixed64, double
    WT_LEN = 2          # length-delimited: strings, bytes, sub-messages, packed repeated scalars
    WT_I32 = 5          # fixed32, float

cdef enum ModelInferRequestField:
    REQUEST_MODEL_NAME = 1
    REQUEST_MODEL_VERSION = 2
    REQUEST_ID = 3
    REQUEST_PARAMETERS = 4
    REQUEST_INPUTS = 5
    REQUEST_OUTPUTS = 6             # InferRequestedOutputTensor
    REQUEST_RAW_INPUT_CONTENTS = 7

cdef enum ModelInferResponseField:
    # 1-5 are ModelInferRequest's numbers: one loop reads the header fields of both messages.
    RESPONSE_MODEL_NAME = 1
    RESPONSE_MODEL_VERSION = 2
    RESPONSE_ID = 3
    RESPONSE_PARAMETERS = 4
    RESPONSE_OUTPUTS = 5            # InferOutputTensor
    RESPONSE_RAW_OUTPUT_CONTENTS = 6

cdef enum ModelStreamInferResponseField:
    STREAM_ERROR_MESSAGE = 1
    STREAM_INFER_RESPONSE = 2

cdef enum InferTensorField:
    # ModelInferRequest.InferInputTensor and ModelInferResponse.InferOutputTensor share these numbers.
    TENSOR_NAME = 1
    TENSOR_DATATYPE = 2
    TENSOR_SHAPE = 3                # repeated int64: packed or not
    TENSOR_PARAMETERS = 4
    TENSOR_CONTENTS = 5             # InferTensorContents

cdef enum InferRequestedOutputTensorField:
    REQUESTED_NAME = 1
    REQUESTED_PARAMETERS = 2

cdef enum ParameterEntryField:
    # One entry of map<string, InferParameter>, which protobuf writes as a message {key = 1; value = 2}.
    ENTRY_KEY = 1
    ENTRY_VALUE = 2

cdef enum InferParameterField:
    # oneof parameter_choice
    PARAM_BOOL = 1
    PARAM_INT64 = 2
    PARAM_STRING = 3
    PARAM_DOUBLE = 4
    PARAM_UINT64 = 5

cdef enum InferTensorContentsField:
    # The numbers also index per-field arrays (counts[CONTENTS_FIELD_END], _FIELD_NAMES): 0 is "no field".
    CONTENTS_BOOL = 1
    CONTENTS_INT = 2                # int32: INT8, INT16, INT32
    CONTENTS_INT64 = 3
    CONTENTS_UINT = 4               # uint32: UINT8, UINT16, UINT32
    CONTENTS_UINT64 = 5
    CONTENTS_FP32 = 6
    CONTENTS_FP64 = 7
    CONTENTS_BYTES = 8
    CONTENTS_FIELD_END = 9          # one past the last field number


cdef inline uchar _len_tag(int field) noexcept nogil:
    """The one-byte tag of a length-delimited field numbered below 16 (a constant once inlined)."""
    return <uchar>((field << 3) | WT_LEN)

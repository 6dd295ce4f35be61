"""The REST API's OpenAPI 3.1 document, made from the router's own route table (served at ``/v2/docs``).

Rules:
- Paths and methods come from :meth:`Router.routes`: every route the router serves is in the document, and the
  document names no path it does not serve.  What each handler takes and answers is :data:`OPERATIONS`, keyed by
  the handler's name; a handler without an entry makes :func:`openapi_document` raise (the test that builds the
  document fails), so a route cannot be added undocumented.
- The answers the Core types (``core/answers.py``) are described from their dataclasses, field by field, so the
  document says what orjson writes; the JSON forms the wire codec reads and writes (inference bodies) and the
  small request documents are :data:`SCHEMAS`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from ... import __version__
from ...core import answers
from .router import Router

OPENAPI_VERSION = "3.1.0"

ANY_PARAMETER: dict[str, Any] = {"type": ["string", "number", "integer", "boolean"]}
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "description": "Named parameters (string, number or boolean values)",
    "additionalProperties": ANY_PARAMETER,
}
SHAPE: dict[str, Any] = {"type": "array", "items": {"type": "integer"}}
TENSOR_DATA: dict[str, Any] = {
    "type": "array",
    "description": "The tensor's elements, row-major, flat or nested: numbers, booleans (BOOL) or strings (BYTES). "
    "Absent when the tensor travels as binary data after the JSON header or in shared memory.",
}


def _tensor(parameters: str) -> dict[str, Any]:
    """A tensor in JSON (a request's input, a response's output): the V2 spec's shape for both."""
    return {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": SHAPE,
            "datatype": {"type": "string", "description": "A V2 datatype: BOOL, UINT8 .. FP64, BYTES, BF16"},
            "parameters": {"$ref": "#/components/schemas/Parameters", "description": parameters},
            "data": TENSOR_DATA,
        },
    }


def _openai(description: str, required: list[str], **properties: Any) -> dict[str, Any]:
    """An OpenAI body: its required members typed, the rest as OpenAI's API reference describes them."""
    return {"type": "object", "description": description + " (OpenAI's API reference has every member)",
            "required": required, "properties": properties}


_OPENAI_MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
                 "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                                "created": {"type": "integer"}, "owned_by": {"type": "string"}}}
_OPENAI_USAGE = {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                  "completion_tokens": {"type": "integer"},
                                                  "total_tokens": {"type": "integer"}}}

#: OpenAI's bodies (server/http/openai/, wire/openai/).
OPENAI_SCHEMAS: dict[str, dict[str, Any]] = {
    "OpenAIModel": _OPENAI_MODEL,
    "OpenAIModelList": _openai("The ready models", ["object", "data"], object={"const": "list"},
                               data={"type": "array", "items": _OPENAI_MODEL}),
    "OpenAIUnloaded": _openai("An unloaded model", ["status", "model"], status={"const": "success"},
                              model={"type": "string"}),
    "V1AndOpenAIModels": _openai("KServe V1's list and OpenAI's", ["models", "object", "data"],
                                 models={"type": "array", "items": {"type": "string"}}, object={"const": "list"},
                                 data={"type": "array", "items": _OPENAI_MODEL}),
    "V1AndOpenAIModel": _openai("KServe V1's readiness and OpenAI's model", ["name", "ready", "id"],
                                name={"type": "string"}, ready={"type": "boolean"}, id={"type": "string"}),
    "OpenAIEmbeddingRequest": _openai(
        "Texts or token ids to embed", ["model", "input"], model={"type": "string"},
        input={"description": "A string, a list of strings, a list of token ids or a list of token-id lists"},
        encoding_format={"enum": ["float", "base64"]}, dimensions={"type": "integer", "minimum": 1},
    ),
    "OpenAIEmbeddings": _openai("One vector per input, in order", ["object", "data", "model", "usage"],
                                object={"const": "list"}, data={"type": "array"}, model={"type": "string"},
                                usage=_OPENAI_USAGE),
    "OpenAICompletionRequest": _openai(
        "A prompt to complete", ["model", "prompt"], model={"type": "string"},
        prompt={"description": "A string or a list of strings"}, stream={"type": "boolean"},
        max_tokens={"type": "integer", "minimum": 1}, stop={"description": "A string or up to 4 strings"},
        n={"type": "integer", "minimum": 1, "maximum": 128}, seed={"type": "integer"}, echo={"type": "boolean"},
        logprobs={"type": "integer", "minimum": 0, "maximum": 5},
    ),
    "OpenAICompletion": _openai("The completion's choices and usage", ["id", "object", "choices", "usage"],
                                object={"const": "text_completion"}, choices={"type": "array"},
                                usage=_OPENAI_USAGE),
    "OpenAIChatRequest": _openai(
        "Messages to answer", ["model", "messages"], model={"type": "string"}, messages={"type": "array"},
        stream={"type": "boolean"}, stream_options={"type": "object"},
        max_completion_tokens={"type": "integer", "minimum": 1}, tools={"type": "array"}, tool_choice={},
    ),
    "OpenAIChatCompletion": _openai("The answer's choices and usage", ["id", "object", "choices", "usage"],
                                    object={"const": "chat.completion"}, choices={"type": "array"},
                                    usage=_OPENAI_USAGE),
}

#: The JSON documents that are not Core answers: inference bodies (``wire/http.py``) and small request bodies.
SCHEMAS: dict[str, dict[str, Any]] = {
    "ErrorResponse": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "description": "What went wrong, naming what was expected"}},
    },
    "Parameters": PARAMETERS,
    "RequestInput": _tensor(
        "binary_data_size (Triton's binary tensor extension); shared_memory_region, shared_memory_byte_size, "
        "shared_memory_offset; content_type"
    ),
    "RequestOutput": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "parameters": {
                "$ref": "#/components/schemas/Parameters",
                "description": "binary_data (bool), classification (top N classes), shared_memory_region, "
                "shared_memory_byte_size, shared_memory_offset",
            },
        },
    },
    "InferenceRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {
                "$ref": "#/components/schemas/Parameters",
                "description": "binary_data_output, sequence_id, sequence_start, sequence_end, priority, timeout, "
                "content_type",
            },
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/RequestInput"}},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/RequestOutput"}},
        },
    },
    "ResponseOutput": _tensor("binary_data_size (the tensor follows the JSON as binary data); content_type"),
    "InferenceResponse": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/Parameters"},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/ResponseOutput"}},
        },
    },
    "GenerateRequest": {
        "type": "object",
        "description": "Triton's generate extension: each input by name (a value, or a list of values), and "
        "optional parameters",
        "properties": {"id": {"type": "string"}, "parameters": {"$ref": "#/components/schemas/Parameters"}},
        "additionalProperties": True,
    },
    "GenerateResponse": {
        "type": "object",
        "description": "Triton's generate extension: model_name, model_version and each output by name",
        "properties": {"model_name": {"type": "string"}, "model_version": {"type": "string"},
                       "id": {"type": "string"}},
        "additionalProperties": True,
    },
    "ServerLive": {"type": "object", "description": "KServe's liveness body",
                   "properties": {"live": {"type": "boolean"}}, "required": ["live"]},
    "ServerReady": {"type": "object", "description": "KServe's readiness body",
                    "properties": {"ready": {"type": "boolean"}}, "required": ["ready"]},
    "V1Status": {"type": "object", "description": "KServe V1 liveness", "properties": {"status": {"type": "string"}}},
    "V1Models": {"type": "object", "description": "KServe V1: the model names",
                 "properties": {"models": {"type": "array", "items": {"type": "string"}}}},
    "V1ModelReady": {"type": "object", "description": "KServe V1: a ready model (503 when not ready)",
                     "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}},
    "V1PredictRequest": {
        "type": "object",
        "description": "KServe V1: 'instances' (rows: values of the one input, or one object per row naming "
        "each input) or 'inputs' (the same, or an object of input name -> rows)",
        "properties": {"instances": {"type": "array"}, "inputs": {"type": ["array", "object"]}},
    },
    "V1PredictResponse": {
        "type": "object",
        "description": "KServe V1: the rows of the one output, or one object per row naming each output",
        "properties": {"predictions": {}},
        "required": ["predictions"],
    },
    "ModelConfig": {
        "type": "object",
        "description": "Triton's model configuration (model_config.proto) in its JSON form",
        "additionalProperties": True,
    },
    "ModelStatisticsResponse": {
        "type": "object",
        "required": ["model_stats"],
        "properties": {"model_stats": {"type": "array", "items": {"$ref": "#/components/schemas/ModelStatistics"}}},
    },
    "RepositoryIndexRequest": {
        "type": "object",
        "properties": {"ready": {"type": "boolean", "description": "Only the models that are ready"}},
    },
    "RepositoryIndexResponse": {"type": "array", "items": {"$ref": "#/components/schemas/RepositoryIndexEntry"}},
    "ModelLoadRequest": {
        "type": "object",
        "properties": {
            "parameters": {
                "type": "object",
                "description": "config: a model configuration as JSON, overriding config.pbtxt; "
                "file:<path>: a model file's bytes, base64-encoded (needs config)",
                "additionalProperties": True,
            }
        },
    },
    "ModelUnloadRequest": {
        "type": "object",
        "properties": {"parameters": {"type": "object", "additionalProperties": True}},
    },
    "SystemSharedMemoryRegisterRequest": {
        "type": "object",
        "required": ["key", "byte_size"],
        "properties": {
            "key": {"type": "string", "description": "The shared-memory object's name in /dev/shm"},
            "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1},
        },
    },
    "CudaSharedMemoryRegisterRequest": {
        "type": "object",
        "required": ["raw_handle", "byte_size"],
        "properties": {
            "raw_handle": {
                "type": "object",
                "required": ["b64"],
                "properties": {"b64": {"type": "string", "description": "base64 of a cudaIpcMemHandle_t"}},
            },
            "device_id": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1},
        },
    },
    "SystemSharedMemoryStatusResponse": {
        "type": "array",
        "items": {"$ref": "#/components/schemas/SystemRegionStatus"},
    },
    "CudaSharedMemoryStatusResponse": {"type": "array", "items": {"$ref": "#/components/schemas/CudaRegionStatus"}},
    "TraceSettings": {
        "type": "object",
        "description": "Triton's trace settings: trace_level a list, every other setting one string",
        "additionalProperties": {"type": ["string", "array"], "items": {"type": "string"}},
    },
    "TraceSettingsUpdate": {
        "type": "object",
        "description": "Settings to change: a string, a list of strings, or null to clear (back to the global one)",
        "additionalProperties": {"type": ["string", "array", "null"], "items": {"type": "string"}},
    },
    "LogSettings": {
        "type": "object",
        "description": "Triton's log settings (log_file, log_info, log_warning, log_error, log_verbose_level, "
        "log_format); null leaves a setting as it is",
        "additionalProperties": {"type": ["string", "integer", "boolean", "null"]},
    },
    "OpenApiDocument": {"type": "object", "description": "This document", "additionalProperties": True},
}

#: Core answers written as they are (orjson writes the dataclasses); their schemas come from their fields.
ANSWERS: tuple[type, ...] = (
    answers.ServerMetadata,
    answers.ModelMetadata,
    answers.ModelStatistics,
    answers.RepositoryIndexEntry,
    answers.SystemRegionStatus,
    answers.CudaRegionStatus,
)


@dataclass(frozen=True)
class Operation:
    """What one handler does: its summary and tag, and the schemas of what it takes and answers (None: empty)."""

    summary: str
    tag: str
    request: str | None = None
    response: str | None = None
    #: The answer's media type when it is not JSON.
    response_type: str = "application/json"
    description: str = ""


HEALTH, METADATA, INFERENCE, STATISTICS, REPOSITORY = "health", "metadata", "inference", "statistics", "repository"
SHARED_MEMORY, SETTINGS, DOCS = "shared memory", "trace and log settings", "documentation"
OPENAI = "openai"

#: Keyed by the handler's name (``HttpFrontend`` method): every routed handler needs an entry.
OPERATIONS: dict[str, Operation] = {
    "server_live": Operation("Server liveness: 200 when live", HEALTH, response="ServerLive"),
    "server_ready": Operation(
        "Server readiness: 200 when ready, 400 with the reason otherwise", HEALTH, response="ServerReady",
        description="Not ready while a model is not (with --strict-readiness) and from the start of a shutdown.",
    ),
    "model_ready": Operation("Model readiness: 200 when ready, 400 with the reason otherwise", HEALTH),
    "server_metadata": Operation("Server metadata: name, version, extensions", METADATA, response="ServerMetadata"),
    "model_metadata": Operation("Model metadata: versions, platform, inputs and outputs", METADATA,
                                response="ModelMetadata"),
    "model_config": Operation("The model's configuration, after auto-complete", METADATA, response="ModelConfig"),
    "infer": Operation(
        "Run an inference", INFERENCE, request="InferenceRequest", response="InferenceResponse",
        description="A JSON body, or Triton's binary tensor extension: the JSON header, then the tensors' bytes, "
        "with the header's length in Inference-Header-Content-Length (the answer says the same when any output "
        "is binary). Request bodies may be gzip- or deflate-encoded (Content-Encoding); Accept-Encoding asks "
        "the same of the answer.",
    ),
    # Triton's generate extension (server/http/generate.py, when that frontend module is present)
    "generate": Operation(
        "Run a model on a plain JSON object (Triton's generate extension); exactly one response",
        INFERENCE, request="GenerateRequest", response="GenerateResponse",
    ),
    "generate_stream": Operation(
        "Run a model and stream each response as a Server-Sent Event (Triton's generate extension)",
        INFERENCE, request="GenerateRequest", response_type="text/event-stream",
        description="Each event is 'data: ' and a GenerateResponse object; an error after the first response is "
        'an {"error": ...} event.',
    ),
    "model_stats": Operation("Statistics of a model (all its versions, or one)", STATISTICS,
                             response="ModelStatisticsResponse"),
    "all_model_stats": Operation("Statistics of every model", STATISTICS, response="ModelStatisticsResponse"),
    "repository_index": Operation("The models of the repository and their state", REPOSITORY,
                                  request="RepositoryIndexRequest", response="RepositoryIndexResponse"),
    "load_model": Operation(
        "Load or reload a model (explicit model control mode)", REPOSITORY, request="ModelLoadRequest",
        description="The old versions serve until the new ones are ready. Python code is loaded through this "
        "endpoint only with --model-control-allow-code.",
    ),
    "unload_model": Operation("Unload a model (explicit model control mode)", REPOSITORY,
                              request="ModelUnloadRequest"),
    "system_shared_memory_status": Operation("Registered system shared-memory regions (all, or one)",
                                             SHARED_MEMORY, response="SystemSharedMemoryStatusResponse"),
    "register_system_shared_memory": Operation("Register a system shared-memory region (needs a region name)",
                                               SHARED_MEMORY, request="SystemSharedMemoryRegisterRequest"),
    "unregister_system_shared_memory": Operation("Unregister a system shared-memory region (all, or one)",
                                                 SHARED_MEMORY),
    "cuda_shared_memory_status": Operation("Registered CUDA shared-memory regions (all, or one)", SHARED_MEMORY,
                                           response="CudaSharedMemoryStatusResponse"),
    "register_cuda_shared_memory": Operation(
        "Register a CUDA shared-memory region (needs a region name; 503 without a GPU)", SHARED_MEMORY,
        request="CudaSharedMemoryRegisterRequest",
    ),
    "unregister_cuda_shared_memory": Operation("Unregister a CUDA shared-memory region (all, or one)",
                                               SHARED_MEMORY),
    "get_trace_settings": Operation("Trace settings (global, or a model's)", SETTINGS, response="TraceSettings"),
    "update_trace_settings": Operation("Change trace settings (global, or a model's)", SETTINGS,
                                       request="TraceSettingsUpdate", response="TraceSettings"),
    "get_log_settings": Operation("Log settings", SETTINGS, response="LogSettings"),
    "update_log_settings": Operation("Change log settings", SETTINGS, request="LogSettings", response="LogSettings"),
    # KServe's V1 protocol (server/http/v1.py)
    "v1_root": Operation("KServe V1 liveness", HEALTH, response="V1Status"),
    "v1_models": Operation("KServe V1: the models of the repository", METADATA, response="V1Models"),
    "v1_model_ready": Operation("KServe V1 model readiness: 200 when ready, 503 when not, 404 unknown", HEALTH,
                                response="V1ModelReady"),
    "v1_predict": Operation("KServe V1 predict, run as a V2 inference", INFERENCE, request="V1PredictRequest",
                            response="V1PredictResponse"),
    "v1_explain": Operation(
        "KServe V1 explain: fastoip hosts no explainers; 501 as KServe answers for a model without one", INFERENCE,
        request="V1PredictRequest", response="ErrorResponse",
    ),
    # OpenAI's API (server/http/openai/): OpenAI's error body, {"error": {"message", "type", "param", "code"}}
    "v1_and_openai_models": Operation(
        "KServe V1's model list and OpenAI's in one body", METADATA, response="V1AndOpenAIModels",
        description="KServe's 'models' (every known model) beside OpenAI's 'object' and 'data' (the ready ones).",
    ),
    "v1_and_openai_model": Operation(
        "KServe V1 model readiness and OpenAI's model in one body: 200 when ready, 503 when not, 404 unknown",
        HEALTH, response="V1AndOpenAIModel",
    ),
    "openai_list_models": Operation("OpenAI: the ready models", OPENAI, response="OpenAIModelList"),
    "openai_retrieve_model": Operation("OpenAI: one model (404 unless it is ready)", OPENAI, response="OpenAIModel"),
    "openai_load_model": Operation(
        "OpenAI (Triton's frontend): load a model (explicit model control mode; 400 when it is loaded)", OPENAI,
        response="OpenAIModel",
    ),
    "openai_unload_model": Operation(
        "OpenAI (Triton's frontend): unload a model (explicit model control mode; 400 when it is not loaded)",
        OPENAI, response="OpenAIUnloaded",
    ),
    "openai_embeddings": Operation(
        "OpenAI: embeddings of texts or token ids", OPENAI, request="OpenAIEmbeddingRequest",
        response="OpenAIEmbeddings",
        description="Served by a model from BYTES text to FP32 [n, d], or an ONNX encoder whose config declares "
        "its tokenizer and pooling; each request's texts go through the dynamic batcher.",
    ),
    "openai_completions": Operation(
        "OpenAI: text completion (stream: Server-Sent Events)", OPENAI, request="OpenAICompletionRequest",
        response="OpenAICompletion",
        description="Served by a model with Triton's LLM tensors (text_input -> text_output). With stream: true "
        "the answer is text/event-stream: 'data: {chunk}' events, then 'data: [DONE]'.",
    ),
    "openai_chat_completions": Operation(
        "OpenAI: chat completion (stream: Server-Sent Events)", OPENAI, request="OpenAIChatRequest",
        response="OpenAIChatCompletion",
        description="The messages go through the model's chat template; tool calls come from its tool-call "
        "parser. With stream: true the answer is text/event-stream: 'data: {chunk}' events, then 'data: [DONE]'.",
    ),
    "openapi_document": Operation("This OpenAPI document", DOCS, response="OpenApiDocument"),
    "docs_page": Operation(
        "A Swagger UI page on this document", DOCS, response_type="text/html",
        description="Swagger UI 5's script and style come from this server (npm's swagger-ui-dist, carried by "
        "the wheel): the page works without network access.",
    ),
    "docs_script": Operation("Swagger UI's script, for the docs page", DOCS, response_type="application/javascript"),
    "docs_style": Operation("Swagger UI's style sheet, for the docs page", DOCS, response_type="text/css"),
}

PATH_PARAMETERS: dict[str, str] = {
    "model_name": "The model's name",
    "model_version": "A version of the model (without it: the one the version policy serves, the latest)",
    "region_name": "The shared-memory region's name",
}

INFER_HEADERS: list[dict[str, Any]] = [
    {"name": "Inference-Header-Content-Length", "in": "header", "required": False,
     "description": "Binary tensor extension: the length of the JSON header at the start of the body",
     "schema": {"type": "integer", "minimum": 0}},
    {"name": "Content-Encoding", "in": "header", "required": False,
     "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]}},
]


def openapi_document(router: Router) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route ``router`` serves; ValueError names a handler without an entry."""
    schemas: dict[str, Any] = {}
    for answer in ANSWERS:
        _add_dataclass_schema(answer, schemas)
    schemas.update(SCHEMAS)
    schemas.update(OPENAI_SCHEMAS)
    paths: dict[str, dict[str, Any]] = {}
    operation_ids: set[str] = set()
    undocumented = []
    for route in router.routes():
        name = getattr(route.handler, "__name__", repr(route.handler))
        operation = OPERATIONS.get(name)
        if operation is None:
            undocumented.append(f"{route.method} {route.path} ({name})")
            continue
        entry = _operation(route.path, name, operation, operation_ids)
        paths.setdefault(route.path, {})[route.method.lower()] = entry
    if undocumented:
        raise ValueError(
            "routes without an OpenAPI description (add the handler to OPERATIONS in server/http/openapi.py): "
            + ", ".join(undocumented)
        )
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "fastoip REST API",
            "version": __version__,
            "description": "The KServe V2 Open Inference Protocol over HTTP/REST, with Triton's extensions "
            "(binary tensors, repository, shared memory, statistics, trace and log settings). Errors answer "
            '{"error": "..."} with Triton\'s status codes; OpenAI\'s routes answer OpenAI\'s error body.',
        },
        "tags": [{"name": tag} for tag in
                 (HEALTH, METADATA, INFERENCE, STATISTICS, REPOSITORY, SHARED_MEMORY, SETTINGS, DOCS, OPENAI)],
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": schemas},
    }


def _operation(path: str, name: str, operation: Operation, taken: set[str]) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": param, "in": "path", "required": True, "description": PATH_PARAMETERS[param],
         "schema": {"type": "string"}}
        for param in re.findall(r"{(\w+)}", path)
    ]
    operation_id = name
    if operation_id in taken:  # one handler behind several paths: the path's parameters tell them apart
        operation_id = "_".join([name, "by", *(p["name"] for p in parameters)])
    taken.add(operation_id)
    entry: dict[str, Any] = {"operationId": operation_id, "summary": operation.summary, "tags": [operation.tag]}
    if operation.description:
        entry["description"] = operation.description
    if name == "infer":
        parameters += INFER_HEADERS
    if parameters:
        entry["parameters"] = parameters
    if operation.request is not None:
        content: dict[str, Any] = {"application/json": {"schema": _ref(operation.request)}}
        if name == "infer":
            content["application/octet-stream"] = {
                "schema": {"type": "string", "contentMediaType": "application/octet-stream"},
            }
        entry["requestBody"] = {"required": name == "infer", "content": content}
    ok: dict[str, Any] = {"description": "OK"}
    if operation.response is not None:
        ok["content"] = {operation.response_type: {"schema": _ref(operation.response)}}
        if name == "infer":
            ok["content"]["application/octet-stream"] = {
                "schema": {"type": "string", "contentMediaType": "application/octet-stream"},
            }
    elif operation.response_type != "application/json":
        ok["content"] = {operation.response_type: {"schema": {"type": "string"}}}
    else:
        ok["description"] = "OK (an empty body)"
    entry["responses"] = {
        "200": ok,
        "default": {
            "description": "An error: 400 bad request or not ready, 404 unknown model or path, 405 method not "
            "allowed, 413 body too large, 500 internal, 503 unavailable",
            "content": {"application/json": {"schema": _ref("ErrorResponse")}},
        },
    }
    return entry


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _add_dataclass_schema(cls: type, schemas: dict[str, Any]) -> dict[str, str]:
    """Add ``cls`` (and the dataclasses its fields hold) to ``schemas``; return a reference to it."""
    if cls.__name__ not in schemas:
        schemas[cls.__name__] = {}  # placed first: a field that refers back finds it
        hints = typing.get_type_hints(cls)
        fields = [field.name for field in dataclasses.fields(cls)]
        schemas[cls.__name__] = {
            "type": "object",
            "required": fields,
            "properties": {field: _type_schema(hints[field], schemas) for field in fields},
        }
    return _ref(cls.__name__)


def _type_schema(hint: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _add_dataclass_schema(hint, schemas)
    origin = typing.get_origin(hint)
    if origin is tuple or origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(hint)[0], schemas)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(arg, schemas) for arg in typing.get_args(hint)]}
    simple = {str: "string", int: "integer", bool: "boolean", float: "number", type(None): "null"}
    if hint in simple:
        return {"type": simple[hint]}
    raise TypeError(f"no JSON schema for the answer field type {hint!r}")


DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>fastoip REST API</title>
<link rel="stylesheet" href="/v2/docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<noscript>The OpenAPI document is at <a href="/v2/docs/openapi.json">/v2/docs/openapi.json</a>.</noscript>
<script src="/v2/docs/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/v2/docs/openapi.json", dom_id: "#swagger-ui"});</script>
</body>
</html>
"""

"""Triton's restricted APIs: groups of endpoints that answer only requests carrying a header key=value.

Rules:
- ``--http-restricted-api=<apis>:<key>=<value>`` and ``--grpc-restricted-protocol=<protocols>:<key>=<value>``
  parse as Triton parses them (``command_line_parser.cc``): a comma-separated list of groups, then one
  header key and the value it must have; a group may appear in one option only; the flags repeat.
- The groups and which RPC / endpoint belongs to which are Triton's (``restricted_features.h``,
  ``grpc_server.cc``, ``http_server.cc``); gRPC keys get Triton's ``triton-grpc-protocol-`` prefix.
- A request without the header, or with another value, is refused before anything else is looked at:
  gRPC UNAVAILABLE "This protocol is restricted, expecting header '<key>'", HTTP 403
  ``{"error": "This API is restricted, expecting header '<key>'"}``.
- Header names are matched case-insensitively (HTTP names are; HTTP/2 sends them lower-case), values exactly.
- With no restriction configured every lookup table here is empty: the frontends skip the check.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"

#: Triton's group names, in Triton's order (its --help lists them so).
CATEGORIES = (HEALTH, METADATA, INFERENCE, SHARED_MEMORY, MODEL_CONFIG, MODEL_REPOSITORY, STATISTICS, TRACE, LOGGING)

#: Triton prefixes every --grpc-restricted-protocol key with this (grpc_server.h).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

#: gRPC method (of inference.GRPCInferenceService, and grpc.health.v1.Health's Check) -> group.
GRPC_METHOD_CATEGORIES = {
    "ServerLive": HEALTH,
    "ServerReady": HEALTH,
    "ModelReady": HEALTH,
    "Check": HEALTH,
    "ServerMetadata": METADATA,
    "ModelMetadata": METADATA,
    "ModelInfer": INFERENCE,
    "ModelStreamInfer": INFERENCE,
    "ModelConfig": MODEL_CONFIG,
    "ModelStatistics": STATISTICS,
    "TraceSetting": TRACE,
    "LogSettings": LOGGING,
    "SystemSharedMemoryStatus": SHARED_MEMORY,
    "SystemSharedMemoryRegister": SHARED_MEMORY,
    "SystemSharedMemoryUnregister": SHARED_MEMORY,
    "CudaSharedMemoryStatus": SHARED_MEMORY,
    "CudaSharedMemoryRegister": SHARED_MEMORY,
    "CudaSharedMemoryUnregister": SHARED_MEMORY,
    "RepositoryIndex": MODEL_REPOSITORY,
    "RepositoryModelLoad": MODEL_REPOSITORY,
    "RepositoryModelUnload": MODEL_REPOSITORY,
}

#: HTTP paths without parameters -> group.
HTTP_FIXED_PATH_CATEGORIES = {
    "/v2": METADATA,
    "/v2/health/live": HEALTH,
    "/v2/health/ready": HEALTH,
    "/v2/models/stats": STATISTICS,
    "/v2/repository/index": MODEL_REPOSITORY,
    "/v2/trace/setting": TRACE,
    "/v2/logging": LOGGING,
    "/": HEALTH,
    "/v1/models": METADATA,
    # OpenAI's API (server/http/openai), at /v1 and /openai/v1 on the main port, /v1 on --openai-port
    **{f"{prefix}/{path}": INFERENCE for prefix in ("/v1", "/openai/v1")
       for path in ("embeddings", "completions", "chat/completions")},
    "/openai/v1/models": METADATA,
    # the OpenAI port's own (Triton's OpenAI frontend has them)
    "/health/ready": HEALTH,
    "/metrics": STATISTICS,
}

#: ``/v2/models/<model>[/versions/<v>][/<action>]`` -> group, by action (None: the model's metadata).
HTTP_MODEL_ACTION_CATEGORIES: dict[str | None, str] = {
    None: METADATA,
    "ready": HEALTH,
    "infer": INFERENCE,
    "generate": INFERENCE,
    "generate_stream": INFERENCE,
    "config": MODEL_CONFIG,
    "stats": STATISTICS,
    "trace/setting": TRACE,
}


#: KServe V1 ``/v1/models/<model>[:<action>]`` -> group, by action (None: the model's readiness).
HTTP_V1_MODEL_ACTION_CATEGORIES: dict[str | None, str] = {None: HEALTH, "predict": INFERENCE}


class RestrictionError(ValueError):
    """A restriction option Triton would refuse; the message is Triton's."""


@dataclass(frozen=True)
class Restriction:
    """The header one group of endpoints requires."""

    #: As the operator wrote it (with the gRPC prefix): the refusal names it so.
    header: str
    value: str

    @property
    def lookup_name(self) -> str:
        """The header's name as requests carry it (HTTP/2 and ASGI give names lower-case)."""
        return self.header.lower()

    @property
    def lookup_key(self) -> bytes:
        return self.lookup_name.encode("latin-1")

    def allows(self, given: str | bytes | None) -> bool:
        if isinstance(given, bytes):
            given = given.decode("latin-1")  # any byte decodes; a non-ASCII value then simply differs
        return given == self.value

    def grpc_refusal(self) -> str:
        return f"This protocol is restricted, expecting header '{self.header}'"

    def http_refusal(self) -> str:
        return f"This API is restricted, expecting header '{self.header}'"


@dataclass
class RestrictedFeatures:
    """Group -> the header it requires; groups not named are open."""

    by_category: dict[str, Restriction]

    def __bool__(self) -> bool:
        return bool(self.by_category)

    def get(self, category: str | None) -> Restriction | None:
        return self.by_category.get(category) if category is not None else None


def parse_restrictions(
    options: list[str], option_name: str, feature_type: str, key_prefix: str = ""
) -> RestrictedFeatures:
    """Triton's parsing of repeated ``<groups>:<key>=<value>`` options (``ParseRestrictedFeatureOption``)."""
    by_category: dict[str, Restriction] = {}
    for arg in options:
        groups, key, value = _split_option(arg, option_name)
        for group in groups.split(","):
            if group not in CATEGORIES:
                raise RestrictionError(f"unknown restricted {feature_type} '{group}'")
            if group in by_category:
                raise RestrictionError(
                    f"restricted {feature_type} '{group}' can not be specified in multiple config groups"
                )
            by_category[group] = Restriction(key_prefix + key, value)
    return RestrictedFeatures(by_category)


#: The groups of Triton's OpenAI frontend (``--openai-restricted-api <apis> <key> <value>``; its
#: ``api_restriction.py``): what they cover on fastoip's OpenAI port is ``server/http/openai/frontend.py``'s.
OPENAI_INFERENCE = INFERENCE
OPENAI_MODEL_REPOSITORY = MODEL_REPOSITORY
OPENAI_METRICS = "metrics"
OPENAI_CATEGORIES = (OPENAI_INFERENCE, OPENAI_MODEL_REPOSITORY, OPENAI_METRICS, HEALTH)


def parse_openai_restrictions(options: list[list[str]]) -> RestrictedFeatures:
    """Triton's OpenAI frontend's parsing of repeated ``--openai-restricted-api <apis> <key> <value>``."""
    by_category: dict[str, Restriction] = {}
    for apis, key, value in options:
        for api in apis.split(","):
            if api not in OPENAI_CATEGORIES:
                raise RestrictionError(f"Unknown API '{api}'. Available APIs: {list(OPENAI_CATEGORIES)}")
            if api in by_category:
                raise RestrictionError(f"restricted api '{api}' can not be specified in multiple config groups")
            by_category[api] = Restriction(key, value)
    return RestrictedFeatures(by_category)


def parse_http_restrictions(options: list[str]) -> RestrictedFeatures:
    return parse_restrictions(options, "http-restricted-api", "api")


def parse_grpc_restrictions(options: list[str]) -> RestrictedFeatures:
    return parse_restrictions(options, "grpc-restricted-protocol", "protocol", GRPC_HEADER_PREFIX)


def _split_option(arg: str, option_name: str) -> tuple[str, str, str]:
    """``<groups>:<key>=<value>`` split as Triton's ParseGenericConfigOption splits it."""
    groups, colon, rest = arg.partition(":")
    key, equals, value = rest.partition("=")
    if not colon or not equals or not groups or not key or not value:
        raise RestrictionError(
            f"--{option_name} option format is '<config name>:<setting>=<value>'. Got {arg}"
        )
    return groups, key, value


def grpc_method_restrictions(
    features: RestrictedFeatures, service: str, health_service: str
) -> dict[str, Restriction]:
    """``/<package.Service>/<Method>`` -> its restriction, for restricted methods only (empty: none)."""
    paths = {}
    for method, category in GRPC_METHOD_CATEGORIES.items():
        restriction = features.get(category)
        if restriction is not None:
            owner = health_service if method == "Check" else service
            paths[f"/{owner}/{method}"] = restriction
    return paths

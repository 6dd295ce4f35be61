"""Queue and token metrics under the names the Gateway API Inference Extension's endpoint picker reads.

The endpoint picker (EPP) scores model server pods by Prometheus metrics whose names it takes from flags,
defaulting to vLLM's; fastoip exports its own facts under those names, so a default EPP routes to it:

==============================  ===================================  =================================================
EPP reads (its flag)            fastoip exports                       what it is here
==============================  ===================================  =================================================
total queued requests           ``vllm:num_requests_waiting``         requests in the models' scheduler queues
total running requests          ``vllm:num_requests_running``         requests the models hold, minus the queued ones
KV-cache utilisation            ``vllm:gpu_cache_usage_perc``         0: fastoip keeps no KV cache, so none is full
(token throughput)              ``vllm:prompt_tokens_total``,         tokens of the OpenAI routes' answers (usage)
                                ``vllm:generation_tokens_total``
==============================  ===================================  =================================================

Each carries ``model_name`` (all versions of a model together).  The token counters appear once a model has
answered an OpenAI generation; they are process-wide, as the counters of the requests they count.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from prometheus_client.core import Metric

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
CACHE_USAGE = "vllm:gpu_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
GATEWAY_NAMES = frozenset({WAITING, RUNNING, CACHE_USAGE, PROMPT_TOKENS, GENERATION_TOKENS})


class TokenCounters:
    """Prompt and generated tokens per model, added to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def record(self, model: str, prompt_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            counts = self._counts.setdefault(model, [0, 0])
            counts[0] += prompt_tokens
            counts[1] += generated_tokens

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {model: (counts[0], counts[1]) for model, counts in self._counts.items()}


#: What the OpenAI routes generated, by model.
TOKENS = TokenCounters()


def gateway_families(pending: Mapping[tuple[str, str], int], in_flight: Mapping[tuple[str, str], int]) -> list[Metric]:
    """The families above; ``pending`` and ``in_flight``: queued and held requests per (model, version)."""
    waiting: dict[str, int] = {}
    held: dict[str, int] = {}
    for (model, _version), count in pending.items():
        waiting[model] = waiting.get(model, 0) + count
    for (model, _version), count in in_flight.items():
        held[model] = held.get(model, 0) + count
    families = [
        _gauge(WAITING, "Requests waiting in the models' queues (fastoip's scheduler queues)", waiting),
        _gauge(RUNNING, "Requests running on the models (held, not queued)",
               {model: max(held.get(model, 0) - waiting.get(model, 0), 0) for model in held}),
        _gauge(CACHE_USAGE, "KV-cache usage, 1 is full (fastoip keeps no KV cache: 0)", dict.fromkeys(held, 0)),
    ]
    tokens = TOKENS.snapshot()
    if tokens:
        for name, index, text in ((PROMPT_TOKENS, 0, "Prompt tokens of OpenAI generations"),
                                  (GENERATION_TOKENS, 1, "Generated tokens of OpenAI generations")):
            family = Metric(name, text, "counter")
            for model, counts in tokens.items():
                family.add_sample(name, {"model_name": model}, counts[index])
            families.append(family)
    return families


def _gauge(name: str, text: str, values: Mapping[str, int]) -> Metric:
    family = Metric(name, text, "gauge")
    for model, value in sorted(values.items()):
        family.add_sample(name, {"model_name": model}, value)
    return family

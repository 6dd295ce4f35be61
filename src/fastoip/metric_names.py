"""Prometheus' rules for metric and label names, for the families a model defines (custom metrics).

Rules (Prometheus' data model, as prometheus-cpp checks them for Triton's custom metrics):
- A metric name matches ``[a-zA-Z_:][a-zA-Z0-9_:]*``; a label name ``[a-zA-Z_][a-zA-Z0-9_]*`` and does not
  start with ``__`` (reserved for Prometheus' own); a histogram's labels may not be ``le`` (its buckets').
- A model's family may not take the name of one the server exports (``nv_inference_request_success``...):
  the autoscaling and the dashboards read those, and a second family of the same name breaks the scrape.
- A histogram's buckets are a list of finite numbers, strictly ascending (an empty list is allowed), as
  Triton's core requires (:func:`histogram_buckets_error`).
- Standard library only: the worker process checks a family when the model makes it (an error to the model at
  once, as in Triton), and the server checks it again (a worker may lie), then escapes on export whatever it
  writes (:func:`safe_label_name`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NOT_LABEL_CHARACTER = re.compile(r"[^a-zA-Z0-9_]")


def metric_name_error(name: object, taken: Collection[str] = ()) -> str | None:
    """Why ``name`` cannot name a model's metric family (None when it can)."""
    if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
        return (
            f"invalid metric name {str(name)[:200]!r}: a Prometheus metric name matches [a-zA-Z_:][a-zA-Z0-9_:]*"
        )
    if name in taken:
        return f"invalid metric name '{name}': the server exports a family of that name"
    return None


def label_names_error(labels: Mapping[Any, Any], histogram: bool = False) -> str | None:
    """Why ``labels`` cannot label a model's metric (None when they can): names by Prometheus' rules, values
    strings."""
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_NAME.fullmatch(key):
            return f"invalid label name {str(key)[:200]!r}: a Prometheus label name matches [a-zA-Z_][a-zA-Z0-9_]*"
        if key.startswith("__"):
            return f"invalid label name '{key}': names starting with '__' are reserved"
        if histogram and key == "le":
            return "invalid label name 'le': a histogram's buckets use it"
        if not isinstance(value, str):
            return f"label '{key}': its value must be a string, not {type(value).__name__}"
    return None


def safe_label_name(key: str) -> str:
    """``key`` as it may stand in the text format: every other character becomes '_' (as prometheus_client's
    underscore escaping), a leading digit gets a '_' before it."""
    if LABEL_NAME.fullmatch(key):
        return key
    safe = _NOT_LABEL_CHARACTER.sub("_", key)
    return safe if safe and not safe[0].isdigit() else f"_{safe}"


def histogram_buckets_error(buckets: object) -> str | None:
    """Why ``buckets`` cannot bound a histogram (Triton: a list, strictly ascending; empty is allowed), or None."""
    if not isinstance(buckets, list):
        return "Buckets must be a list."
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in buckets):
        return "Buckets must be finite numbers."
    if any(b >= after for b, after in zip(buckets, buckets[1:], strict=False)):
        return "Bucket boundaries must be strictly ascending (no duplicates)."
    return None

"""Metric families a model defines (python_backend's ``pb_utils.MetricFamily``), exported after the server's own.

Rules:
- One registry per Core (:class:`fastoip.core_link.CoreLink` holds it): two servers in one process export their
  own models' families.
- A family's name and label keys are checked here by Prometheus' rules (:mod:`fastoip.metric_names`), whatever
  the model's side checked (a worker may lie, and one bad name would fail the whole scrape); a family may not
  take a name the server exports.  A refusal is a :class:`MetricError` (the backend says it to the model).
- Kinds are python_backend's numbers: :data:`COUNTER`, :data:`GAUGE`, :data:`HISTOGRAM`.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client.metrics_core import Metric

from ..metric_names import histogram_buckets_error, label_names_error, metric_name_error
from .prometheus import EXPORTED_NAMES, exposition_text

COUNTER = 0
GAUGE = 1
HISTOGRAM = 2
_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


class MetricError(ValueError):
    """A model's metric operation refused: a bad name or labels, or a family of that name with another kind."""


class _Series:
    __slots__ = ("value", "buckets", "counts", "total", "count")

    def __init__(self, buckets: list[float] | None) -> None:
        self.value = 0.0
        self.buckets = buckets or []
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0


class CustomMetrics:
    """Model-defined metric families, by name; each series by its labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, tuple[int, str, dict[tuple, _Series]]] = {}

    def apply(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        """``op`` (``increment``, ``set``, ``observe``, ``value``) on the series ``labels`` of ``family``
        (``{"name", "description", "kind", "buckets"}``); the series' value (a histogram's: its count)."""
        name, kind = str(family["name"]), int(family["kind"])
        problem = metric_name_error(family["name"], EXPORTED_NAMES) or label_names_error(labels, kind == HISTOGRAM)
        if problem is not None:
            raise MetricError(problem)
        if kind not in _KIND_NAMES:
            raise MetricError(f"unknown metric kind {kind}")
        buckets = family.get("buckets")
        if kind == HISTOGRAM and op != "family":
            problem = histogram_buckets_error(buckets)
            if problem is not None:
                raise MetricError(problem)
        key = tuple(sorted(labels.items()))
        with self._lock:
            known = self._families.get(name)
            if known is None:
                # The first family of a name keeps its description (Triton's registry does).
                known = (kind, str(family.get("description", "")), {})
                self._families[name] = known
            elif known[0] != kind:
                raise MetricError(
                    f"Error when creating MetricFamily: metric family '{name}' already exists with another kind")
            if op == "family":  # (the family made when the model makes it: its kind is checked at once)
                return 0.0
            series = known[2].get(key)
            if series is None:
                series = _Series(buckets)
                known[2][key] = series
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.total += value
                series.count += 1
                for i, bound in enumerate(series.buckets):
                    if value <= bound:
                        series.counts[i] += 1
            if op == "value" and kind == HISTOGRAM:
                return float(series.count)
            return series.value

    def families(self) -> list[Metric]:
        out = []
        with self._lock:
            for name, (kind, description, series_by_labels) in sorted(self._families.items()):
                family = Metric(name, description, _KIND_NAMES[kind])
                family.name = name  # as the model named it (no "_total" appended)
                for key, series in series_by_labels.items():
                    labels = dict(key)
                    if kind == HISTOGRAM:
                        # observe() counts each value in every bucket whose bound it is under: already cumulative
                        for bound, cumulative in zip(series.buckets, series.counts, strict=True):
                            family.add_sample(f"{name}_bucket", {**labels, "le": _bound(bound)}, cumulative)
                        family.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, series.count)
                        family.add_sample(f"{name}_sum", labels, series.total)
                        family.add_sample(f"{name}_count", labels, series.count)
                    else:
                        family.add_sample(name, labels, series.value)
                out.append(family)
        return out

    def text(self) -> str:
        families = self.families()
        return exposition_text(families) if families else ""


def _bound(value: float) -> str:
    # As Triton's prometheus-cpp writes a bound: 1 as "1", 0.1 as "0.1" (its tests read le="1").
    return format(value, ".16g")

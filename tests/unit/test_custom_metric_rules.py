"""python_backend's custom-metric rules (issue 41; Triton's qa/python_models/custom_metrics reads them): a family
is made when the model makes it, so a second one of another kind is refused and one with another description
shares the first's; a histogram needs a list of strictly ascending buckets (an empty list is allowed); a Metric
lives only as long as its family object; bucket bounds are written as Triton writes them (``le="1"``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastoip.metrics.custom import CustomMetrics, MetricError
from fastoip.pyworker import utils as pb


class _ServerSide:
    """The server's half of the metric calls, in this process: a fresh registry (what a worker's calls reach)."""

    def __init__(self) -> None:
        self.metrics = CustomMetrics()

    def metric(self, family: dict[str, Any], labels: dict[str, str], op: str, value: float) -> float:
        try:
            return self.metrics.apply(family, labels, op, value)
        except MetricError as exc:  # (as the server's answer reaches the model: pb_utils' exception)
            raise pb.TritonModelException(str(exc)) from None


@contextlib.contextmanager
def served() -> Iterator[CustomMetrics]:
    server = _ServerSide()
    with pb.BRIDGE.using(cast(pb.Bridge, server)):
        yield server.metrics


def test_a_second_family_of_another_kind_is_refused_when_made() -> None:
    with served():
        first = pb.MetricFamily("dup_kind", "d", pb.MetricFamily.COUNTER)
        with pytest.raises(pb.TritonModelException, match="already exists with another kind"):
            pb.MetricFamily("dup_kind", "d", pb.MetricFamily.GAUGE)
        assert first.Metric().value() == 0.0  # the first one stays usable


def test_a_second_family_of_the_same_name_keeps_the_first_description_and_shares_series() -> None:
    with served() as metrics:
        first = pb.MetricFamily("dup_description", "first description", pb.MetricFamily.COUNTER)
        second = pb.MetricFamily("dup_description", "second description", pb.MetricFamily.COUNTER)
        second.Metric(labels={"k": "v"}).increment(3)
        assert first.Metric(labels={"k": "v"}).value() == 3.0  # one series
        del first
        text = metrics.text()
        assert "# HELP dup_description first description" in text
        assert "second description" not in text


def test_a_family_is_exported_from_when_it_is_made() -> None:
    """Before, nothing reached the server until the first Metric: the second family's description won."""
    with served() as metrics:
        family = pb.MetricFamily("made_early", "early", pb.MetricFamily.GAUGE)
        assert "# HELP made_early early" in metrics.text()
        assert family.name == "made_early"


@pytest.mark.parametrize(
    ("buckets", "says"),
    [
        (None, "Missing required buckets"),
        ([2.5, 0.1, 1.0, 10.0, 5.0], "strictly ascending"),
        ([1, 1, 2, 5, 5], "strictly ascending"),
        ((0.1, 1.0), "must be a list"),
        ([0.1, float("nan")], "finite"),
    ],
)
def test_histogram_buckets_are_checked_as_triton_does(buckets: Any, says: str) -> None:
    with served():
        family = pb.MetricFamily("hist_args", "d", pb.MetricFamily.HISTOGRAM)
        with pytest.raises(pb.TritonModelException, match=says):
            family.Metric(labels={}, buckets=buckets)


def test_an_empty_bucket_list_is_a_histogram_of_one_bucket() -> None:
    with served() as metrics:
        family = pb.MetricFamily("hist_empty", "d", pb.MetricFamily.HISTOGRAM)
        family.Metric(labels={}, buckets=[]).observe(3.0)
        samples = {s.name + str(s.labels.get("le")): s.value
                   for f in text_string_to_metric_families(metrics.text()) for s in f.samples}
        assert samples == {"hist_empty_bucket+Inf": 1.0, "hist_empty_sumNone": 3.0, "hist_empty_countNone": 1.0}


def test_buckets_on_a_counter_are_refused_and_a_histogram_has_no_value() -> None:
    with served():
        counter = pb.MetricFamily("with_buckets", "d", pb.MetricFamily.COUNTER)
        with pytest.raises(pb.TritonModelException, match="Unexpected buckets"):
            counter.Metric(buckets=[1.0])
        histogram = pb.MetricFamily("no_value", "d", pb.MetricFamily.HISTOGRAM)
        with pytest.raises(pb.TritonModelException):
            histogram.Metric(buckets=[1.0]).value()


def test_the_server_refuses_buckets_a_lying_worker_sends() -> None:
    family = {"name": "lied", "description": "d", "kind": pb.MetricFamily.HISTOGRAM, "buckets": [5.0, 1.0]}
    metrics = CustomMetrics()
    with pytest.raises(MetricError, match="strictly ascending"):
        metrics.apply(family, {}, "create", 0.0)
    with pytest.raises(MetricError, match="must be a list"):
        metrics.apply({**family, "buckets": "1,2"}, {}, "create", 0.0)
    assert metrics.text() == ""


def test_bucket_bounds_are_written_as_triton_writes_them() -> None:
    with served() as metrics:
        family = pb.MetricFamily("hist_e2e", "d", pb.MetricFamily.HISTOGRAM)
        metric = family.Metric(labels={"a": "x"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
        for value in (0.05, 1.5, 6.0):
            metric.observe(value)
        text = metrics.text()
        for bound, count in (("0.1", 1), ("1", 1), ("2.5", 2), ("5", 2), ("10", 3), ("+Inf", 3)):
            assert f'hist_e2e_bucket{{a="x",le="{bound}"}} {count}' in text
        assert 'hist_e2e_count{a="x"} 3' in text


@pytest.mark.parametrize("kind", [pb.MetricFamily.COUNTER, pb.MetricFamily.GAUGE])
def test_a_metric_outliving_its_family_raises_triton_words(kind: int) -> None:
    with served():
        family = pb.MetricFamily(f"lifetime_{kind}", "d", kind)
        metric = family.Metric(labels={"k": "v"})
        metric.increment(1)
        del family
        operations = [lambda: metric.increment(10), metric.value]
        if kind == pb.MetricFamily.GAUGE:
            operations.append(lambda: metric.set(10))
        for operation in operations:
            with pytest.raises(pb.TritonModelException, match="corresponding 'MetricFamily' has been deleted"):
                operation()

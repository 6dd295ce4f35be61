"""Custom metrics a model defines (issue 36 item 5): names by Prometheus' rules, label keys and values escaped on
export.  Before: an invalid family name failed Prometheus' whole scrape, and a label key injected a forged
``nv_inference_request_success`` line (which the shipped autoscaling reads)."""

from __future__ import annotations

from typing import cast

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from fastoip.metric_names import label_names_error, metric_name_error, safe_label_name
from fastoip.metrics import exposition_text
from fastoip.metrics.custom import CustomMetrics, MetricError
from fastoip.pyworker import utils as pb


class _Registry:
    """The server's half of a worker's metric calls, in this process."""

    def __init__(self, metrics: CustomMetrics) -> None:
        self.metrics = metrics

    def metric(self, family: dict, labels: dict, op: str, value: float) -> float:
        return self.metrics.apply(family, labels, op, value)


FORGING_KEY = 'a="1"} 1\nnv_inference_request_success{model="victim",version="1"} 999999\n# x{b'
COUNTER = {"name": "my_requests", "description": "d", "kind": pb.MetricFamily.COUNTER}


@pytest.mark.parametrize("name", ["bad-name", "1starts_with_digit", "", "a b", "x{y}", "ok\nnv_forged 1", 7])
def test_a_bad_family_name_is_refused_by_the_server(name: object) -> None:
    metrics = CustomMetrics()
    with pytest.raises(MetricError, match="invalid metric name"):
        metrics.apply({**COUNTER, "name": name}, {}, "increment", 1.0)
    assert metrics.text() == ""  # nothing kept, nothing exported


def test_a_family_may_not_take_a_name_the_server_exports() -> None:
    with pytest.raises(MetricError, match="the server exports a family of that name"):
        CustomMetrics().apply({**COUNTER, "name": "nv_inference_request_success"}, {}, "increment", 1.0)


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        ({FORGING_KEY: "v"}, "invalid label name"),
        ({"__name__": "v"}, "reserved"),
        ({"model-name": "v"}, "invalid label name"),
        ({"ok": 3}, "must be a string"),
    ],
)
def test_bad_labels_are_refused_by_the_server(labels: dict, says: str) -> None:
    with pytest.raises(MetricError, match=says):
        CustomMetrics().apply(COUNTER, labels, "increment", 1.0)


def test_le_is_refused_on_a_histogram_only() -> None:
    assert label_names_error({"le": "1"}, histogram=True) is not None
    assert label_names_error({"le": "1"}) is None
    assert metric_name_error("namespace:metric_total") is None


def test_export_never_writes_a_forged_line_nor_breaks_the_scrape() -> None:
    """Whatever a family holds (a lying worker, a registry of MLServer's), the text parses and says only it."""
    forged = Metric("my_requests", "d", "counter")
    forged.name = "my_requests"
    forged.add_sample("my_requests", {FORGING_KEY: 'x"}\n', "model": "m"}, 1.0)
    bad = Metric("fine_name", "d", "gauge")
    bad.name = "bad-name"  # (past any check)
    good = Metric("good_gauge", "d", "gauge")
    good.add_sample("good_gauge", {"kind": "x"}, 2.0)
    text = exposition_text([forged, bad, good])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {"my_requests", "good_gauge"}  # the bad family is left out, the rest is there
    assert not [line for line in text.splitlines() if line.startswith("nv_inference_request_success")]
    (sample,) = families["my_requests"].samples
    assert sample.value == 1.0 and sample.labels["model"] == "m"
    assert sample.labels[safe_label_name(FORGING_KEY)] == 'x"}\n'  # escaped both ways, read back whole
    assert families["good_gauge"].samples[0].value == 2.0


def test_the_worker_refuses_bad_names_when_the_model_makes_them() -> None:
    """In the worker, ``pb_utils.MetricFamily`` and ``.Metric`` raise at once (as Triton's do), before anything is
    sent to the server."""
    with pytest.raises(pb.TritonModelException, match="invalid metric name 'bad-name'"):
        pb.MetricFamily("bad-name", "d", pb.MetricFamily.COUNTER)
    metrics = CustomMetrics()
    with pb.BRIDGE.using(cast(pb.Bridge, _Registry(metrics))):  # (a family is made in the server at once)
        family = pb.MetricFamily("good_name", "d", pb.MetricFamily.COUNTER)
        with pytest.raises(pb.TritonModelException, match="invalid label name"):
            family.Metric(labels={FORGING_KEY: "v"})
        assert "invalid" not in metrics.text()


def test_a_family_of_an_unknown_kind_is_refused_not_a_broken_scrape() -> None:
    """A lying worker's kind 7 would have failed every later scrape (no exposition type for it)."""
    metrics = CustomMetrics()
    with pytest.raises(MetricError, match="unknown metric kind 7"):
        metrics.apply({**COUNTER, "kind": 7}, {}, "increment", 1.0)
    metrics.apply(COUNTER, {"a": "b"}, "increment", 2.0)
    assert [f.name for f in text_string_to_metric_families(metrics.text())] == ["my_requests"]


def test_each_core_exports_its_own_models_families(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Custom metrics live with the Core (its link), not in one process-wide registry: two servers in one
    process export only their own models' families."""
    from fastoip.backends.python.triton.server_bridge import InProcessBridge, link_of
    from fastoip.core import Core

    first, second = Core(tmp_path), Core(tmp_path)
    try:
        bridge = InProcessBridge(link_of(first.repository.options))
        bridge.metric(COUNTER, {"model": "m"}, "increment", 3.0)
        with pytest.raises(pb.TritonModelException, match="invalid metric name"):  # said to the model as Triton's
            bridge.metric({**COUNTER, "name": "bad-name"}, {}, "increment", 1.0)
        assert 'my_requests{model="m"} 3.0' in first.prometheus_metrics()
        assert "my_requests" not in second.prometheus_metrics()
    finally:
        first.close()
        second.close()

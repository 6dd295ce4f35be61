"""deploy/grafana/fastoip.json: a Grafana dashboard model whose every query reads metrics fastoip exports.

The dashboard is read with Grafana's own typed models (``grafana-foundation-sdk``, generated from
Grafana's dashboard schema, with its Prometheus and panel plugins registered), and each PromQL
expression is parsed by ``promql-parser`` (the Prometheus parser's Rust port).  Required by
Grafana to import it: uid, title, schemaVersion, panels with unique ids and a gridPos inside the
24-column grid, datasource and model template variables the queries use.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fastoip.host_metrics import CPU_NAMES, GPU_NAMES
from fastoip.metrics import EXPORTED_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fastoip.json"
#: What a panel's query may name: every family fastoip exports, with a histogram's and a summary's series.
KNOWN = EXPORTED_NAMES | CPU_NAMES | GPU_NAMES
SERIES_SUFFIXES = ("_bucket", "_sum", "_count")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    promql_parser = pytest.importorskip("promql_parser")
    # Grafana substitutes its variables before Prometheus sees the query.
    concrete = expr.replace("$__rate_interval", "5m").replace("$model", ".*")
    ast = promql_parser.parse(concrete)  # raises ValueError on a syntax error
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(ast, visit)
    return names


def family(name: str) -> str:
    for suffix in SERIES_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in KNOWN:
            return name[: -len(suffix)]
    return name


def test_dashboard_loads_as_grafana_dashboard_model() -> None:
    sdk_plugins = pytest.importorskip("grafana_foundation_sdk.cog.plugins")
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus, timeseries

    sdk_plugins.register_default_plugins()
    data = load()
    board = model.Dashboard.from_json(data)
    assert board.title == "fastoip" and board.uid and 8 <= len(board.uid) <= 40
    assert isinstance(board.schema_version, int) and board.schema_version >= 36
    assert board.templating is not None
    assert {v.name for v in board.templating.list_val} == {"datasource", "model"}
    assert board.panels and len(board.panels) == len(data["panels"])
    for panel in board.panels:
        assert isinstance(panel, (model.Panel, model.RowPanel))
        if isinstance(panel, model.RowPanel):
            continue
        assert panel.type_val == "timeseries" and isinstance(panel.options, timeseries.Options)
        assert panel.targets, f"panel {panel.title!r} has no query"
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), f"panel {panel.title!r}: not a Prometheus query"
            assert target.expr and target.ref_id
        assert panel.datasource is not None and panel.datasource.uid == "${datasource}"


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping() -> None:
    panels = load()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(set(ids)) == len(ids)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_every_query_parses_and_reads_only_metrics_fastoip_exports() -> None:
    used: set[str] = set()
    for title, expr in queries(load()):
        names = {family(name) for name in metric_names(expr)}
        assert names, f"{title}: {expr} reads no metric"
        assert names <= KNOWN, f"{title}: {sorted(names - KNOWN)} is not a metric fastoip exports"
        used |= names
    # What the dashboard promises: traffic, failures, latency (counters, summaries, histogram), queue,
    # batch size (inferences / executions), CPU and GPU.
    assert {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
        "nv_inference_first_response_histogram_ms", "nv_inference_pending_request_count", "nv_inference_count",
        "nv_inference_exec_count", "nv_cpu_utilization", "nv_gpu_utilization",
    } <= used


def test_template_variables_are_the_ones_queries_use() -> None:
    dashboard = load()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for title, expr in queries(dashboard):
        for name in re.findall(r"\$(\w+)", expr):
            assert name.startswith("__") or name in variables, f"{title}: ${name} is not defined"
    model_query = next(v for v in dashboard["templating"]["list"] if v["name"] == "model")["query"]["query"]
    assert metric_names(model_query.replace("label_values(", "group(").replace(", model)", ")")) <= KNOWN


def test_a_failure_panel_splits_by_reason() -> None:
    panel = next(p for p in load()["panels"] if p["title"] == "Failures by reason")
    assert "reason" in panel["targets"][0]["expr"]


def _manifest_metrics_flags() -> set[tuple[str, ...]]:
    """The --metrics-config values of every fastoip container the shipped manifests run."""
    from manifests import pod_specs, serve_options, servers

    return {tuple(sorted(serve_options(c).metrics_config)) for _, spec, _ in pod_specs() for c in servers(spec)}


def test_every_panel_query_reads_series_the_manifests_server_exports(demo_repo: Path) -> None:
    """A real server started with the manifests' metrics flags, after some traffic, exports every series each
    panel reads (nv_gpu_* aside: no GPU here). Without those flags the latency panels were empty."""
    import urllib.request

    from serverproc import ServerProcess

    flags = _manifest_metrics_flags()
    assert len(flags) == 1, f"the manifests disagree on --metrics-config: {flags}"
    (values,) = flags
    assert {"summary_latencies=true", "histogram_latencies=true"} <= set(values)
    args = [f"--metrics-config={value}" for value in values]
    with ServerProcess(demo_repo, *args, http=True, metrics=True) as server:
        body = json.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32",
                                       "data": list(range(16))} for i in (0, 1)]}).encode()
        for _ in range(5):
            request = urllib.request.Request(f"http://{server.http_url}/v2/models/simple/infer", data=body)
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
    exported = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    for title, expr in queries(load()):
        wanted = {name for name in metric_names(expr) if not name.startswith("nv_gpu_")}
        assert wanted <= exported, f"{title}: {sorted(wanted - exported)} not exported with {args}"

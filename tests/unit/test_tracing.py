"""Tracing without sockets: Triton's --trace-config, its settings semantics, its trace file, and the Core's traces
(timestamps and tensors of real requests on real ONNX Runtime); OTLP spans reach a real receiver."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastoip.errors import InvalidArgument, Unsupported
from fastoip.tracing import TraceManager, TraceRecord, parse_trace_config
from fastoip.tracing.triton_file import TraceFile
from harness import core_on, simple_request
from otlp_receiver import otlp_receiver

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def record(trace_id: int = 1, carrier: dict[str, str] | None = None) -> TraceRecord:
    base = time.monotonic_ns()
    names = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
             "COMPUTE_END", "REQUEST_END"]
    rec = TraceRecord(trace_id, "simple", "1", "req-7", carrier=carrier or {})
    for i, name in enumerate(names):
        rec.stamp(name, base + i * 1000)
    return rec


# -- --trace-config ---------------------------------------------------------------------------------
def test_trace_config_reads_tritons_spelling() -> None:
    config = parse_trace_config([
        "level=TIMESTAMPS", "level=tensors", "rate=5", "count=10", "mode=opentelemetry",
        "triton,file=/tmp/a,b.json", "triton,log-frequency=50", "opentelemetry,url=collector:4318/v1/traces",
        "opentelemetry,resource=service.name=svc", "opentelemetry,resource=deployment=blue",
        "opentelemetry,bsp_schedule_delay=100",
    ])
    assert config.levels == ("TIMESTAMPS", "TENSORS") and config.enabled
    assert (config.rate, config.count, config.mode) == (5, 10, "opentelemetry")
    assert (config.file, config.log_frequency) == ("/tmp/a,b.json", 50)
    assert config.otel_url == "http://collector:4318/v1/traces"
    assert config.otel_resource == {"service.name": "svc", "deployment": "blue"}
    assert config.bsp_schedule_delay_ms == 100
    assert not parse_trace_config([]).enabled


def test_deprecated_flags_give_the_start_and_trace_config_wins() -> None:
    config = parse_trace_config(["rate=7"], trace_file="/tmp/t.json", trace_levels=["max"], trace_rate=3,
                                trace_count=2, trace_log_frequency=4)
    assert (config.file, config.levels, config.rate, config.count, config.log_frequency) == (
        "/tmp/t.json", ("TIMESTAMPS",), 7, 2, 4)
    # levels add up; an explicit OFF anywhere turns tracing off (Triton's parser)
    assert parse_trace_config(["level=TENSORS"], trace_levels=["TIMESTAMPS"]).levels == ("TIMESTAMPS", "TENSORS")
    assert parse_trace_config(["level=TIMESTAMPS", "level=off"]).levels == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("level=LOUD", "level"), ("rate=x", "integer"), ("mode=jaeger", "trace mode"), ("colour=red", "unknown global"),
        ("triton,colour=red", "triton: unknown"), ("zipkin,url=x", "unknown mode"), ("level", "format"),
        ("opentelemetry,resource=novalue", "key=value"), ("count=-2", ">= -1"),
    ],
)
def test_bad_trace_config_is_refused_by_name(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_trace_config([entry])


def test_opentelemetry_mode_without_the_sdk_stops_the_start_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastoip.cli import serve_options
    from fastoip.triton_flags import FlagError

    assert serve_options(["--trace-config", "mode=opentelemetry"]).trace_config.mode == "opentelemetry"
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)  # not installed
    with pytest.raises(FlagError, match=r"pip install 'fastoip\[otel\]'"):
        serve_options(["--trace-config", "mode=opentelemetry"])
    with pytest.raises(FlagError, match="--trace-config level"):
        serve_options(["--trace-config", "level=LOUD"])
    assert serve_options(["--trace-level", "TIMESTAMPS", "--trace-rate", "5"]).trace_config.rate == 5


# -- Triton's trace file ----------------------------------------------------------------------------
def test_trace_file_is_a_json_array_after_every_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    writer = TraceFile(str(path))
    first = record(1)
    first.tensors.append(("TENSOR_QUEUE_INPUT", "INPUT0", "INT32", (1, 3), np.array([[1, 2, 3]], dtype=np.int32)))
    first.tensors.append(("TENSOR_BACKEND_OUTPUT", "OUT", "FP32", (2,), np.array([0.5, 1e-7], dtype=np.float32)))
    first.tensors.append(("TENSOR_BACKEND_OUTPUT", "TEXT", "BYTES", (2,), np.array([b"ab", b"c"], dtype=object)))
    writer.append(first.triton_entries())
    entries = json.loads(path.read_text())
    assert entries[0] == {"id": 1, "model_name": "simple", "model_version": 1, "request_id": "req-7"}
    assert [e["timestamps"][0]["name"] for e in entries if "timestamps" in e][0] == "REQUEST_START"
    tensors = [e["tensor"] for e in entries if "tensor" in e]
    assert tensors[0] == {"name": "INPUT0", "data": "1,2,3", "shape": "1,3", "dtype": "INT32"}
    assert tensors[1]["data"] == "0.5,1e-07"  # C++ stream formatting, as Triton prints floats
    assert tensors[2]["data"] == '"ab","c"'
    writer.append(record(2).triton_entries())
    assert {e["id"] for e in json.loads(path.read_text())} == {1, 2}
    writer.write_indexed(record(3).triton_entries())
    assert {e["id"] for e in json.loads((tmp_path / "trace.json.0").read_text())} == {3}


# -- settings: Triton's semantics --------------------------------------------------------------------
def manager(tmp_path: Path, *entries: str) -> TraceManager:
    return TraceManager(parse_trace_config([f"triton,file={tmp_path / 'trace.json'}", *entries]))


def test_rate_traces_every_nth_request_and_count_counts_down(tmp_path: Path) -> None:
    traces = manager(tmp_path, "level=TIMESTAMPS", "rate=3", "count=2")
    assert traces.active
    taken = [traces.begin("simple", "1", "", None) is not None for _ in range(12)]
    assert taken == [False, False, True, False, False, True] + [False] * 6  # the 3rd, the 6th, then none left
    assert traces.settings()["trace_count"] == ["0"]


def test_model_settings_mirror_the_global_ones_where_not_set(tmp_path: Path) -> None:
    traces = manager(tmp_path)
    assert not traces.active  # level OFF: the Core skips tracing altogether
    model = traces.update({"trace_level": ["TIMESTAMPS"]}, "simple")
    assert model["trace_level"] == ["TIMESTAMPS"] and model["trace_rate"] == ["1000"]
    assert traces.active and traces.settings()["trace_level"] == ["OFF"]
    traces.update({"trace_rate": ["5"]})  # global change: the model follows in what it did not set
    model = traces.settings("simple")
    assert model["trace_rate"] == ["5"] and model["trace_level"] == ["TIMESTAMPS"]
    assert traces.settings("other")["trace_level"] == ["OFF"]  # a model without its own setting: the global one
    traces.update({"trace_level": None}, "simple")  # cleared: nothing of its own left
    assert traces.settings("simple") == traces.settings() and not traces.active


def test_settings_api_refusals_use_tritons_words(tmp_path: Path) -> None:
    traces = manager(tmp_path)
    with pytest.raises(Unsupported, match="trace file location can not be updated"):
        traces.update({"trace_file": ["/tmp/elsewhere.json"]})
    with pytest.raises(InvalidArgument, match="Expect only one trace level 'OFF'"):
        traces.update({"trace_level": ["OFF", "TIMESTAMPS"]})
    with pytest.raises(InvalidArgument, match="Unable to parse 'trace_rate', got: often"):
        traces.update({"trace_rate": ["often"]})
    with pytest.raises(InvalidArgument, match="out of range"):
        traces.update({"trace_count": ["-2"]})
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        traces.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"]})
    with pytest.raises(InvalidArgument, match="no_such_setting"):
        traces.update({"no_such_setting": ["1"]})
    no_file = TraceManager(parse_trace_config([]))
    with pytest.raises(InvalidArgument, match="trace file name is not given"):
        no_file.update({"trace_level": ["TIMESTAMPS"]})
    assert traces.settings()["trace_level"] == ["OFF"]  # nothing half-applied


def test_log_frequency_writes_every_n_traces_to_indexed_files(tmp_path: Path) -> None:
    traces = manager(tmp_path, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=2")
    for _ in range(3):
        trace = traces.begin("simple", "1", "", None)
        assert trace is not None
        trace.record.stamp("REQUEST_START", 1)
        traces.finish(trace)
    assert len(json.loads((tmp_path / "trace.json.0").read_text())) == 4  # 2 traces: head + one stamp each
    assert not (tmp_path / "trace.json.1").exists()
    traces.close()  # the rest at shutdown
    assert len(json.loads((tmp_path / "trace.json.1").read_text())) == 2
    assert not (tmp_path / "trace.json").exists()


# -- the Core's traces: real requests on real ONNX Runtime ---------------------------------------------
def test_core_writes_timestamps_and_tensors_of_a_request(demo_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    config = parse_trace_config([f"triton,file={path}", "level=TIMESTAMPS", "level=TENSORS", "rate=1"])
    with core_on(demo_repo, trace_config=config) as core:
        core.infer(simple_request(request_id="traced"))
    entries = json.loads(path.read_text())
    (head,) = [e for e in entries if "model_name" in e]
    assert head == {"id": head["id"], "model_name": "simple", "model_version": 1, "request_id": "traced"}
    stamps = [e["timestamps"][0] for e in entries if "timestamps" in e]
    assert [s["name"] for s in stamps] == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                                           "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    assert [s["ns"] for s in stamps] == sorted(s["ns"] for s in stamps)
    tensors = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in entries if "tensor" in e}
    assert tensors["TENSOR_QUEUE_INPUT", "INPUT0"] == {
        "name": "INPUT0", "data": ",".join(str(i) for i in range(16)), "shape": "1,16", "dtype": "INT32"}
    assert tensors["TENSOR_BACKEND_OUTPUT", "OUTPUT0"]["data"] == ",".join(str(i + 1) for i in range(16))
    assert tensors["TENSOR_BACKEND_OUTPUT", "OUTPUT1"]["data"] == ",".join(str(i - 1) for i in range(16))
    assert {e["id"] for e in entries} == {head["id"]}


def test_core_traces_only_what_the_settings_api_turns_on(demo_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    with core_on(demo_repo, trace_config=parse_trace_config([f"triton,file={path}"])) as core:
        core.infer(simple_request())
        assert not path.exists()
        core.update_trace_settings({"trace_level": ["TIMESTAMPS"], "trace_rate": ["2"]}, "simple")
        for _ in range(4):
            core.infer(simple_request())
        assert len({e["id"] for e in json.loads(path.read_text())}) == 2  # every 2nd request
        core.update_trace_settings({"trace_level": ["OFF"]}, "simple")
        core.infer(simple_request())
        assert len({e["id"] for e in json.loads(path.read_text())}) == 2
        with pytest.raises(InvalidArgument, match="Request for unknown model : nope"):
            core.trace_settings("nope")


# -- OpenTelemetry ---------------------------------------------------------------------------------
def test_spans_reach_an_otlp_receiver_with_the_callers_trace_id() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from fastoip.tracing.otel import OtelExporter

    with otlp_receiver() as receiver:
        exporter = OtelExporter(parse_trace_config([f"opentelemetry,url={receiver.url}", "mode=opentelemetry"]))
        assert exporter.is_valid_parent({"traceparent": TRACEPARENT})
        assert not exporter.is_valid_parent({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"})
        exporter.export(record(carrier={"traceparent": TRACEPARENT}))
        exporter.shutdown()
    by_name = receiver.spans_of("4bf92f3577b34da6a3ce929d0e0e4736")
    assert set(by_name) == {"InferRequest", "simple", "queue", "compute", "compute_input", "compute_infer",
                            "compute_output"}
    assert receiver.trace_ids() == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    assert by_name["InferRequest"].parent_span_id.hex() == "00f067aa0ba902b7"
    assert by_name["simple"].parent_span_id == by_name["InferRequest"].span_id
    assert by_name["queue"].parent_span_id == by_name["simple"].span_id
    assert by_name["compute"].parent_span_id == by_name["simple"].span_id
    assert by_name["compute_infer"].parent_span_id == by_name["compute"].span_id
    assert [e.name for e in by_name["simple"].events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e.name for e in by_name["compute"].events] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                           "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    attributes = {a.key: a.value for a in by_name["simple"].attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.model_version"].int_value == 1
    assert attributes["triton.request_id"].string_value == "req-7"
    assert by_name["queue"].end_time_unix_nano - by_name["queue"].start_time_unix_nano == 1000


def test_batched_tensor_traces_are_bounded_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: TENSORS traces with a huge log_frequency kept ~1.3 MB a request until the batch was full; a
    batch that holds PENDING_LIMIT_BYTES of tensor text is written early."""
    import numpy as np

    from fastoip.tracing import manager as manager_module

    monkeypatch.setattr(manager_module, "PENDING_LIMIT_BYTES", 100_000)
    traces = manager(tmp_path, "level=TENSORS", "rate=1", "triton,log-frequency=1000000")
    for _ in range(5):
        trace = traces.begin("simple", "1", "", None)
        assert trace is not None
        data = np.arange(10_000, dtype=np.int32)
        trace.record.tensors.append(("TENSOR_QUEUE_INPUT", "INPUT0", "INT32", data.shape, data))
        traces.finish(trace)
    assert (tmp_path / "trace.json.0").exists(), "the batch was kept in memory past the limit"
    traces.close()


def test_a_trace_records_at_most_its_tensor_budget_and_says_where_it_cut() -> None:
    """Issue 37: a 602 KB request's TENSORS trace kept 0.36 MB of text for its input and as much for its output;
    a trace now records TRACE_TENSOR_BYTES of tensor data in all, and an entry cut short says "truncated"."""
    from fastoip.tracing.record import TRACE_TENSOR_BYTES

    rec = TraceRecord(1, "m", "1", "")
    small = np.arange(4, dtype=np.int32)
    big = np.ones(TRACE_TENSOR_BYTES // 4 - 1000, dtype=np.float32)  # all but 4,000 bytes of the budget
    words = np.array([b"abcd"] * 2000, dtype=object)
    rec.tensors += [("TENSOR_QUEUE_INPUT", "SMALL", "INT32", small.shape, small),
                    ("TENSOR_QUEUE_INPUT", "BIG", "FP32", big.shape, big),
                    ("TENSOR_BACKEND_OUTPUT", "WORDS", "BYTES", words.shape, words),
                    ("TENSOR_BACKEND_OUTPUT", "AFTER", "INT32", small.shape, small)]
    tensors = {entry["tensor"]["name"]: entry["tensor"] for entry in rec.triton_entries()}
    assert tensors["SMALL"]["data"] == "0,1,2,3" and "truncated" not in tensors["SMALL"]
    assert len(tensors["BIG"]["data"].split(",")) == big.size and "truncated" not in tensors["BIG"]
    # 4,000 - 16 bytes left: 996 four-byte words, then nothing for the last tensor
    assert len(tensors["WORDS"]["data"].split(",")) == 996 and tensors["WORDS"]["truncated"] is True
    assert tensors["WORDS"]["shape"] == "2000"  # the shape stays the tensor's own
    assert tensors["AFTER"] == {"name": "AFTER", "data": "", "shape": "4", "dtype": "INT32", "truncated": True}
    text = sum(len(t["data"]) for t in tensors.values())
    assert text < 4 * TRACE_TENSOR_BYTES, text


def test_every_settings_batches_are_bounded_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: the batch bound was per setting, so each model's own trace setting could hold as much; what all
    settings batch is now one count."""
    from fastoip.tracing import manager as manager_module

    monkeypatch.setattr(manager_module, "PENDING_LIMIT_BYTES", 100_000)
    traces = manager(tmp_path, "level=TENSORS", "rate=1", "triton,log-frequency=1000000")
    models = [f"m{index}" for index in range(6)]
    for model in models:
        traces.update({"trace_rate": ["1"]}, model=model)  # a setting of its own
    data = np.arange(10_000, dtype=np.int32)  # ~49 KB of text a trace: under the bound alone
    most = 0
    for model in models:
        trace = traces.begin(model, "1", "", None)
        assert trace is not None
        trace.record.tensors.append(("TENSOR_QUEUE_INPUT", "INPUT0", "INT32", data.shape, data))
        traces.finish(trace)
        most = max(most, traces.held.bytes)
    assert most < 100_000 + 60_000, most  # the bound plus at most one trace
    assert list(tmp_path.glob("trace.json.*")), "six settings' batches were all kept in memory"
    traces.close()
    assert traces.held.bytes == 0


# -- ensembles: each step is a child trace of the ensemble request (Triton's parent_id) --------------------
def _ensemble_repository(root: Path) -> Path:
    from onnx import TensorProto

    from models import identity_model_bytes, write_model

    io = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    for name in ("first", "second"):
        write_model(root, name, identity_model_bytes(TensorProto.FLOAT, [4], name, batch=False),
                    config="max_batch_size: 0\n" + io)
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "first" model_version: -1 input_map { key: "INPUT0" value: "IN" }\n'
        '    output_map { key: "OUTPUT0" value: "mid" } },\n'
        '  { model_name: "second" model_version: -1 input_map { key: "INPUT0" value: "mid" }\n'
        '    output_map { key: "OUTPUT0" value: "OUT" } } ] }\n')
    return root


def _ensemble_request() -> Any:
    from fastoip.types import InferInput, InferRequest

    data = np.arange(4, dtype=np.float32)
    return InferRequest("pipeline", id="ens", inputs=[InferInput("IN", "FP32", (4,), data)])


def test_ensemble_steps_are_child_traces_in_the_trace_file(tmp_path: Path) -> None:
    root = _ensemble_repository(tmp_path / "repo")
    path = tmp_path / "trace.json"
    config = parse_trace_config([f"triton,file={path}", "level=TIMESTAMPS", "rate=1"])
    with core_on(root, trace_config=config) as core:
        core.infer(_ensemble_request())
        core.infer(_ensemble_request())
    entries = json.loads(path.read_text())
    heads = [e for e in entries if "model_name" in e]
    ensembles = [h for h in heads if h["model_name"] == "pipeline"]
    assert len(ensembles) == 2 and all("parent_id" not in h for h in ensembles)
    for ensemble in ensembles:
        steps = sorted((h for h in heads if h.get("parent_id") == ensemble["id"]), key=lambda h: h["model_name"])
        assert [(h["model_name"], h["request_id"]) for h in steps] == [("first", "ens"), ("second", "ens")]
        for step in steps:  # each child has its own timestamps, inside its parent's
            stamps = {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
                      if e["id"] == step["id"] and "timestamps" in e}
            parent = {e["timestamps"][0]["name"]: e["timestamps"][0]["ns"] for e in entries
                      if e["id"] == ensemble["id"] and "timestamps" in e}
            assert {"REQUEST_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"} <= stamps.keys()
            assert parent["REQUEST_START"] <= stamps["REQUEST_START"] <= stamps["REQUEST_END"]
    assert len(heads) == 6


def test_ensemble_step_spans_carry_the_parent_trace_id() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from fastoip.core import CallContext

    with otlp_receiver() as receiver, tempfile.TemporaryDirectory() as tmp:
        root = _ensemble_repository(Path(tmp))
        config = parse_trace_config([f"opentelemetry,url={receiver.url}", "mode=opentelemetry", "level=TIMESTAMPS",
                                     "rate=1", "opentelemetry,bsp_schedule_delay=10"])
        with core_on(root, trace_config=config) as core:
            core.infer(_ensemble_request(), CallContext(trace_headers={"traceparent": TRACEPARENT}))
        deadline = time.monotonic() + 20
        while len(receiver.spans_of("4bf92f3577b34da6a3ce929d0e0e4736")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    spans = receiver.spans_of("4bf92f3577b34da6a3ce929d0e0e4736")
    ids = {name: {a.key: a.value.int_value for a in spans[name].attributes if a.key.startswith("triton.trace")}
           for name in ("pipeline", "first", "second")}
    assert ids["pipeline"]["triton.trace_parent_id"] == 0
    assert ids["first"]["triton.trace_parent_id"] == ids["pipeline"]["triton.trace_id"]
    assert ids["second"]["triton.trace_parent_id"] == ids["pipeline"]["triton.trace_id"]
    # as Triton's child traces: each step's model span hangs under the ensemble's, with no InferRequest of its own
    assert spans["first"].parent_span_id == spans["pipeline"].span_id
    assert spans["second"].parent_span_id == spans["pipeline"].span_id
    with receiver.lock:
        roots = [span for span in receiver.spans if span.name == "InferRequest"]
    assert len(roots) == 1 and spans["pipeline"].parent_span_id == roots[0].span_id


def test_child_spans_wait_for_their_parent_and_orphans_go_out_alone() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from fastoip.tracing.otel import OtelExporter

    def stamped(trace_id: int, model: str, parent_id: int | None) -> TraceRecord:
        rec = TraceRecord(trace_id, model, "1", "", carrier={"traceparent": TRACEPARENT}, parent_id=parent_id)
        base = time.monotonic_ns()
        rec.stamp("REQUEST_START", base)
        rec.stamp("REQUEST_END", base + 1000)
        return rec

    with otlp_receiver() as receiver:
        exporter = OtelExporter(parse_trace_config([f"opentelemetry,url={receiver.url}", "mode=opentelemetry"]))
        exporter.export(stamped(2, "step", parent_id=1))  # a child finishes first: it waits for its parent
        exporter.export(stamped(1, "outer", parent_id=None))
        exporter.export(stamped(3, "late", parent_id=1))  # after its parent: hung under it all the same
        exporter.export(stamped(5, "orphan", parent_id=4))  # its parent never comes: out alone at shutdown
        exporter.shutdown()
    spans = receiver.spans_of("4bf92f3577b34da6a3ce929d0e0e4736")
    assert spans["step"].parent_span_id == spans["outer"].span_id
    assert spans["late"].parent_span_id == spans["outer"].span_id
    with receiver.lock:
        roots = [span for span in receiver.spans if span.name == "InferRequest"]
    assert len(roots) == 2  # the outer request's and the orphan's
    assert spans["orphan"].parent_span_id in {root.span_id for root in roots}


# -- OpenTelemetry's standard environment variables -------------------------------------------------------
OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME",
                  "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED")


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


OTEL_MODE = ["mode=opentelemetry", "level=TIMESTAMPS"]


def test_otel_environment_gives_the_defaults_and_trace_config_wins(otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    otel_env.setenv("OTEL_SERVICE_NAME", "scoring")
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=ml%20ops")
    otel_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    config = parse_trace_config(OTEL_MODE)
    assert config.otel_url == "http://collector:4318/v1/traces"
    assert config.otel_resource == {"service.name": "scoring", "deployment.environment": "prod", "team": "ml ops"}
    assert config.rate == 4
    # the command line wins over each
    config = parse_trace_config([*OTEL_MODE, "opentelemetry,url=other:4318/v1/traces", "rate=7",
                                 "opentelemetry,resource=service.name=mine"])
    assert (config.otel_url, config.rate) == ("http://other:4318/v1/traces", 7)
    assert config.otel_resource["service.name"] == "mine"
    # the traces endpoint is used as it is; Triton mode reads none of them
    otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector/custom")
    assert parse_trace_config(OTEL_MODE).otel_url == "https://collector/custom"
    triton = parse_trace_config(["level=TIMESTAMPS", "triton,file=/tmp/t.json"])
    assert (triton.rate, triton.otel_resource["service.name"]) == (1000, "fastoip")


@pytest.mark.parametrize(("sampler", "argument", "rate", "count"), [
    ("always_on", None, 1, -1), ("parentbased_always_off", None, 1000, 0), ("traceidratio", "0.1", 10, -1),
    ("traceidratio", "0", 1000, 0),
])
def test_otel_traces_sampler_sets_the_rate(otel_env: pytest.MonkeyPatch, sampler: str, argument: str | None,
                                           rate: int, count: int) -> None:
    otel_env.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is not None:
        otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    config = parse_trace_config(OTEL_MODE)
    assert (config.rate, config.count) == (rate, count)


def test_a_bad_otel_sampler_is_refused_by_name_and_sdk_disabled_turns_tracing_off(
        otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_TRACES_SAMPLER", "sometimes")
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER: expected one of always_on"):
        parse_trace_config(OTEL_MODE)
    otel_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", "2")
    with pytest.raises(ValueError, match=r"OTEL_TRACES_SAMPLER_ARG: expected a ratio in \[0, 1\], got '2'"):
        parse_trace_config(OTEL_MODE)
    otel_env.delenv("OTEL_TRACES_SAMPLER")
    otel_env.setenv("OTEL_SDK_DISABLED", "true")
    assert not parse_trace_config(OTEL_MODE).enabled


def test_spans_reach_the_receiver_otel_exporter_otlp_endpoint_names(otel_env: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from fastoip.tracing.otel import OtelExporter

    with otlp_receiver() as receiver:
        base = receiver.url.rsplit("/v1/traces", 1)[0]
        otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base)
        otel_env.setenv("OTEL_SERVICE_NAME", "scoring")
        exporter = OtelExporter(parse_trace_config(OTEL_MODE))
        exporter.export(record(carrier={"traceparent": TRACEPARENT}))
        exporter.shutdown()
    assert receiver.trace_ids() == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    names = {a.value.string_value for r in receiver.resources for a in r.attributes if a.key == "service.name"}
    assert names == {"scoring"}


def test_a_trace_path_is_bounded_in_files_and_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: log_frequency 1 wrote a new file per request without end (the trace API is open by default)."""
    from fastoip.tracing.triton_file import TraceFile

    trace = TraceFile(str(tmp_path / "trace.json"), max_files=3, max_bytes=10_000)
    for i in range(10):
        trace.write_indexed([{"id": i, "timestamps": []}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1", "trace.json.2"]
    assert trace.dropped == 7
    big = TraceFile(str(tmp_path / "big.json"), max_bytes=1_000)
    for i in range(100):
        big.append([{"id": i, "pad": "x" * 50}])
    assert (tmp_path / "big.json").stat().st_size <= 1_000
    assert big.dropped > 0

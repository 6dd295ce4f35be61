"""The wire contract: fastoip's generated proto modules vs tritonclient's.

(a) every message / enum / field / oneof / service method of
    fastoip._proto.{grpc_service,model_config}_pb2 matches tritonclient's
    service_pb2 / model_config_pb2 exactly;
(b) src/fastoip/_proto is what scripts/gen_proto.py generates from proto/;
(c) messages built with tritonclient round-trip through fastoip's classes
    byte-for-byte.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

# Import tritonclient first and fastoip second (and the reverse in a
# subprocess below): both must coexist in one process.
from tritonclient.grpc import model_config_pb2 as tc_mc
from tritonclient.grpc import service_pb2 as tc_svc
from tritonclient.grpc import service_pb2_grpc as tc_svc_grpc

from fastoip import _proto
from fastoip._proto import grpc_service_pb2 as fo_svc
from fastoip._proto import grpc_service_pb2_grpc as fo_svc_grpc
from fastoip._proto import health_pb2 as fo_health
from fastoip._proto import health_pb2_grpc as fo_health_grpc
from fastoip._proto import model_config_pb2 as fo_mc
from script_modules import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
GEN_SCRIPT = REPO_ROOT / "scripts" / "gen_proto.py"
PROTO_OUT = REPO_ROOT / "src" / "fastoip" / "_proto"

FDP = descriptor_pb2.FieldDescriptorProto


# ---------------------------------------------------------------------------
# (a) descriptor comparison
# ---------------------------------------------------------------------------


def _file_proto(module) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _field_summary(msg: descriptor_pb2.DescriptorProto, f) -> dict:
    oneof = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
    return {
        "name": f.name,
        "number": f.number,
        "type": FDP.Type.Name(f.type),
        "label": FDP.Label.Name(f.label),
        "type_name": f.type_name,
        "oneof": oneof,
        "proto3_optional": f.proto3_optional,
        "json_name": f.json_name,
        "default_value": f.default_value,
        "options": f.options.SerializeToString(deterministic=True),
    }


def _diff_enum(path, ours, theirs, out):
    ov = [(v.name, v.number) for v in ours.value]
    tv = [(v.name, v.number) for v in theirs.value]
    if ov != tv:
        out.append(f"{path}: enum values differ\n  ours:   {ov}\n  theirs: {tv}")
    if ours.options != theirs.options:
        out.append(f"{path}: enum options differ")


def _diff_named(path, kind, ours, theirs, differ, out):
    """Compare two lists of named descriptor protos, including their order."""
    on = [x.name for x in ours]
    tn = [x.name for x in theirs]
    if on != tn:
        out.append(f"{path or '<file>'}: {kind} differ (names/order)\n  ours:   {on}\n  theirs: {tn}")
    tmap = {x.name: x for x in theirs}
    for x in ours:
        if x.name in tmap:
            differ(f"{path}.{x.name}" if path else x.name, x, tmap[x.name], out)


def _diff_message(path, ours, theirs, out):
    of = [_field_summary(ours, f) for f in ours.field]
    tf = [_field_summary(theirs, f) for f in theirs.field]
    if [f["name"] for f in of] != [f["name"] for f in tf]:
        out.append(
            f"{path}: fields differ (names/declaration order)\n"
            f"  ours:   {[f['name'] for f in of]}\n  theirs: {[f['name'] for f in tf]}"
        )
    tfm = {f["name"]: f for f in tf}
    for f in of:
        t = tfm.get(f["name"])
        if t is None:
            continue
        for key in f:
            if f[key] != t[key]:
                out.append(f"{path}.{f['name']}: {key} differs: ours={f[key]!r} theirs={t[key]!r}")
    oo = [o.name for o in ours.oneof_decl]
    to = [o.name for o in theirs.oneof_decl]
    if oo != to:
        out.append(f"{path}: oneofs differ: ours={oo} theirs={to}")
    if ours.options.SerializeToString(deterministic=True) != theirs.options.SerializeToString(
        deterministic=True
    ):
        out.append(f"{path}: message options differ (e.g. map_entry)")
    for attr in ("extension", "extension_range", "reserved_range", "reserved_name"):
        if list(getattr(ours, attr)) != list(getattr(theirs, attr)):
            out.append(f"{path}: {attr} differs")
    _diff_named(path, "nested enums", ours.enum_type, theirs.enum_type, _diff_enum, out)
    _diff_named(path, "nested messages", ours.nested_type, theirs.nested_type, _diff_message, out)


def _diff_method(path, ours, theirs, out):
    for key in ("input_type", "output_type", "client_streaming", "server_streaming"):
        o, t = getattr(ours, key), getattr(theirs, key)
        if o != t:
            out.append(f"{path}: {key} differs: ours={o!r} theirs={t!r}")


def _diff_service(path, ours, theirs, out):
    _diff_named(path, "methods", ours.method, theirs.method, _diff_method, out)


def _diff_file(ours, theirs) -> list[str]:
    out: list[str] = []
    for key in ("package", "syntax"):
        if getattr(ours, key) != getattr(theirs, key):
            out.append(f"file {key}: ours={getattr(ours, key)!r} theirs={getattr(theirs, key)!r}")
    if list(ours.dependency) != list(theirs.dependency):
        out.append(f"file dependencies: ours={list(ours.dependency)} theirs={list(theirs.dependency)}")
    _diff_named("", "top-level enums", ours.enum_type, theirs.enum_type, _diff_enum, out)
    _diff_named("", "top-level messages", ours.message_type, theirs.message_type, _diff_message, out)
    _diff_named("", "services", ours.service, theirs.service, _diff_service, out)
    return out


@pytest.mark.parametrize(
    "ours, theirs",
    [(fo_mc, tc_mc), (fo_svc, tc_svc)],
    ids=["model_config", "grpc_service"],
)
def test_descriptors_match_tritonclient(ours, theirs):
    diffs = _diff_file(_file_proto(ours), _file_proto(theirs))
    assert not diffs, "proto schema differs from tritonclient's:\n" + "\n".join(diffs)
    # Belt and braces: the whole serialized FileDescriptorProto is identical.
    assert ours.DESCRIPTOR.serialized_pb == theirs.DESCRIPTOR.serialized_pb


def test_live_descriptors_match_tritonclient():
    """Same check through the runtime descriptor API (what code actually uses)."""

    def walk_msg(d):
        return (
            d.full_name,
            tuple(
                (
                    f.name,
                    f.number,
                    f.type,
                    f.is_repeated,
                    f.message_type.full_name if f.message_type else None,
                    f.enum_type.full_name if f.enum_type else None,
                    f.containing_oneof.name if f.containing_oneof else None,
                )
                for f in d.fields
            ),
            tuple(walk_enum(e) for e in d.enum_types),
            tuple(walk_msg(n) for n in d.nested_types),
        )

    def walk_enum(e):
        return (e.full_name, tuple((v.name, v.number) for v in e.values))

    def walk_file(fd):
        return (
            fd.package,
            tuple(walk_enum(e) for e in fd.enum_types_by_name.values()),
            tuple(walk_msg(m) for m in fd.message_types_by_name.values()),
            tuple(
                (
                    s.full_name,
                    tuple(
                        (
                            m.name,
                            m.input_type.full_name,
                            m.output_type.full_name,
                            m.client_streaming,
                            m.server_streaming,
                        )
                        for m in s.methods
                    ),
                )
                for s in fd.services_by_name.values()
            ),
        )

    assert walk_file(fo_mc.DESCRIPTOR) == walk_file(tc_mc.DESCRIPTOR)
    assert walk_file(fo_svc.DESCRIPTOR) == walk_file(tc_svc.DESCRIPTOR)


def test_service_has_triton_rpcs():
    svc = fo_svc.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert svc.full_name == "inference.GRPCInferenceService"
    names = [m.name for m in svc.methods]
    assert len(names) == 20
    expected = [m.name for m in tc_svc.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
    assert names == expected
    streaming = {m.name for m in svc.methods if m.client_streaming or m.server_streaming}
    assert streaming == {"ModelStreamInfer"}
    stream = svc.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert stream.output_type.full_name == "inference.ModelStreamInferResponse"
    # Generated gRPC glue exposes the same RPCs as tritonclient's.
    ours = {n for n in vars(fo_svc_grpc.GRPCInferenceServiceServicer) if not n.startswith("_")}
    theirs = {n for n in vars(tc_svc_grpc.GRPCInferenceServiceServicer) if not n.startswith("_")}
    assert ours == theirs == set(names)
    assert callable(fo_svc_grpc.add_GRPCInferenceServiceServicer_to_server)
    assert fo_svc_grpc.GRPCInferenceServiceStub is not None


def test_datatype_enum():
    assert fo_mc.TYPE_STRING == 13
    assert fo_mc.TYPE_BF16 == 14
    assert dict(fo_mc.DataType.items()) == dict(tc_mc.DataType.items())


def test_health_proto():
    fd = fo_health.DESCRIPTOR
    assert fd.package == "grpc.health.v1"
    req = fd.message_types_by_name["HealthCheckRequest"]
    assert [(f.name, f.number, f.type) for f in req.fields] == [
        ("service", 1, FDP.TYPE_STRING)
    ]
    resp = fd.message_types_by_name["HealthCheckResponse"]
    (status,) = resp.fields
    assert (status.name, status.number) == ("status", 1)
    assert status.enum_type.full_name == "grpc.health.v1.HealthCheckResponse.ServingStatus"
    assert [(v.name, v.number) for v in status.enum_type.values] == [
        ("UNKNOWN", 0),
        ("SERVING", 1),
        ("NOT_SERVING", 2),
        ("SERVICE_UNKNOWN", 3),
    ]
    svc = fd.services_by_name["Health"]
    assert svc.full_name == "grpc.health.v1.Health"
    assert [(m.name, m.client_streaming, m.server_streaming) for m in svc.methods] == [
        ("Check", False, False),
        ("Watch", False, True),
    ]
    assert callable(fo_health_grpc.add_HealthServicer_to_server)
    # If the official grpcio-health-checking package is around, match it too.
    try:
        from grpc_health.v1 import health_pb2 as official
    except ImportError:
        return
    assert fo_health.HealthCheckResponse.FromString(
        official.HealthCheckResponse(status=official.HealthCheckResponse.SERVING).SerializeToString()
    ).status == fo_health.HealthCheckResponse.SERVING


def test_private_descriptor_pool():
    from google.protobuf import descriptor_pool

    for mod in (fo_mc, fo_svc, fo_health):
        assert mod.DESCRIPTOR.pool is _proto.POOL
    assert _proto.POOL is not descriptor_pool.Default()
    assert fo_svc.ModelInferRequest is not tc_svc.ModelInferRequest
    assert fo_svc.ModelInferRequest.__module__ == "fastoip._proto.grpc_service_pb2"


@pytest.mark.parametrize("first", ["fastoip", "tritonclient"])
def test_coexist_in_one_process_either_import_order(first):
    a = "import fastoip._proto.grpc_service_pb2, fastoip._proto.grpc_service_pb2_grpc, fastoip._proto.health_pb2_grpc"
    b = "import tritonclient.grpc, tritonclient.grpc.service_pb2, tritonclient.grpc.model_config_pb2"
    code = "\n".join([a, b] if first == "fastoip" else [b, a]) + "\nprint('ok')"
    env = dict(os.environ)
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


# ---------------------------------------------------------------------------
# (b) generated code is up to date
# ---------------------------------------------------------------------------


def _load_gen_script():
    return load_script(GEN_SCRIPT, "_fastoip_gen_proto")


_VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version: .*|GRPC_GENERATED_VERSION = .*)$", re.MULTILINE
)


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    gen = _load_gen_script()
    gen.generate(tmp_path)

    expected = sorted(gen.expected_files())
    present = sorted(p.name for p in PROTO_OUT.iterdir() if p.is_file())
    assert present == expected, "stray or missing files in src/fastoip/_proto"
    assert sorted(p.name for p in tmp_path.iterdir()) == expected

    # Version-independent part: the schema embedded in every module is the
    # schema compiled from proto/ right now.
    for name in expected:
        fresh = (tmp_path / name).read_text(encoding="utf-8")
        committed = (PROTO_OUT / name).read_text(encoding="utf-8")
        assert _VERSION_LINES.sub("", fresh) == _VERSION_LINES.sub("", committed), (
            f"src/fastoip/_proto/{name} is stale: run `python scripts/gen_proto.py`"
        )

    # Byte-for-byte, when the installed grpcio-tools is the one that produced
    # the committed files (otherwise only the version stamps differ).
    stale = []
    for name in expected:
        fresh = (tmp_path / name).read_bytes()
        committed = (PROTO_OUT / name).read_bytes()
        if fresh != committed:
            stale.append(name)
    if stale:
        fresh_v = _VERSION_LINES.findall((tmp_path / "grpc_service_pb2_grpc.py").read_text())
        fresh_v += _VERSION_LINES.findall((tmp_path / "grpc_service_pb2.py").read_text())
        committed_v = _VERSION_LINES.findall((PROTO_OUT / "grpc_service_pb2_grpc.py").read_text())
        committed_v += _VERSION_LINES.findall((PROTO_OUT / "grpc_service_pb2.py").read_text())
        if fresh_v != committed_v:
            pytest.skip(
                f"installed grpcio-tools stamps {fresh_v}, committed files {committed_v}; "
                "content is up to date, byte comparison needs the same grpcio-tools"
            )
    assert not stale, f"stale generated files: {stale}; run `python scripts/gen_proto.py`"


# ---------------------------------------------------------------------------
# (c) byte-level round trips with tritonclient's classes
# ---------------------------------------------------------------------------


def _triton_infer_request() -> tc_svc.ModelInferRequest:
    req = tc_svc.ModelInferRequest(model_name="resnet", model_version="3", id="req-42")
    req.parameters["priority"].uint64_param = 2**63 + 5
    req.parameters["timeout"].int64_param = -7
    req.parameters["sequence_start"].bool_param = True
    req.parameters["note"].string_param = "héllo"
    req.parameters["scale"].double_param = 0.125

    a = req.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 3])
    a.parameters["shared_memory_region"].string_param = "r0"
    req.inputs.add(name="INPUT1", datatype="BYTES", shape=[2])
    req.inputs.add(name="INPUT2", datatype="INT64", shape=[1, 2])
    req.raw_input_contents.extend(
        [
            bytes(range(24)),  # 6 x FP32
            b"\x03\x00\x00\x00abc\x00\x00\x00\x00",  # two length-prefixed BYTES
            (-1).to_bytes(8, "little", signed=True) * 2,  # 2 x INT64
        ]
    )

    d = req.inputs.add(name="TYPED", datatype="FP64", shape=[3])
    d.contents.fp64_contents.extend([1.5, -2.0, 3.25])
    d.contents.bool_contents.extend([True, False])
    d.contents.int_contents.extend([-1, 2])
    d.contents.int64_contents.extend([-(2**40)])
    d.contents.uint_contents.extend([2**32 - 1])
    d.contents.uint64_contents.extend([2**64 - 1])
    d.contents.fp32_contents.extend([0.5])
    d.contents.bytes_contents.extend([b"", b"\x00\xff"])

    out = req.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 3
    out.parameters["binary_data"].bool_param = True
    req.outputs.add(name="OUTPUT1")
    return req


def test_model_infer_request_round_trip():
    theirs = _triton_infer_request()
    wire = theirs.SerializeToString(deterministic=True)

    ours = fo_svc.ModelInferRequest.FromString(wire)
    assert ours.model_name == "resnet"
    assert ours.parameters["priority"].uint64_param == 2**63 + 5
    assert ours.parameters["note"].string_param == "héllo"
    assert ours.parameters["scale"].WhichOneof("parameter_choice") == "double_param"
    assert [t.name for t in ours.inputs] == ["INPUT0", "INPUT1", "INPUT2", "TYPED"]
    assert list(ours.inputs[0].shape) == [2, 3]
    assert ours.raw_input_contents[0] == bytes(range(24))
    assert list(ours.inputs[3].contents.uint64_contents) == [2**64 - 1]
    assert ours.outputs[0].parameters["classification"].int64_param == 3
    # Nothing landed in unknown fields (every field was understood): dropping
    # unknown fields, recursively, changes nothing.
    known_only = fo_svc.ModelInferRequest()
    known_only.CopyFrom(ours)
    known_only.DiscardUnknownFields()
    assert known_only.SerializeToString(deterministic=True) == wire

    back = ours.SerializeToString(deterministic=True)
    assert back == wire
    assert tc_svc.ModelInferRequest.FromString(back) == theirs


def test_other_messages_round_trip():
    cfg = tc_mc.ModelConfig(name="m", backend="onnxruntime", max_batch_size=8)
    cfg.input.add(name="x", data_type=tc_mc.TYPE_BF16, dims=[-1, 4], optional=True)
    cfg.output.add(name="y", data_type=tc_mc.TYPE_STRING, dims=[1], label_filename="l.txt")
    cfg.dynamic_batching.preferred_batch_size.extend([4, 8])
    cfg.dynamic_batching.priority_queue_policy[1].max_queue_size = 10
    cfg.instance_group.add(kind=tc_mc.ModelInstanceGroup.KIND_CPU, count=2)
    cfg.parameters["k"].string_value = "v"
    cfg.model_transaction_policy.decoupled = True
    cfg.optimization.cuda.graph_spec.add(batch_size=2).input["x"].dim.extend([2, 4])
    cfg.version_policy.specific.versions.extend([1, 3])

    resp = tc_svc.ModelStreamInferResponse(error_message="")
    out = resp.infer_response.outputs.add(name="y", datatype="BYTES", shape=[1])
    out.parameters["binary_data_size"].int64_param = 7
    resp.infer_response.raw_output_contents.append(b"\x03\x00\x00\x00abc")

    stats = tc_svc.ModelStatisticsResponse()
    ms = stats.model_stats.add(name="m", version="1", inference_count=5)
    ms.inference_stats.success.count = 5
    ms.inference_stats.cache_miss.ns = 99
    ms.batch_stats.add(batch_size=4).compute_infer.ns = 12
    ms.memory_usage.add(type="GPU", id=0, byte_size=1024)
    ms.response_stats["0"].empty_response.count = 1

    pairs = [
        (cfg, fo_mc.ModelConfig, tc_mc.ModelConfig),
        (tc_svc.ModelConfigResponse(config=cfg), fo_svc.ModelConfigResponse, tc_svc.ModelConfigResponse),
        (resp, fo_svc.ModelStreamInferResponse, tc_svc.ModelStreamInferResponse),
        (stats, fo_svc.ModelStatisticsResponse, tc_svc.ModelStatisticsResponse),
    ]
    for msg, ours_cls, theirs_cls in pairs:
        wire = msg.SerializeToString(deterministic=True)
        ours = ours_cls.FromString(wire)
        assert ours.SerializeToString(deterministic=True) == wire, ours_cls.__name__
        ours.DiscardUnknownFields()
        assert ours.SerializeToString(deterministic=True) == wire, ours_cls.__name__
        assert theirs_cls.FromString(ours.SerializeToString()) == msg

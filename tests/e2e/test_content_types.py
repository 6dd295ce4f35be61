"""Content types (MLServer's codecs): the codecs themselves, then end to end through Python models.

The codec tests call :mod:`fastoip.content_types` directly (pure functions on
numpy arrays).  The end-to-end tests start one real fastoip with a Python
model per content type and call it with tritonclient over gRPC and HTTP, with
content types at request level and input level, set by the request or as
defaults in the model's metadata (``model-settings.json``), the request
overriding the metadata.
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastoip import content_types as ct
from fastoip.errors import InternalError, InvalidArgument, Unsupported
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)


def tensor(name: str, data: Any, datatype: str | None = None, content_type: str | None = None) -> ct.Tensor:
    if datatype == "BYTES" or (datatype is None and isinstance(data, list) and isinstance(data[0], bytes)):
        array = np.empty(len(data), dtype=object)
        array[:] = data
        datatype = "BYTES"
    else:
        array = np.asarray(data)
        datatype = datatype or {"int32": "INT32", "int64": "INT64", "float32": "FP32", "float64": "FP64"}[str(array.dtype)]
    return ct.Tensor(name, datatype, array.shape, array, {"content_type": content_type} if content_type else {})


NO_DEFAULTS = ct.ModelContentTypes()


# -- codecs, in process -----------------------------------------------------------------
def test_builtin_names() -> None:
    assert {"np", "pd", "str", "base64", "datetime"} <= set(ct.content_type_names())


def test_no_content_type_gives_arrays_by_name() -> None:
    a = tensor("a", np.arange(6, dtype=np.int32).reshape(2, 3))
    decoded = ct.decode_request([a], None, NO_DEFAULTS)
    assert list(decoded) == ["a"] and decoded["a"] is a.data


def test_str_input_and_request_level() -> None:
    t = tensor("text", [b"hello", "w\u00f6rld".encode()], "BYTES", "str")
    assert ct.decode_request([t], None, NO_DEFAULTS) == {"text": ["hello", "w\u00f6rld"]}
    plain = tensor("text", [b"a", b"b"], "BYTES")
    other = tensor("n", [1, 2], "INT32")
    # request level: the FIRST input decoded by that type
    assert ct.decode_request([plain, other], "str", NO_DEFAULTS) == ["a", "b"]


def test_str_errors_name_the_input() -> None:
    with pytest.raises(InvalidArgument, match="input 'n' does not fit content type 'str'.*needs BYTES"):
        ct.decode_request([tensor("n", [1, 2], "INT32", "str")], None, NO_DEFAULTS)
    with pytest.raises(InvalidArgument, match="input 'x'.*element 1 is not valid UTF-8"):
        ct.decode_request([tensor("x", [b"ok", b"\xff\xfe"], "BYTES", "str")], None, NO_DEFAULTS)
    with pytest.raises(InvalidArgument, match="request.*content type 'str'.*input 'n'"):
        ct.decode_request([tensor("n", [1], "INT32")], "str", NO_DEFAULTS)


def test_base64_and_datetime() -> None:
    raw = [b"\x00\x01binary", b"Python is fun"]
    t = tensor("blob", [base64.b64encode(r) for r in raw], "BYTES", "base64")
    assert ct.decode_request([t], None, NO_DEFAULTS)["blob"] == raw
    with pytest.raises(InvalidArgument, match="input 'blob'.*not valid base64"):
        ct.decode_request([tensor("blob", [b"***"], "BYTES", "base64")], None, NO_DEFAULTS)
    d = tensor("when", [b"2022-01-11T11:00:00", b"2024-02-29T23:59:59Z"], "BYTES", "datetime")
    assert ct.decode_request([d], None, NO_DEFAULTS)["when"] == [
        datetime.datetime(2022, 1, 11, 11, 0, 0),
        datetime.datetime(2024, 2, 29, 23, 59, 59, tzinfo=datetime.timezone.utc),
    ]
    with pytest.raises(InvalidArgument, match="input 'when'.*not an ISO 8601"):
        ct.decode_request([tensor("when", [b"yesterday"], "BYTES", "datetime")], None, NO_DEFAULTS)


def test_np_decodes_bf16_as_float32() -> None:
    bits = np.array([0x3F80, 0x4000], dtype="<u2")  # 1.0, 2.0
    t = ct.Tensor("x", "BF16", (2,), bits, {"content_type": "np"})
    np.testing.assert_array_equal(ct.decode_request([t], None, NO_DEFAULTS)["x"], [1.0, 2.0])


def test_pd_stacks_with_input_content_types_and_keeps_multidim_cells() -> None:
    names = tensor("First Name", [b"Joanne", b"Michael"], "BYTES", "str")
    age = tensor("Age", np.array([34, 22], dtype=np.int32))
    emb = tensor("emb", np.arange(4, dtype=np.float32).reshape(2, 2))
    col = tensor("col", np.array([[1.5], [2.5]]))
    raw = tensor("raw", [b"x", b"y"], "BYTES")
    frame = ct.decode_request([names, age, emb, col, raw], "pd", NO_DEFAULTS)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["First Name", "Age", "emb", "col", "raw"]
    assert frame["First Name"].tolist() == ["Joanne", "Michael"]
    assert frame["Age"].dtype == np.int32 and frame["Age"].tolist() == [34, 22]
    assert [list(cell) for cell in frame["emb"]] == [[0.0, 1.0], [2.0, 3.0]]
    assert frame["col"].tolist() == [1.5, 2.5]
    assert frame["raw"].tolist() == [b"x", b"y"]


def test_pd_errors() -> None:
    with pytest.raises(InvalidArgument, match="input 'b' has 3 rows but input 'a' has 2"):
        ct.decode_request([tensor("a", [1, 2], "INT32"), tensor("b", [1, 2, 3], "INT32")], "pd", NO_DEFAULTS)
    with pytest.raises(InvalidArgument, match="input 'a': content type 'pd' works on whole requests only"):
        ct.decode_request([tensor("a", [1, 2], "INT32", "pd")], None, NO_DEFAULTS)


def test_metadata_defaults_and_request_override() -> None:
    defaults = ct.ModelContentTypes("pd", {"name": "str"}, {})
    name, age = tensor("name", [b"a", b"b"], "BYTES"), tensor("age", [1, 2], "INT32")
    assert isinstance(ct.decode_request([name, age], None, defaults), pd.DataFrame)
    # the request's own content type wins over the model's default, at both levels
    assert ct.decode_request([name, age], "np", defaults) == ["a", "b"]
    name_b64 = tensor("name", [base64.b64encode(b"a")], "BYTES", "base64")
    assert ct.decode_request([name_b64], "str", defaults) == [b"a"]


def test_unknown_content_type() -> None:
    with pytest.raises(InvalidArgument, match="unknown content type 'nope'.*known: .*np"):
        ct.decode_request([tensor("a", [1], "INT32", "nope")], None, NO_DEFAULTS)


def test_encoding_by_payload() -> None:
    out = ct.encode_output("o", np.array([[1.0, 2.0]], dtype=np.float32), None)
    assert (out.datatype, out.shape, out.parameters) == ("FP32", (1, 2), {"content_type": "np"})
    out = ct.encode_output("o", ["a", "\u00e9"], None)
    assert out.datatype == "BYTES" and out.data.tolist() == [b"a", "\u00e9".encode()]
    assert out.parameters == {"content_type": "str"}
    out = ct.encode_output("o", [datetime.datetime(2022, 1, 11, 11)], None)
    assert out.data.tolist() == [b"2022-01-11T11:00:00"] and out.parameters == {"content_type": "datetime"}
    out = ct.encode_output("o", [b"\x00raw"], None)
    assert out.datatype == "BYTES" and out.data.tolist() == [b"\x00raw"]
    out = ct.encode_output("o", [b"\x00raw"], "base64")
    assert out.data.tolist() == [base64.b64encode(b"\x00raw")] and out.parameters == {"content_type": "base64"}
    with pytest.raises(InternalError, match="output 'o': no content type can encode a object"):
        ct.encode_output("o", object(), None)
    with pytest.raises(InvalidArgument, match="output 'o' does not fit content type 'datetime'"):
        ct.encode_output("o", [1, 2], "datetime", from_request=True)


def test_dataframe_splits_into_columns() -> None:
    frame = pd.DataFrame(
        {
            "s": ["x", "y"],
            "i": np.array([1, 2], dtype=np.int64),
            "f": [0.5, 1.5],
            "b": [True, False],
            "d": pd.to_datetime(["2022-01-11 11:00", "2023-05-06 00:00"]),
            "arr": [np.array([1, 2]), np.array([3, 4])],
        }
    )
    parts, name = ct.split_response(frame)  # type: ignore[misc]
    assert name == "pd"
    encoded = {k: ct.encode_output(k, v, None) for k, v in parts.items()}
    assert {k: (v.datatype, v.parameters.get("content_type")) for k, v in encoded.items()} == {
        "s": ("BYTES", "str"),
        "i": ("INT64", "np"),
        "f": ("FP64", "np"),
        "b": ("BOOL", "np"),
        "d": ("BYTES", "datetime"),
        "arr": ("INT64", "np"),
    }
    assert encoded["d"].data.tolist() == [b"2022-01-11T11:00:00", b"2023-05-06T00:00:00"]
    assert encoded["arr"].shape == (2, 2)
    with pytest.raises(InternalError, match="output 'n'.*missing"):
        ct.encode_output("n", pd.Series([1.0, None], dtype="Float64"), None)


class Upper(ct.ContentType):
    name = "upper-test"

    def decode(self, t: ct.Tensor) -> list[str]:
        return [b.decode().upper() for b in t.data.reshape(-1)]

    def encode(self, name: str, value: Any) -> ct.Tensor:
        data = np.array([v.lower().encode() for v in value], dtype=object)
        return ct.Tensor(name, "BYTES", data.shape, data, {"content_type": self.name})


def test_registry_forms() -> None:
    try:
        ct.register_content_type(Upper)
        assert isinstance(ct.get_content_type("upper-test"), Upper)
        assert ct.decode_request([tensor("a", [b"x"], "BYTES", "upper-test")], None, NO_DEFAULTS) == {"a": ["X"]}
        with pytest.raises(ValueError, match="already registered"):
            ct.register_content_type("upper-test", ct.StringContentType())
        with pytest.raises(ValueError, match="already registered"):
            ct.register_content_type("str", Upper())
        ct.register_content_type("upper-test", ct.StringContentType(), replace=True)
        assert isinstance(ct.get_content_type("upper-test"), ct.StringContentType)

        @ct.register_content_type("upper-test2")
        class Decorated(Upper):
            pass

        assert isinstance(ct.get_content_type("upper-test2"), Decorated)
        with pytest.raises(TypeError, match="must subclass fastoip.ContentType"):
            ct.register_content_type("bad", object())
    finally:
        ct.unregister_content_type("upper-test")
        ct.unregister_content_type("upper-test2")
    assert ct.get_content_type("upper-test") is None
    assert ct.get_content_type("str") is not None  # built-ins stay


class SplitsPairs(ct.ContentType):
    """Claims every str (before the built-ins) and splits a ("pair", a, b) tuple into two outputs."""

    name = "pairs-test"

    def can_encode(self, value: Any) -> bool:
        return isinstance(value, str)

    def encode(self, name: str, value: Any) -> ct.Tensor:
        data = np.array([b"pair:" + value.encode()], dtype=object)
        return ct.Tensor(name, "BYTES", data.shape, data, {"content_type": self.name})

    def split_response(self, value: Any) -> dict[str, Any] | None:
        if isinstance(value, tuple) and value[:1] == ("pair",):
            return {"a": value[1], "b": value[2]}
        return None


def test_payload_inference_follows_the_registry_as_it_changes() -> None:
    # the codec order is kept between changes (not rebuilt per output): a codec registered after inference ran
    # is tried first from then on, and forgotten when unregistered
    assert ct.encode_output("t", "x", None).parameters["content_type"] == "str"
    assert ct.split_response(("pair", 1, 2)) is None
    try:
        ct.register_content_type(SplitsPairs)
        tensor = ct.encode_output("t", "x", None)
        assert tensor.parameters["content_type"] == "pairs-test" and tensor.data.tolist() == [b"pair:x"]
        assert ct.split_response(("pair", 1, 2)) == ({"a": 1, "b": 2}, "pairs-test")
    finally:
        ct.unregister_content_type("pairs-test")
    assert ct.encode_output("t", "x", None).parameters["content_type"] == "str"
    assert ct.split_response(("pair", 1, 2)) is None
    # a list of str is text, without numpy being asked to make an array of it
    assert ct.encode_output("t", ["a", "b"], None).parameters["content_type"] == "str"


def test_without_pandas_pd_says_how_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["pandas"] = None  # as if pandas were not installed
        import numpy as np
        from fastoip import content_types as ct
        from fastoip.errors import Unsupported
        t = ct.Tensor("a", "INT32", (1,), np.array([1], dtype=np.int32))
        assert ct.decode_request([t], None, ct.ModelContentTypes()) == {"a": t.data}  # np still works
        try:
            ct.decode_request([t], "pd", ct.ModelContentTypes())
        except Unsupported as exc:
            print(exc)
        """
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "pip install fastoip[pandas]" in out.stdout
    assert Unsupported.grpc_code == "UNIMPLEMENTED"


# -- end to end ------------------------------------------------------------------------------
DESCRIBE = '''
import datetime, json, sys
import numpy as np
import fastoip


def cell(v):
    if isinstance(v, bytes):
        return {"bytes": v.decode("latin-1")}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, datetime.datetime):
        return {"datetime": v.isoformat()}
    if isinstance(v, (np.ndarray, list)):
        return {"array": np.asarray(v).tolist()}
    if isinstance(v, (bool, np.bool_)):
        return {"bool": bool(v)}
    if isinstance(v, (int, np.integer)):
        return {"int": int(v)}
    if isinstance(v, (float, np.floating)):
        return {"float": float(v)}
    return {type(v).__name__: repr(v)}


def describe(value):
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        return {"type": "DataFrame", "columns": [str(c) for c in value.columns],
                "dtypes": [str(t) for t in value.dtypes],
                "rows": [[cell(c) for c in row] for row in value.itertuples(index=False)]}
    if isinstance(value, dict):
        return {"type": "dict", "items": {k: describe(v) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "dtype": str(value.dtype), "shape": list(value.shape),
                "values": [cell(v) for v in value.reshape(-1).tolist()]}
    if isinstance(value, list):
        return {"type": "list", "values": [cell(v) for v in value]}
    return {"type": type(value).__name__}


class Describe(fastoip.Model):
    """Answers with a JSON description of what predict received."""

    def predict(self, inputs, parameters):
        return {"DESC": [json.dumps({"inputs": describe(inputs), "parameters": parameters})]}
'''

GREETER = '''
import fastoip


class Greeter(fastoip.Model):
    """pd in, DataFrame out: one output per column."""

    def predict(self, frame):
        return frame.assign(greeting="Hello " + frame["First Name"], next_age=frame["Age"] + 1)[
            ["greeting", "next_age"]
        ]
'''

UPPER = '''
import fastoip


class Upper(fastoip.Model):
    async def predict(self, texts, parameters):
        return [t.upper() for t in texts]
'''

BLOBS = '''
import numpy as np
import fastoip


class Blobs(fastoip.Model):
    def predict(self, inputs, parameters):
        blobs = inputs["DATA"]
        return {"LENGTH": np.array([len(b) for b in blobs], dtype=np.int64), "ECHO": [b[::-1] for b in blobs]}
'''

DATES = '''
import datetime
import fastoip


class Tomorrow(fastoip.Model):
    def predict(self, inputs, parameters):
        return {"NEXT": [d + datetime.timedelta(days=1) for d in inputs["WHEN"]]}
'''

CUSTOM = '''
import json
import numpy as np
import fastoip


@fastoip.register_content_type("json")
class JsonContentType(fastoip.ContentType):
    """Each BYTES element is one JSON document."""

    def decode(self, tensor):
        return [json.loads(b) for b in tensor.data.reshape(-1)]

    def encode(self, name, value):
        data = np.empty(len(value), dtype=object)
        data[:] = [json.dumps(v, sort_keys=True).encode() for v in value]
        return fastoip.Tensor(name, "BYTES", data.shape, data, {"content_type": "json"})


class Merge(fastoip.Model):
    def predict(self, inputs, parameters):
        return {"MERGED": [dict(doc, seen=True) for doc in inputs["DOCS"]]}
'''


def settings(name: str, inputs: list, outputs: list, content_type: str | None = None) -> str:
    doc: dict = {"name": name, "implementation": None, "inputs": inputs, "outputs": outputs}
    del doc["implementation"]
    if content_type:
        doc["parameters"] = {"content_type": content_type}
    return json.dumps(doc)


def io(name: str, datatype: str, shape: list, content_type: str | None = None) -> dict:
    entry: dict = {"name": name, "datatype": datatype, "shape": shape}
    if content_type:
        entry["parameters"] = {"content_type": content_type}
    return entry


def write(root: Path, name: str, source: str, *, settings_json: str | None = None, config: str | None = None) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    if settings_json is not None:
        (root / name / "model-settings.json").write_text(settings_json)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


# One server on the default gRPC frontend, not one per frontend: content types are decoded and encoded by the Core, and
# tests/e2e/test_grpc_differential.py keeps the two frontends' answers byte-identical.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("content-type-repo")
    # Metadata defaults: the whole request as a DataFrame, input A as str.
    write(root, "describe", DESCRIBE, settings_json=settings(
        "describe",
        [io("A", "BYTES", [-1], "str"), io("B", "INT32", [-1]), io("C", "FP32", [-1, 2])],
        [io("DESC", "BYTES", [1])],
        content_type="pd",
    ))
    # The same code with no defaults at all (config.pbtxt).
    write(root, "describe_plain", DESCRIBE, config=textwrap.dedent("""
        backend: "python"
        input [ { name: "A" data_type: TYPE_STRING dims: [ -1 ] },
                { name: "B" data_type: TYPE_INT32 dims: [ -1 ] },
                { name: "C" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
        output [ { name: "DESC" data_type: TYPE_STRING dims: [ 1 ] } ]
    """))
    write(root, "greeter", GREETER, settings_json=settings(
        "greeter",
        [io("First Name", "BYTES", [-1]), io("Age", "INT32", [-1])],
        [io("greeting", "BYTES", [-1]), io("next_age", "INT32", [-1])],
    ))
    write(root, "upper", UPPER, settings_json=settings(
        "upper", [io("TEXT", "BYTES", [-1])], [io("UPPER", "BYTES", [-1])], content_type="str"
    ))
    write(root, "blobs", BLOBS, settings_json=settings(
        "blobs",
        [io("DATA", "BYTES", [-1], "base64")],
        [io("LENGTH", "INT64", [-1]), io("ECHO", "BYTES", [-1], "base64")],
    ))
    write(root, "dates", DATES, settings_json=settings(
        "dates", [io("WHEN", "BYTES", [-1], "datetime")], [io("NEXT", "BYTES", [-1])]
    ))
    write(root, "custom", CUSTOM, settings_json=settings(
        "custom", [io("DOCS", "BYTES", [-1], "json")], [io("MERGED", "BYTES", [-1], "json")]
    ))
    with ServerProcess(root, http=True) as proc:
        yield proc


class Client:
    """tritonclient.grpc or tritonclient.http behind one small interface."""

    def __init__(self, protocol: str, server: ServerProcess) -> None:
        self.protocol = protocol
        self.lib: Any = grpcclient if protocol == "grpc" else httpclient
        self.client = self.lib.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)

    def input(self, name: str, data: Any, datatype: str, content_type: str | None = None) -> Any:
        array = np.array(data, dtype=object) if datatype == "BYTES" else np.asarray(data)
        inp = self.lib.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        if content_type:
            if self.protocol == "grpc":
                inp._input.parameters["content_type"].string_param = content_type
            else:
                inp._parameters["content_type"] = content_type
        return inp

    def output(self, name: str, content_type: str) -> Any:
        out = self.lib.InferRequestedOutput(name)
        if self.protocol == "grpc":
            out._output.parameters["content_type"].string_param = content_type
        else:
            out._parameters["content_type"] = content_type
        return out

    def infer(self, model: str, inputs: list, parameters: dict | None = None, outputs: list | None = None):  # type: ignore[no-untyped-def]
        result = self.client.infer(model, inputs, parameters=parameters, outputs=outputs)
        response = result.get_response()
        if self.protocol == "grpc":
            out_params = {o.name: {k: v.string_param for k, v in o.parameters.items()} for o in response.outputs}
            params = {k: v.string_param for k, v in response.parameters.items()}
            names = [o.name for o in response.outputs]
        else:
            out_params = {o["name"]: {k: v for k, v in (o.get("parameters") or {}).items() if k != "binary_data_size"}
                          for o in response["outputs"]}
            params = response.get("parameters") or {}
            names = [o["name"] for o in response["outputs"]]
        return {n: result.as_numpy(n) for n in names}, out_params, params

    def fails(self, model: str, inputs: list, parameters: dict | None = None) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as info:
            self.client.infer(model, inputs, parameters=parameters)
        expected = "StatusCode.INVALID_ARGUMENT" if self.protocol == "grpc" else "400"
        assert info.value.status() == expected, info.value
        return info.value


@pytest.fixture(scope="module", params=["grpc", "http"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Client:
    return Client(request.param, server)


def describe_inputs(
    client: Client, model: str, a_ct: str | None = None, parameters: dict | None = None, a: list | None = None
) -> dict:
    inputs = [
        client.input("A", a or [b"x", b"y"], "BYTES", a_ct),
        client.input("B", np.array([1, 2], dtype=np.int32), "INT32"),
        client.input("C", np.array([[1, 2], [3, 4]], dtype=np.float32), "FP32"),
    ]
    outputs, out_params, _ = client.infer(model, inputs, parameters)
    assert out_params["DESC"] == {"content_type": "str"}
    return json.loads(outputs["DESC"][0])


def test_metadata_defaults_decode_as_dataframe(client: Client) -> None:
    got = describe_inputs(client, "describe")["inputs"]
    assert got["type"] == "DataFrame" and got["columns"] == ["A", "B", "C"]
    assert got["rows"] == [
        [{"str": "x"}, {"int": 1}, {"array": [1.0, 2.0]}],
        [{"str": "y"}, {"int": 2}, {"array": [3.0, 4.0]}],
    ]
    assert got["dtypes"][1] == "int32"


def test_request_overrides_metadata(client: Client) -> None:
    # request-level np beats the model's pd; A keeps its str default, so the first input is a list of str
    got = describe_inputs(client, "describe", parameters={"content_type": "np"})
    assert got["inputs"] == {"type": "list", "values": [{"str": "x"}, {"str": "y"}]}
    assert got["parameters"]["content_type"] == "np"
    # input-level base64 from the request beats the model's str default for A, inside pd
    a = [base64.b64encode(b"\x00\x01"), base64.b64encode(b"hi")]
    got = describe_inputs(client, "describe", a_ct="base64", a=a)["inputs"]
    assert got["type"] == "DataFrame"
    assert [row[0] for row in got["rows"]] == [{"bytes": "\x00\x01"}, {"bytes": "hi"}]


def test_no_content_types_gives_numpy_arrays(client: Client) -> None:
    got = describe_inputs(client, "describe_plain")["inputs"]
    assert got["type"] == "dict"
    assert got["items"]["A"] == {"type": "ndarray", "dtype": "object", "shape": [2],
                                 "values": [{"bytes": "x"}, {"bytes": "y"}]}
    assert got["items"]["C"]["shape"] == [2, 2] and got["items"]["C"]["dtype"] == "float32"


def test_request_level_content_types_from_the_request(client: Client) -> None:
    got = describe_inputs(client, "describe_plain", parameters={"content_type": "str"})["inputs"]
    assert got == {"type": "list", "values": [{"str": "x"}, {"str": "y"}]}
    got = describe_inputs(client, "describe_plain", parameters={"content_type": "np"})["inputs"]
    assert got["type"] == "ndarray" and got["dtype"] == "object"
    got = describe_inputs(client, "describe_plain", a_ct="str", parameters={"content_type": "pd"})["inputs"]
    assert got["type"] == "DataFrame" and got["rows"][0][0] == {"str": "x"}
    got = describe_inputs(client, "describe_plain", a_ct="str")["inputs"]
    assert got["items"]["A"] == {"type": "list", "values": [{"str": "x"}, {"str": "y"}]}


def test_pd_pipeline_with_str_column(client: Client) -> None:
    inputs = [
        client.input("First Name", [b"Joanne", b"Michael"], "BYTES", "str"),
        client.input("Age", np.array([34, 22], dtype=np.int32), "INT32"),
    ]
    outputs, out_params, params = client.infer("greeter", inputs, {"content_type": "pd"})
    assert outputs["greeting"].tolist() == [b"Hello Joanne", b"Hello Michael"]
    assert outputs["next_age"].dtype == np.int32 and outputs["next_age"].tolist() == [35, 23]
    assert out_params == {"greeting": {"content_type": "str"}, "next_age": {"content_type": "np"}}
    assert params.get("content_type") == "pd"


def test_mlserver_json_payload_over_plain_http(server: ServerProcess) -> None:
    """The request from MLServer's content-type docs, as JSON, works unchanged."""
    import urllib.request

    body = {
        "parameters": {"content_type": "pd"},
        "inputs": [
            {"name": "First Name", "datatype": "BYTES", "parameters": {"content_type": "str"},
             "shape": [2], "data": ["Joanne", "Michael"]},
            {"name": "Age", "datatype": "INT32", "shape": [2], "data": [34, 22]},
        ],
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/greeter/infer", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["greeting"]["data"] == ["Hello Joanne", "Hello Michael"]
    assert outputs["greeting"]["parameters"]["content_type"] == "str"
    assert outputs["next_age"]["data"] == [35, 23] and outputs["next_age"]["datatype"] == "INT32"
    assert answer["parameters"]["content_type"] == "pd"


def test_str_request_level_from_metadata_async_model(client: Client) -> None:
    outputs, out_params, _ = client.infer("upper", [client.input("TEXT", ["h\u00e9".encode(), b"b"], "BYTES")])
    assert outputs["UPPER"].tolist() == ["H\u00c9".encode(), b"B"]
    assert out_params["UPPER"] == {"content_type": "str"}


def test_base64_in_and_out(client: Client) -> None:
    raw = [b"\x00\x01\xff", b"Python is fun"]
    outputs, out_params, _ = client.infer("blobs", [client.input("DATA", [base64.b64encode(r) for r in raw], "BYTES")])
    assert outputs["LENGTH"].tolist() == [3, 13]
    assert [base64.b64decode(v) for v in outputs["ECHO"]] == [r[::-1] for r in raw]
    assert out_params == {"LENGTH": {"content_type": "np"}, "ECHO": {"content_type": "base64"}}
    # the request's output content type overrides the model's: raw bytes come back
    outputs, out_params, _ = client.infer(
        "blobs",
        [client.input("DATA", [base64.b64encode(b"abc")], "BYTES")],
        outputs=[client.output("ECHO", "np")],
    )
    assert outputs["ECHO"].tolist() == [b"cba"] and out_params == {"ECHO": {"content_type": "np"}}


def test_datetime_in_and_out(client: Client) -> None:
    outputs, out_params, _ = client.infer(
        "dates", [client.input("WHEN", [b"2022-01-11T11:00:00", b"2024-02-28"], "BYTES")]
    )
    assert outputs["NEXT"].tolist() == [b"2022-01-12T11:00:00", b"2024-02-29T00:00:00"]
    assert out_params["NEXT"] == {"content_type": "datetime"}


def test_user_registered_content_type(client: Client) -> None:
    outputs, out_params, _ = client.infer("custom", [client.input("DOCS", [b'{"a": 1}', b"{}"], "BYTES")])
    assert [json.loads(v) for v in outputs["MERGED"]] == [{"a": 1, "seen": True}, {"seen": True}]
    assert out_params["MERGED"] == {"content_type": "json"}


def test_content_types_that_do_not_fit_are_invalid_argument(client: Client) -> None:
    b, c = np.array([1, 2], dtype=np.int32), np.zeros((2, 2), dtype=np.float32)

    def three(a: list, a_ct: str | None = None, b_ct: str | None = None) -> list:
        return [client.input("A", a, "BYTES", a_ct), client.input("B", b, "INT32", b_ct), client.input("C", c, "FP32")]

    err = client.fails("describe_plain", three([b"x", b"y"], b_ct="str"))
    assert "input 'B'" in err.message() and "'str'" in err.message()
    err = client.fails("describe_plain", three([b"\xff", b"y"], a_ct="str"))
    assert "input 'A'" in err.message() and "UTF-8" in err.message()
    err = client.fails("describe_plain", three([b"!!", b"y"], a_ct="base64"))
    assert "input 'A'" in err.message() and "base64" in err.message()
    err = client.fails("describe_plain", three([b"noon", b"y"], a_ct="datetime"))
    assert "input 'A'" in err.message() and "ISO 8601" in err.message()
    err = client.fails("describe_plain", three([b"x", b"y"], a_ct="klingon"))
    assert "unknown content type 'klingon'" in err.message()
    err = client.fails("describe_plain", three([b"x", b"y"], a_ct="pd"))
    assert "whole requests only" in err.message()
    err = client.fails("dates", [client.input("WHEN", [b"tomorrow"], "BYTES")])
    assert "input 'WHEN'" in err.message()
    err = client.fails("custom", [client.input("DOCS", [b"{not json"], "BYTES")])
    assert "input 'DOCS'" in err.message() and "'json'" in err.message()


def test_content_types_show_in_model_config(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("describe", as_json=True)["config"]
    assert config["backend"] == "python"
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["content_type"] == "pd" and params["input.A.content_type"] == "str"
    meta = client.get_model_metadata("describe", as_json=True)
    assert meta["platform"] == "python"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("A", "BYTES", ["-1"]), ("B", "INT32", ["-1"]), ("C", "FP32", ["-1", "2"])
    ]

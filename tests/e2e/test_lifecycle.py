"""Lifecycle of Python models, end to end: hooks, readiness, failures, draining on SIGTERM.

Test models append lines to a log file whose path they read from the
environment (``HOOK_LOG``), so the order and count of hooks are checked from
outside the server process:

- ``@on_deployment`` runs once per server, for every model before any model
  loads; ``@on_startup`` once per instance after ``load()``; ``@on_shutdown``
  per instance on unload and on server stop, in reverse order of definition.
- Readiness is false while ``load()`` runs (LOADING) and whenever the model's
  ``is_ready()`` says so; ``is_alive()`` drives server liveness.
- A load or hook that raises leaves the model UNAVAILABLE with the reason;
  the server stays up.
- SIGTERM lets requests in flight finish, runs the shutdown hooks, exits 0.
"""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from fastoip._proto import health_pb2, health_pb2_grpc
from python_models import INT_IO, write_python_model
from serverproc import ServerProcess, wait_until

pytestmark = pytest.mark.timeout(120)

LOGGING = """
    import os
    import fastoip

    def note(text):
        with open(os.environ["HOOK_LOG"], "a") as log:
            log.write(text + "\\n")
"""

HOOKED = LOGGING + """
    import asyncio

    class Base(fastoip.Model):
        @fastoip.on_startup
        def base_startup(self):
            note(f"startup-base {self.name} {self.instance}")

    class Hooked(Base):
        @fastoip.on_deployment
        def prepare():
            note("deploy hooked")

        @fastoip.on_deployment
        @staticmethod
        async def prepare_more():
            await asyncio.sleep(0)
            note("deploy-async hooked")

        def load(self):
            note(f"load {self.name} {self.instance}")

        @fastoip.on_startup
        def first(self):
            note(f"startup-a {self.name} {self.instance}")

        @fastoip.on_startup
        async def second(self):
            await asyncio.sleep(0)
            note(f"startup-b {self.name} {self.instance}")

        @fastoip.on_shutdown
        def close_a(self):
            note(f"shutdown-a {self.name} {self.instance}")

        @fastoip.on_shutdown
        async def close_b(self):
            await asyncio.sleep(0)
            note(f"shutdown-b {self.name} {self.instance}")

        def unload(self):
            note(f"unload {self.name} {self.instance}")

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"]}
"""

OTHER = LOGGING + """
    class Other(fastoip.Model):
        @fastoip.on_deployment
        def prepare():
            note("deploy other")

        async def load(self):
            note(f"load {self.name} {self.instance}")

        @fastoip.on_shutdown
        def bye(self):
            note(f"shutdown {self.name} {self.instance}")

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"] + 1}
"""


def read_log(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def int_input(values: list) -> list:
    array = np.array(values, dtype=np.int32)
    inp = grpcclient.InferInput("X", list(array.shape), "INT32")
    inp.set_data_from_numpy(array)
    return [inp]


def test_hook_order_and_counts(tmp_path: Path) -> None:
    root, log = tmp_path / "repo", tmp_path / "hooks.log"
    write_python_model(root, "hooked", HOOKED, INT_IO + "instance_group [ { count: 2 } ]\n")
    write_python_model(root, "other", OTHER, INT_IO)
    server = ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "*",
                           "--model-control-allow-code",  # it reloads Python models through the API
                           env={"HOOK_LOG": str(log)})
    with server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready()
        lines = read_log(log)
        # every deployment hook, of every model, before any model loads; each exactly once
        assert lines[:3] == ["deploy hooked", "deploy-async hooked", "deploy other"]
        assert sorted(lines[3:]) == sorted([
            "load hooked 0", "startup-base hooked 0", "startup-a hooked 0", "startup-b hooked 0",
            "load hooked 1", "startup-base hooked 1", "startup-a hooked 1", "startup-b hooked 1",
            "load other 0",
        ])
        # per instance: load, then startup hooks in definition order (base class first)
        instance0 = [line for line in lines if line.endswith("hooked 0")]
        assert instance0 == ["load hooked 0", "startup-base hooked 0", "startup-a hooked 0", "startup-b hooked 0"]
        assert client.infer("hooked", int_input([4])).as_numpy("OUT").tolist() == [4]

        mark = len(read_log(log))
        client.unload_model("hooked")
        after_unload = read_log(log)[mark:]
        for instance in (0, 1):  # shutdown hooks in reverse order of definition, then unload()
            assert [line for line in after_unload if line.endswith(f"hooked {instance}")] == [
                f"shutdown-b hooked {instance}", f"shutdown-a hooked {instance}", f"unload hooked {instance}"
            ]
        assert not client.is_model_ready("hooked")

        mark = len(read_log(log))
        client.load_model("hooked")  # a reload: startup again, deployment hooks never again
        reloaded = read_log(log)[mark:]
        assert not any(line.startswith("deploy") for line in reloaded)
        assert sum(line.startswith("startup-a") for line in reloaded) == 2
        assert client.infer("other", int_input([4])).as_numpy("OUT").tolist() == [5]
        mark = len(read_log(log))
        assert server.stop() == 0
    at_stop = read_log(log)[mark:]
    assert sorted(line for line in at_stop if line.startswith("shutdown")) == sorted(
        ["shutdown-b hooked 0", "shutdown-a hooked 0", "shutdown-b hooked 1", "shutdown-a hooked 1", "shutdown other 0"]
    )
    assert sum(line.startswith("deploy") for line in read_log(log)) == 3


SLOW_LOAD = """
    import time
    import fastoip

    class Slow(fastoip.Model):
        def load(self):
            time.sleep(2.0)

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"]}
"""

FLAGGED = """
    import os
    import fastoip

    class Flagged(fastoip.Model):
        async def is_ready(self):
            return not os.path.exists(self.parameters["not_ready_flag"])

        def is_alive(self):
            return not os.path.exists(self.parameters["dead_flag"])

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"]}
"""

BAD_STARTUP = LOGGING + """
    class BadStartup(fastoip.Model):
        @fastoip.on_startup
        def connect(self):
            raise ConnectionError("database is down")

        @fastoip.on_shutdown
        def cleanup(self):
            note(f"cleanup {self.instance}")

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"]}
"""

BAD_DEPLOY = """
    import fastoip

    class BadDeploy(fastoip.Model):
        @fastoip.on_deployment
        def download():
            raise RuntimeError("bucket not found")

        def predict(self, inputs, parameters):
            return {"OUT": inputs["X"]}
"""


@pytest.fixture()
def health_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "repo"
    flags = tmp_path / "flags"
    flags.mkdir()
    write_python_model(root, "flagged", FLAGGED, INT_IO + textwrap.dedent(f"""
        parameters {{ key: "not_ready_flag" value {{ string_value: "{flags / 'not_ready'}" }} }}
        parameters {{ key: "dead_flag" value {{ string_value: "{flags / 'dead'}" }} }}
    """))
    write_python_model(root, "bad_startup", BAD_STARTUP, INT_IO + "instance_group [ { count: 2 } ]\n")
    write_python_model(root, "bad_deploy", BAD_DEPLOY, INT_IO)
    # Explicit mode: only "flagged" loads at start; the others are loaded by the tests.
    server = ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "flagged",
                           "--model-control-allow-code",  # the tests load Python models through the API
                           http=True, env={"HOOK_LOG": str(tmp_path / "hooks.log")})
    with server:
        server.root, server.flags, server.log = root, flags, tmp_path / "hooks.log"  # type: ignore[attr-defined]
        yield server


def test_not_ready_while_load_runs(health_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(health_server.grpc_url)
    write_python_model(health_server.root, "slow", SLOW_LOAD, INT_IO)  # type: ignore[attr-defined]
    assert client.is_server_ready()
    loader = threading.Thread(target=lambda: grpcclient.InferenceServerClient(health_server.grpc_url).load_model("slow"))
    loader.start()
    def state() -> str:
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
        return index.get("slow", {}).get("state", "")

    samples = []  # (index state, model ready, server ready, index state again)
    while loader.is_alive():
        before = state()
        model_ready, server_ready = client.is_model_ready("slow"), client.is_server_ready()
        samples.append((before, model_ready, server_ready, state()))
        time.sleep(0.05)
    loader.join()
    loading = [s for s in samples if s[0] == s[3] == "LOADING"]
    assert len(loading) >= 5, samples  # load() sleeps 2 s
    # while load() runs: neither the model nor (strict readiness) the server is ready
    assert all(not model_ready and not server_ready for _, model_ready, server_ready, _ in loading), samples
    # and a model never reads ready before the index says READY
    assert all(after == "READY" for _, model_ready, _, after in samples if model_ready), samples
    assert client.is_model_ready("slow") and client.is_server_ready()
    assert client.infer("slow", int_input([1])).as_numpy("OUT").tolist() == [1]


def test_is_ready_and_is_alive_drive_health(health_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(health_server.grpc_url)
    http = httpclient.InferenceServerClient(health_server.http_url)
    flags: Path = health_server.flags  # type: ignore[attr-defined]
    assert client.is_model_ready("flagged") and client.is_server_ready()
    (flags / "not_ready").touch()
    assert not client.is_model_ready("flagged")
    assert not client.is_server_ready()
    assert not http.is_model_ready("flagged") and not http.is_server_ready()
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(health_server.grpc_url))
    status = health_pb2.HealthCheckResponse
    assert health.Check(health_pb2.HealthCheckRequest(service="flagged")).status == status.NOT_SERVING
    assert health.Check(health_pb2.HealthCheckRequest()).status == status.NOT_SERVING
    assert client.is_server_live()
    (flags / "not_ready").unlink()
    assert client.is_model_ready("flagged") and client.is_server_ready()
    assert http.is_server_ready()
    assert health.Check(health_pb2.HealthCheckRequest(service="flagged")).status == status.SERVING
    (flags / "dead").touch()
    assert not client.is_server_live()
    assert not http.is_server_live()
    (flags / "dead").unlink()
    assert client.is_server_live()


def test_failing_hooks_leave_the_model_unavailable_with_the_reason(health_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(health_server.grpc_url)
    with pytest.raises(InferenceServerException, match="on_startup hook connect failed: ConnectionError: database is down"):
        client.load_model("bad_startup")
    with pytest.raises(InferenceServerException, match="on_deployment hook failed: RuntimeError: bucket not found"):
        client.load_model("bad_deploy")
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["bad_startup"]["state"] == "UNAVAILABLE"
    assert "database is down" in index["bad_startup"]["reason"]
    assert index["bad_deploy"]["state"] == "UNAVAILABLE"
    assert "bucket not found" in index["bad_deploy"]["reason"]
    # the instance that did start is shut down again
    assert read_log(health_server.log) == ["cleanup 0"]  # type: ignore[attr-defined]
    assert client.is_server_live()
    assert client.infer("flagged", int_input([2])).as_numpy("OUT").tolist() == [2]


SLOW_PREDICT = LOGGING + """
    import time

    class SlowPredict(fastoip.Model):
        def predict(self, inputs, parameters):
            note(f"start {int(inputs['X'][0])}")
            time.sleep(0.5)
            note(f"end {int(inputs['X'][0])}")
            return {"OUT": inputs["X"]}

        @fastoip.on_shutdown
        def goodbye(self):
            note(f"shutdown {self.instance}")
"""


def test_sigterm_drains_requests_in_flight(tmp_path: Path, grpc_frontend: str) -> None:
    root, log = tmp_path / "repo", tmp_path / "hooks.log"
    write_python_model(root, "slow", SLOW_PREDICT, INT_IO + "instance_group [ { count: 10 } ]\n")
    server = ServerProcess(root, env={"HOOK_LOG": str(log)}, grpc_frontend=grpc_frontend).start()
    try:
        clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(10)]
        assert all(c.is_server_live() for c in clients)  # connections up: the requests leave together

        def one(i: int) -> list:
            return clients[i].infer("slow", int_input([i])).as_numpy("OUT").tolist()

        with ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(one, i) for i in range(10)]
            assert wait_until(lambda: sum(entry.startswith("start") for entry in read_log(log)) == 10, timeout=10)
            ended_before = sum(line.startswith("end") for line in read_log(log))
            server.signal(signal.SIGTERM)
            results = [f.result(timeout=30) for f in futures]
        assert results == [[i] for i in range(10)]  # every request in flight at SIGTERM succeeded
        assert ended_before < 10
        assert server.wait(30) == 0
    finally:
        server.stop()
    lines = read_log(log)
    assert sorted(line for line in lines if line.startswith("shutdown")) == sorted(f"shutdown {i}" for i in range(10))
    # shutdown hooks ran after every request had finished
    assert lines.index(next(entry for entry in lines if entry.startswith("shutdown"))) > max(
        i for i, entry in enumerate(lines) if entry.startswith("end")
    )
    assert "fastoip: stopped" in server.output()


def test_grace_period_readiness_false_before_listeners_close(tmp_path: Path, grpc_frontend: str) -> None:
    root = tmp_path / "repo"
    write_python_model(root, "echo", FLAGGED, INT_IO + """
        parameters { key: "not_ready_flag" value { string_value: "/nonexistent/flag" } }
        parameters { key: "dead_flag" value { string_value: "/nonexistent/flag" } }
    """)
    server = ServerProcess(root, "--shutdown-grace", "3", grpc_frontend=grpc_frontend).start()
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready() and client.is_model_ready("echo")
        server.signal(signal.SIGTERM)
        assert wait_until(lambda: not client.is_server_ready(), timeout=2.0)
        assert client.is_server_live()  # still listening during the grace period
        assert not client.is_model_ready("echo")
        # Traffic that still arrives during the grace period is served, not refused (Triton #6230).
        inputs = [grpcclient.InferInput("X", [4], "INT32")]
        inputs[0].set_data_from_numpy(np.arange(4, dtype=np.int32))
        assert client.infer("echo", inputs).as_numpy("OUT").tolist() == [0, 1, 2, 3]
        assert server.wait(30) == 0
    finally:
        server.stop()


# -- a drain that loses nothing ------------------------------------------------------------------
STEADY = """
    import time
    import fastoip

    class Steady(fastoip.Model):
        def predict(self, inputs):
            time.sleep(0.05)  # long enough that requests are in flight when the listeners close
            return {"OUT": inputs["X"]}
"""


def _drain_outcome(protocol: str, url: str, stop: threading.Event, results: dict, lock: threading.Lock) -> None:
    """One client: requests back to back until the server refuses (a retryable answer) or stop is set."""
    module = grpcclient if protocol == "grpc" else httpclient
    try:
        client = module.InferenceServerClient(url)
    except Exception:  # the server already stopped listening: nothing was sent
        return
    n = 0
    while not stop.is_set():
        n += 1
        inp = module.InferInput("X", [1], "INT32")
        inp.set_data_from_numpy(np.array([n], dtype=np.int32))
        outcome: str
        try:
            answer = client.infer("steady", [inp]).as_numpy("OUT").tolist()
            outcome = "ok" if answer == [n] else f"wrong answer {answer}"
        except InferenceServerException as exc:
            retryable = exc.status() in ("StatusCode.UNAVAILABLE", "503")
            outcome = "refused" if retryable else f"lost: {exc.status()} {exc.message()}"
            if "accepts no new requests" in exc.message():  # a listener took it, then the server dropped it
                outcome = f"lost: taken, then refused: {exc.message()}"
        except ConnectionRefusedError:
            outcome = "refused"  # the listener is closed: the request never reached the server
        except Exception as exc:
            outcome = f"lost: {type(exc).__name__}: {exc}"
        with lock:
            results[outcome] = results.get(outcome, 0) + 1
        if outcome == "refused":
            return


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sigterm_under_load_loses_no_request(tmp_path: Path, protocol: str) -> None:
    """Requests sent vs answered across SIGTERM with the default drain: every one is answered or refused
    with a retryable status (UNAVAILABLE / 503 / connection refused), none fails or is CANCELLED."""
    root = tmp_path / "repo"
    write_python_model(root, "steady", STEADY, INT_IO + "instance_group [ { count: 8 } ]\n")
    server = ServerProcess(root, "--shutdown-grace", "1", http=True).start()
    url = server.grpc_url if protocol == "grpc" else server.http_url
    results: dict[str, int] = {}
    lock, stop = threading.Lock(), threading.Event()
    threads = [
        threading.Thread(target=_drain_outcome, args=(protocol, url, stop, results, lock)) for _ in range(8)
    ]
    try:
        for thread in threads:
            thread.start()
        assert wait_until(lambda: results.get("ok", 0) >= 40, timeout=30), results
        answered_before = results.get("ok", 0)
        server.signal(signal.SIGTERM)
        assert server.wait(60) == 0
        stop.set()
        for thread in threads:
            thread.join(30)
    finally:
        stop.set()
        server.stop()
    print(f"{protocol}: outcomes across SIGTERM: {results}")
    assert set(results) <= {"ok", "refused"}, results  # nothing lost, no wrong answer
    assert results["ok"] > answered_before  # the grace period kept serving
    assert "Traceback" not in server.output(), server.output()


def test_a_half_sent_http_request_at_shutdown_gets_503(tmp_path: Path) -> None:
    import json
    import socket

    root = tmp_path / "repo"
    write_python_model(root, "steady", STEADY, INT_IO)
    server = ServerProcess(root, "--exit-timeout", "1", http=True).start()
    try:
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as conn:
            head = (
                f"POST /v2/models/steady/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            conn.sendall(head + body[:10])  # the rest never comes
            time.sleep(0.3)
            server.signal(signal.SIGTERM)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b'"error"' in answer and b"shutting down" in answer, answer
        assert server.wait(30) == 0
    finally:
        server.stop()
    assert "CancelledError" not in server.output() and "Traceback" not in server.output(), server.output()


def test_the_default_drain_keeps_serving_for_a_while() -> None:
    from fastoip.server.app import DEFAULT_SHUTDOWN_GRACE, ServeOptions

    assert ServeOptions().shutdown_grace == DEFAULT_SHUTDOWN_GRACE >= 3

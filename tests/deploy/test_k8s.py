"""docker/k8s: every built-in resource validated strictly against the Kubernetes schema
(kubernetes-validate --strict), then what the manifests must say about the service."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import (
    K8S,
    ROOT,
    drain_timeout_default,
    exposed_metric_names,
    load_all_yaml,
    load_yaml,
    tool,
)

# Not Kubernetes API objects, so without a schema to check them against: kustomize's own file,
# and the Prometheus Operator's CRD (its fields are checked below instead).
NOT_BUILT_IN = {"kustomization.yaml", "optional/servicemonitor.yaml"}
MANIFESTS = sorted(p.relative_to(K8S).as_posix() for p in K8S.rglob("*.yaml"))
BUILT_IN = [m for m in MANIFESTS if m not in NOT_BUILT_IN]


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("kubernetes-validate"), "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("manifest", BUILT_IN)
def test_manifest_validates_strictly(manifest):
    done = validate(K8S / manifest)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Couldn't find schema" not in out, out
    assert out.count(" passed ") == len(load_all_yaml(K8S / manifest)), out


def test_strict_validation_rejects_an_unknown_field(tmp_path):
    deployment = load_yaml(K8S / "deployment.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(deployment))
    done = validate(bad)
    assert done.returncode != 0 and "readinesProbe" in done.stdout + done.stderr


def by_kind(kind: str, folder: Path = K8S) -> dict:
    docs = [
        d for f in sorted(folder.glob("*.yaml")) for d in load_all_yaml(f) if d.get("kind") == kind
    ]
    assert len(docs) == 1, f"expected one {kind} in {folder}, found {len(docs)}"
    return docs[0]


DEPLOYMENT = by_kind("Deployment")
POD = DEPLOYMENT["spec"]["template"]
CONTAINER = POD["spec"]["containers"][0]
ENV = {e["name"]: e.get("value") for e in CONTAINER["env"]}
SERVICE = by_kind("Service")


def port_named(name: str) -> int:
    return next(p["containerPort"] for p in CONTAINER["ports"] if p["name"] == name)


def test_gpu_is_requested():
    resources = CONTAINER["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert str(resources["requests"].get("nvidia.com/gpu", 1)) == "1"  # extended: requests = limits
    assert {"cpu", "memory"} <= resources["requests"].keys() and "memory" in resources["limits"]
    assert ENV["HEADWISE_DEVICE"] in {"cuda", "auto"}


def test_probes_use_the_service_endpoints():
    assert CONTAINER["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert CONTAINER["livenessProbe"]["httpGet"]["path"] == "/health"
    assert CONTAINER["startupProbe"]["httpGet"]["path"] in {"/ready", "/health"}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        port = CONTAINER[probe]["httpGet"]["port"]
        assert (port_named(port) if isinstance(port, str) else port) == int(ENV["HEADWISE_PORT"])


def test_shutdown_leaves_time_to_drain():
    """Endpoints removed during preStop, then SIGTERM and the drain, all inside the grace period."""
    pre_stop = CONTAINER["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        sleep_s = float(pre_stop["sleep"]["seconds"])
    else:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep", command
        sleep_s = float(command[1])
    assert sleep_s >= 5, "long enough for kube-proxy and ingresses to drop the endpoint"
    drain_s = float(ENV.get("HEADWISE_DRAIN_TIMEOUT_S") or drain_timeout_default())
    grace_s = POD["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= sleep_s + drain_s + 5, (grace_s, sleep_s, drain_s)


def test_environment_and_security():
    assert ENV["HEADWISE_HOST"] == "0.0.0.0"
    assert int(ENV["HEADWISE_PORT"]) == port_named("http") == 8000
    # Service links would set HEADWISE_PORT=tcp://... for a Service called headwise.
    assert POD["spec"]["enableServiceLinks"] is False
    pod_sc, sc = POD["spec"]["securityContext"], CONTAINER["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    dockerfile_uid = re.findall(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert set(dockerfile_uid) == {str(pod_sc["runAsUser"])}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in CONTAINER["volumeMounts"]}
    assert "/tmp" in mounts


def test_scrape_annotations_match_the_container():
    annotations = POD["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port_named("http")
    assert annotations["prometheus.io/path"] == "/metrics"


def test_service_selects_the_pods():
    labels = POD["metadata"]["labels"]
    assert SERVICE["spec"]["selector"].items() <= labels.items()
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [port] = SERVICE["spec"]["ports"]
    assert port["name"] == "http" and port["targetPort"] in ("http", port_named("http"))


def test_hpa_scales_on_queue_depth_through_the_adapter():
    hpa = by_kind("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", DEPLOYMENT["metadata"]["name"])
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "headwise_queue_depth" and name in exposed_metric_names()
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert (
        hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    )

    # The adapter rule publishes exactly that name, from that series, per namespace and pod.
    adapter = by_kind("ConfigMap", K8S / "optional")
    [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == name
    assert re.match(rf"{name}\b", rule["seriesQuery"])
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


def test_cpu_fallback_hpa_replaces_the_primary():
    fallback = by_kind("HorizontalPodAutoscaler", K8S / "optional")
    primary = by_kind("HorizontalPodAutoscaler")
    assert fallback["metadata"]["name"] == primary["metadata"]["name"]  # applying it replaces it
    assert fallback["spec"]["scaleTargetRef"] == primary["spec"]["scaleTargetRef"]
    [metric] = fallback["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert "cpu" in CONTAINER["resources"]["requests"], "utilisation is relative to the request"


def test_pdb_covers_the_pods_and_allows_a_drain():
    pdb = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= POD["metadata"]["labels"].items()
    min_replicas = by_kind("HorizontalPodAutoscaler")["spec"]["minReplicas"]
    assert pdb["spec"]["minAvailable"] < min_replicas, "else a node drain can never evict a pod"


def test_service_monitor_scrapes_the_service():
    monitor = by_kind("ServiceMonitor", K8S / "optional")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= SERVICE["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in SERVICE["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_kustomization_lists_every_manifest():
    kustomization = load_yaml(K8S / "kustomization.yaml")
    top_level = {m for m in MANIFESTS if "/" not in m} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == top_level
    images = [c["image"].split(":")[0] for c in [CONTAINER, EXPORT]]
    assert [i["name"] for i in kustomization["images"]] == images
    assert len(set(images)) == 2, "one images: entry per image, or kustomize retags both"
    assert [i["newTag"] for i in kustomization["images"]] == ["gpu", "export"]


# ---- the model, chosen at deploy time -------------------------------------------------------


EXPORT = next(c for c in POD["spec"]["initContainers"] if c["name"] == "export")


def mounts(container: dict) -> dict[str, dict]:
    return {m["name"]: m for m in container["volumeMounts"]}


def test_model_and_revision_are_set_in_the_kustomization_only():
    kustomization = load_yaml(K8S / "kustomization.yaml")
    [generator] = kustomization["configMapGenerator"]
    literals = dict(line.split("=", 1) for line in generator["literals"])
    assert literals == {"MODEL": "", "REVISION": ""}, "empty MODEL: the default model"
    [source] = EXPORT["envFrom"]
    assert source["configMapRef"]["name"] == generator["name"]
    everywhere = [e["name"] for c in [CONTAINER, EXPORT] for e in c.get("env", [])]
    assert not {"MODEL", "REVISION"} & set(everywhere), "set in one place, the kustomization"


def test_export_init_container_writes_the_bundle_the_server_reads():
    out = EXPORT["args"][EXPORT["args"].index("--out") + 1]
    bundle = ENV["HEADWISE_BUNDLE"]
    assert out == bundle
    export_mount, serve_mount = mounts(EXPORT)["models"], mounts(CONTAINER)["models"]
    assert export_mount["mountPath"] == serve_mount["mountPath"]
    assert Path(bundle).parent == Path(serve_mount["mountPath"]), (
        "export renames a sibling folder into place: the bundle is a sub-folder of the volume"
    )
    assert serve_mount.get("readOnly") is True and not export_mount.get("readOnly")
    [volume] = [v for v in POD["spec"]["volumes"] if v["name"] == "models"]
    assert "emptyDir" in volume


def test_export_init_container_needs_no_gpu_and_is_locked_down_like_the_server():
    assert "nvidia.com/gpu" not in EXPORT["resources"]["limits"]
    assert EXPORT["resources"]["requests"]["memory"]
    assert EXPORT["securityContext"] == CONTAINER["securityContext"]
    assert mounts(EXPORT)["export-tmp"]["mountPath"] == "/tmp", (
        "read-only root: /tmp for the Hub cache"
    )
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert '["--out", "/models/bundle", "--fp16", "--int8"]' in dockerfile

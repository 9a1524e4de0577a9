"""docker/kserve: the ServingRuntime and InferenceServices validated against KServe's published
CRD schemas (tests/reference/kserve/), strictly: a field the schema does not know is an error
here, where an API server would silently prune it. Then what they must say about headwise: the
runtime serves the protocol it claims, on the port and health paths the server has, the bundle
where the runtime reads it, and KEDA scales on a metric headwise exposes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest

from service.api.routes import TABLE
from service.settings import Settings
from tests.deploy.conftest import DOCKER, ROOT, exposed_metric_names, load_all_yaml

KSERVE = DOCKER / "kserve"
SCHEMAS = ROOT / "tests" / "reference" / "kserve"
KINDS = {
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.json",
}
MANIFESTS = sorted(p.name for p in KSERVE.glob("*.yaml"))


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever the API server would prune them (an
    object with properties, no additionalProperties, not x-kubernetes-preserve-unknown-fields)."""
    out = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


SCHEMA = {key: strict(json.loads((SCHEMAS / f).read_text())) for key, f in KINDS.items()}


def documents() -> list[tuple[str, dict]]:
    return [(name, doc) for name in MANIFESTS for doc in load_all_yaml(KSERVE / name)]


def validator(doc: dict) -> jsonschema.Draft7Validator:
    key = (doc.get("apiVersion"), doc.get("kind"))
    assert key in SCHEMA, f"no KServe schema for {key}"
    return jsonschema.Draft7Validator(SCHEMA[key])


def runtime() -> dict:
    (doc,) = [d for _, d in documents() if d["kind"] == "ServingRuntime"]
    return doc


def services() -> list[dict]:
    return [d for _, d in documents() if d["kind"] == "InferenceService"]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_resource_validates_against_kserves_schema(name, doc):
    errors = sorted(validator(doc).iter_errors(doc), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_check_refuses_what_kserve_would_prune_or_reject():
    service = copy.deepcopy(services()[0])
    service["spec"]["predictor"]["replicas"] = 3  # not a field: an API server drops it
    assert any("replicas" in e.message for e in validator(service).iter_errors(service))
    service = copy.deepcopy(services()[0])
    service["spec"]["predictor"]["scaleMetric"] = "queue"  # not one of its values
    assert list(validator(service).iter_errors(service))


def test_the_runtime_claims_the_protocols_headwise_serves_on_its_port():
    spec = runtime()["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert TABLE.match("POST", "/v2/models/some/model/infer") is not None
    assert TABLE.match("GET", "/v2/models/some/model/ready") is not None
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HEADWISE_PORT"] == "8080" and env["HEADWISE_HOST"] == "0.0.0.0"
    assert env["HEADWISE_GRPC_PORT"] == "9000"  # KServe's gRPC port (Triton's runtime's too)
    assert Settings(grpc_port=env["HEADWISE_GRPC_PORT"]).grpc_port == 9000
    assert [p["containerPort"] for p in container["ports"]] == [8080]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == 8080 and TABLE.is_open(get["path"]), get["path"]
        assert TABLE.match("GET", get["path"]) is not None
    assert container["args"] == ["--bundle", "{{.Name}}=/mnt/models"]  # NAME=DIR: served as NAME


@pytest.mark.parametrize("service", services(), ids=lambda s: s["metadata"]["name"])
def test_each_service_runs_on_the_runtime_with_its_bundle_where_the_runtime_reads_it(service):
    rt = runtime()
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == rt["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in rt["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in rt["spec"]["protocolVersions"]
    (mount,) = model["volumeMounts"]
    assert mount["mountPath"] == "/mnt/models"
    (export,) = predictor["initContainers"]
    out = export["args"][export["args"].index("--out") + 1]
    shared = next(m for m in export["volumeMounts"] if m["name"] == mount["name"])
    assert Path(out) == Path(shared["mountPath"]) / mount["subPath"]  # what export writes is mounted
    volumes = {v["name"] for v in predictor["volumes"]}
    assert {m["name"] for m in export["volumeMounts"]} | {mount["name"]} <= volumes
    import argparse

    from export.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.parse_args(export["args"])  # the export CLI takes these arguments


def test_keda_scales_on_a_queue_metric_headwise_exposes():
    (service,) = [s for s in services() if s["metadata"]["annotations"].get("serving.kserve.io/autoscalerClass") == "keda"]
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    (metric,) = service["spec"]["predictor"]["autoScaling"]["metrics"]
    query = metric["external"]["metric"]["query"]
    names = set(re.findall(r"\b(headwise_[a-z_]+)", query))
    assert names and names <= exposed_metric_names()
    name = service["metadata"]["name"]
    assert f'pod=~"{name}-predictor-.*"' in query  # this service's pods, not every headwise

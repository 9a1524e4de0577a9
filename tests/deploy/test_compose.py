"""docker/compose.yaml, the Prometheus config it mounts, Grafana's provisioning and the dashboard:
schema-valid, wired to each other, and every PromQL expression about metrics the service exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.conftest import (
    DOCKER,
    ROOT,
    drain_timeout_default,
    exposed_metric_names,
    load_yaml,
    tool,
)

COMPOSE_FILE = DOCKER / "compose.yaml"
COMPOSE = load_yaml(COMPOSE_FILE)
SERVICES = COMPOSE["services"]
DASHBOARD_FILE = DOCKER / "grafana" / "dashboards" / "headwise.json"
METRIC = re.compile(r"\bheadwise_[a-z0-9_]+\b")


def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows keep theirs inside
    return out


def expressions(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in dash["templating"]["list"]
        if v["type"] == "query"
    ]
    return exprs


def volume(service: str, target: str) -> str:
    """The host side of `service`'s bind mount at `target` (":ro" and the like dropped)."""
    for spec in SERVICES[service]["volumes"]:
        host, container, *_ = spec.split(":")
        if container == target:
            return host
    raise AssertionError(f"{service} mounts nothing at {target}")


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration))


# ---- compose ------------------------------------------------------------------------------------


def check_compose_schema(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_matches_the_compose_spec(tmp_path):
    done = check_compose_schema(COMPOSE_FILE)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = json.loads(json.dumps(COMPOSE))
    bad["services"]["headwise"]["stop_grace_priod"] = "45s"  # the schema check is not vacuous
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(bad))
    assert check_compose_schema(tmp_path / "compose.yaml").returncode != 0


def test_compose_has_the_four_services():
    assert set(SERVICES) == {"export", "headwise", "prometheus", "grafana"}


def test_export_service_writes_the_bundle_headwise_serves():
    export, headwise = SERVICES["export"], SERVICES["headwise"]
    assert export["build"]["target"] == "export"
    assert export["environment"]["MODEL"] == "${MODEL:-}", "empty MODEL: the default model"
    assert export["environment"]["REVISION"] == "${REVISION:-}"
    assert "models:/models" in export["volumes"]
    assert "models:/models:ro" in headwise["volumes"]
    assert "models" in COMPOSE["volumes"]
    # The image's default arguments write /models/bundle (test_dockerfile checks the CMD).
    assert headwise["environment"]["HEADWISE_BUNDLE"] == "/models/bundle"
    assert headwise["depends_on"]["export"]["condition"] == "service_completed_successfully"
    assert export["restart"] == "no" and export["read_only"] is True


class ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (!reset, !override) read as plain values."""


ComposeLoader.add_constructor("!reset", lambda loader, node: None)
ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: (
        loader.construct_sequence(node)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node)
    ),
)


def test_cpu_override_serves_the_cpu_image_without_a_gpu():
    with (DOCKER / "compose.cpu.yaml").open() as f:
        override = yaml.load(f, Loader=ComposeLoader)
    [(name, service)] = override["services"].items()
    assert name == "headwise"
    assert service["build"]["target"] == "cpu" and service["image"] == "headwise:cpu"
    assert service["environment"]["HEADWISE_DEVICE"] == "cpu"
    assert "!reset" in (DOCKER / "compose.cpu.yaml").read_text() and service["deploy"] is None


def test_podman_override_names_only_loopback_ports():
    with (DOCKER / "podman" / "compose.yaml").open() as f:
        override = yaml.load(f, Loader=ComposeLoader)
    assert set(override["services"]) <= set(SERVICES)
    for service in override["services"].values():
        assert all(p.startswith("127.0.0.1:") for p in service.get("ports", []))


def test_headwise_builds_the_gpu_image_and_reserves_a_gpu():
    service = SERVICES["headwise"]
    build = service["build"]
    context = (COMPOSE_FILE.parent / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]).is_file()
    assert build["target"] == "gpu"
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["count"] == 1
    assert device["capabilities"] == ["gpu"]
    assert any(str(p).endswith(":8000") for p in service["ports"])


def test_headwise_healthcheck_and_stop_grace():
    service = SERVICES["headwise"]
    assert "/opt/headwise/healthcheck.py" in service["healthcheck"]["test"]
    drain_s = float(
        service.get("environment", {}).get("HEADWISE_DRAIN_TIMEOUT_S") or drain_timeout_default()
    )
    assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert seconds(service["stop_grace_period"]) >= drain_s + 5, (
        "docker's default 10 s would cut the drain"
    )


# ---- prometheus ---------------------------------------------------------------------------------


def test_prometheus_scrapes_the_headwise_service():
    service = SERVICES["prometheus"]
    config_path = next(
        a.split("=", 1)[1] for a in service["command"] if a.startswith("--config.file=")
    )
    config = load_yaml(COMPOSE_FILE.parent / volume("prometheus", config_path))
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "headwise"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    [target] = [t for sc in job["static_configs"] for t in sc["targets"]]
    host, port = target.split(":")
    assert host == "headwise" and host in SERVICES
    assert port == "8000"


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (make system-deps)"
)
def test_prometheus_config_passes_promtool():
    done = subprocess.run(
        ["promtool", "check", "config", str(DOCKER / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---- grafana ------------------------------------------------------------------------------------


def grafana_mount(target: str):
    return (COMPOSE_FILE.parent / volume("grafana", target)).resolve()


def test_grafana_datasource_points_at_the_prometheus_service():
    provisioning = grafana_mount("/etc/grafana/provisioning")
    assert provisioning == DOCKER / "grafana" / "provisioning"
    [source] = [
        d
        for f in sorted((provisioning / "datasources").glob("*.yaml"))
        for d in load_yaml(f)["datasources"]
    ]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert source["uid"] == "prometheus"


def test_grafana_dashboard_provider_loads_the_mounted_folder():
    provisioning = grafana_mount("/etc/grafana/provisioning")
    [provider] = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.yaml"))
        for p in load_yaml(f)["providers"]
    ]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert grafana_mount(path) == DASHBOARD_FILE.parent
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/{DASHBOARD_FILE.name}"


# ---- dashboard ----------------------------------------------------------------------------------


def test_dashboard_is_valid_and_laid_out():
    dash = dashboard()
    assert dash["uid"] == "headwise" and dash["title"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    boxes = [p["gridPos"] for p in panels(dash)]
    for i, a in enumerate(boxes):
        assert a["x"] + a["w"] <= 24
        for b in boxes[i + 1 :]:
            overlap = (
                a["x"] < b["x"] + b["w"]
                and b["x"] < a["x"] + a["w"]
                and a["y"] < b["y"] + b["h"]
                and b["y"] < a["y"] + a["h"]
            )
            assert not overlap, (a, b)
    for p in panels(dash):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "prometheus", p["title"]
            assert p["targets"], p["title"]


def test_dashboard_queries_only_metrics_the_service_exposes():
    exposed = exposed_metric_names()
    for expr in expressions(dashboard()):
        names = METRIC.findall(expr)
        assert names, f"no headwise metric in {expr!r}"
        unknown = set(names) - exposed
        assert not unknown, f"{expr!r} uses {unknown}; the service exposes {sorted(exposed)}"
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_dashboard_has_the_required_panels():
    dash = dashboard()
    by_metric = {}
    for p in panels(dash):
        for t in p.get("targets", []):
            for name in METRIC.findall(t["expr"]):
                by_metric.setdefault(name, []).append((p, t["expr"]))
    required = [
        "headwise_requests_total",
        "headwise_request_duration_seconds_bucket",
        "headwise_queue_depth",
        "headwise_queue_duration_seconds_sum",
        "headwise_inference_duration_seconds_sum",
        "headwise_batch_size_sum",
        "headwise_batch_tokens_sum",
        "headwise_padding_ratio",
        "headwise_model_info",
    ]
    missing = [m for m in required if m not in by_metric]
    assert not missing, missing
    # Requests by endpoint and status.
    assert any(
        "by (endpoint, status)" in e and "rate(" in e
        for _, e in by_metric["headwise_requests_total"]
    )
    # p50 / p95 / p99 latency from the histogram.
    quantiles = {
        re.search(r"histogram_quantile\((0\.\d+)", e).group(1)
        for _, e in by_metric["headwise_request_duration_seconds_bucket"]
    }
    assert {"0.50", "0.95", "0.99"} <= quantiles or {"0.5", "0.95", "0.99"} <= quantiles
    # Queue wait and inference time on one panel, to compare.
    queue_panels = {p["id"] for p, _ in by_metric["headwise_queue_duration_seconds_sum"]}
    inference_panels = {p["id"] for p, _ in by_metric["headwise_inference_duration_seconds_sum"]}
    assert queue_panels & inference_panels
    # Which provider, device and precision serve.
    [(_, info_expr)] = by_metric["headwise_model_info"]
    assert all(label in info_expr for label in ("provider", "device", "precision"))

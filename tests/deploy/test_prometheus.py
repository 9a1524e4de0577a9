"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a real `headwise serve` over loopback:
the scrape works, the counters arrive intact, and every dashboard query and the HPA adapter's query
evaluate against the real series."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import DOCKER, K8S, Server, exposed_metric_names, free_port, stop

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is not installed: `make system-deps` (apt-get install prometheus)",
    ),
]

WINDOW = "10s"  # stands in for Grafana's $__rate_interval: ten 1 s scrapes


@dataclass
class Prom:
    url: str
    log: Path

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr!r}: {body}"
        return body["data"]["result"]

    def wait_for(self, expr: str, ok, what: str, timeout_s: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not in {timeout_s:.0f} s; last {result}\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.5)


def encode(server: Server, n: int) -> None:
    for i in range(n):
        r = httpx.post(
            f"{server.url}/encode",
            json={"inputs": [f"text {i}", "short", "a longer one " * i]},
            timeout=30,
        )
        assert r.status_code == 200, r.text


def served_count(server: Server, endpoint: str) -> float:
    """headwise_requests_total for an endpoint, straight from the server's /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "headwise_requests_total" and s.labels.get("endpoint") == endpoint
    )


@pytest.fixture(scope="module")
def prometheus(live_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "headwise",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{live_server.port}"]}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    prom = Prom(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (
                f"prometheus exited with {proc.returncode}:\n{log.read_text()}"
            )
            try:
                if httpx.get(f"{prom.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"prometheus not ready in 30 s:\n{log.read_text()}"
            time.sleep(0.2)
        yield prom
    finally:
        stop(proc, grace_s=15)


@pytest.fixture(scope="module")
def scraped(live_server: Server, prometheus: Prom) -> float:
    """Requests sent before the first scrape; returns the server's own /encode count."""
    encode(live_server, 5)
    expected = served_count(live_server, "/encode")
    prometheus.wait_for(
        'headwise_requests_total{endpoint="/encode"}',
        lambda r: bool(r),
        "/encode requests in Prometheus",
    )
    return expected


def test_prometheus_scrapes_the_server(prometheus, scraped):
    [up] = prometheus.query('up{job="headwise"}')
    assert up["value"][1] == "1"
    result = prometheus.query('headwise_requests_total{endpoint="/encode"}')
    assert {r["metric"]["status"] for r in result} == {"200"}
    assert {r["metric"]["job"] for r in result} == {"headwise"}
    assert sum(float(r["value"][1]) for r in result) == scraped >= 5


def test_scraped_names_are_the_ones_the_dashboard_checks_against(prometheus, scraped):
    r = httpx.get(f"{prometheus.url}/api/v1/label/__name__/values", timeout=10).json()
    names = {n for n in r["data"] if n.startswith("headwise_")}
    assert {
        "headwise_requests_total",
        "headwise_queue_depth",
        "headwise_model_info",
        "headwise_batch_size_bucket",
        "headwise_request_duration_seconds_bucket",
    } <= names
    assert names <= exposed_metric_names(), names - exposed_metric_names()


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((DOCKER / "grafana" / "dashboards" / "headwise.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", WINDOW).replace("$instance", ".*")
            out.append((panel["title"], expr))
    return out


def test_dashboard_queries_evaluate_on_real_data(live_server, prometheus, scraped):
    # Traffic inside the rate window, so the rate and quantile panels have something to show.
    requests_panel = next(e for t, e in dashboard_queries() if t.startswith("Requests/s"))

    def encode_rate(result):
        return [
            r
            for r in result
            if r["metric"].get("endpoint") == "/encode" and float(r["value"][1]) > 0
        ]

    deadline = time.monotonic() + 60
    while not encode_rate(prometheus.query(requests_panel)):
        assert time.monotonic() < deadline, "requests/s never showed /encode traffic"
        encode(live_server, 3)
        time.sleep(1)

    results = {}
    for title, expr in dashboard_queries():
        results.setdefault(title, []).extend(
            prometheus.query(expr)
        )  # each one parses and evaluates

    [info] = results["Provider in use"]
    assert info["metric"]["provider"] == "CPUExecutionProvider"
    assert info["metric"]["device"] == "cpu" and info["metric"]["precision"]
    assert any(r["metric"].get("path") == "encode" for r in results["Queue depth"])
    latencies = [
        float(r["value"][1])
        for r in results["Latency p50 / p95 / p99"]
        if r["metric"].get("endpoint") == "/encode"
    ]
    assert latencies and all(math.isfinite(v) and v > 0 for v in latencies), latencies
    sizes = [
        float(r["value"][1]) for r in results["Batch size"] if r["metric"].get("path") == "encode"
    ]
    assert sizes and all(math.isfinite(v) and v >= 1 for v in sizes), sizes
    [ready] = results["Ready replicas"]
    assert ready["value"][1] == "1"


def test_hpa_adapter_query_evaluates(prometheus, scraped):
    """The adapter rule's metricsQuery, templated the way prometheus-adapter does it."""
    adapter = yaml.safe_load((K8S / "optional" / "prometheus-adapter-rules.yaml").read_text())
    [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    series = rule["seriesQuery"].split("{")[0]
    expr = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", 'job="headwise"')
        .replace("<<.GroupBy>>", "job")
    )
    [result] = prometheus.query(expr)
    assert result["metric"] == {"job": "headwise"}
    assert float(result["value"][1]) >= 0

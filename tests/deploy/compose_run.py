"""`make compose-test`: docker/compose.yaml run for real under podman-compose.

The export service writes the default model's bundle into the `models` volume and exits; headwise
(the cpu image, docker/compose.cpu.yaml) serves it; Prometheus, built from Debian's package,
scrapes it over the compose network. Checked: /encode against sentence-transformers, every scrape
target up, and the dashboard's queries answering with the traffic sent. The project is taken down
with its volumes whatever happens. Grafana is left out (docker/podman/compose.yaml says why).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

from tests.deploy.images import check_embeddings
from tests.deploy.podman import (
    BASE,
    PODMAN_ENV,
    ROOT,
    CheckFailed,
    Container,
    build,
    check,
    http,
    podman,
    timed,
    wait_until,
)

FILES = ["docker/compose.yaml", "docker/compose.cpu.yaml", "docker/podman/compose.yaml"]
PROMETHEUS_IMAGE = "localhost/headwise-prometheus:bookworm"
SERVICES = ["export", "headwise", "prometheus"]


def podman_compose() -> str:
    beside = Path(sys.executable).parent / "podman-compose"
    found = str(beside) if beside.exists() else shutil.which("podman-compose")
    if found is None:
        raise CheckFailed("podman-compose not found: make compose-test installs it")
    return found


def compose(project: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    files = [a for f in FILES for a in ("-f", str(ROOT / f))]
    done = subprocess.run(
        [podman_compose(), "-p", project, *files, *args],
        env={**PODMAN_ENV, "MODEL": "", "REVISION": ""},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise CheckFailed(
            f"podman-compose {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done


def container(project: str, service: str, port: int | None) -> Container:
    name = podman(
        "ps",
        "--all",
        "--format",
        "{{.Names}}",
        "--filter",
        f"label=io.podman.compose.project={project}",
        "--filter",
        f"label=com.docker.compose.service={service}",
    ).stdout.split()[0]
    host_port = None
    if port:
        host_port = int(podman("port", name, str(port)).stdout.split()[0].rsplit(":", 1)[1])
    return Container(name, host_port)


def prometheus_query(prom: Container, expr: str) -> list[dict]:
    url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http("GET", url, timeout=10)
    data = json.loads(body) if status == 200 else {}
    if data.get("status") != "success":
        raise CheckFailed(f"{expr!r}: {status} {body[:300]!r}")
    return data["data"]["result"]


def targets_up(prom: Container) -> bool:
    status, body = http("GET", f"{prom.url}/api/v1/targets", timeout=10)
    active = json.loads(body)["data"]["activeTargets"] if status == 200 else []
    return bool(active) and all(t["health"] == "up" for t in active)


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "headwise.json").read_text())
    return [
        (panel["title"], t["expr"].replace("$__rate_interval", "30s").replace("$instance", ".*"))
        for panel in dash["panels"]
        for t in panel.get("targets", [])
    ]


def run() -> None:
    build("export")
    build("cpu")
    with timed("build Prometheus from Debian's package"):
        podman(
            "build",
            "--format",
            "docker",
            "--build-arg",
            f"BASE={BASE}",
            "--tag",
            PROMETHEUS_IMAGE,
            "--file",
            str(ROOT / "docker/podman/prometheus.Containerfile"),
            str(ROOT / "docker/podman"),
            timeout=900,
        )
    project = f"headwise-check-{uuid.uuid4().hex[:8]}"
    try:
        with timed("compose up (export into the volume, then serve it)"):
            compose(project, "up", "-d", "--no-build", *SERVICES, timeout=900)
        exported = container(project, "export", None)
        check(exported.inspect("{{.State.ExitCode}}") == "0", "the export service exited 0")
        server = container(project, "headwise", 8000)
        prom = container(project, "prometheus", 9090)
        with timed("compose: headwise ready"):
            wait_until(
                "/ready",
                lambda: http("GET", f"{server.url}/ready", timeout=5)[0] == 200,
                180,
                alive=server.running,
            )
        check_embeddings(server)
        with timed("compose: Prometheus targets up"):
            wait_until("every scrape target up", lambda: targets_up(prom), 120, alive=prom.running)
        check(True, "Prometheus: every target up (headwise:8000 over the compose network)")
        requests_panel = next(e for t, e in dashboard_queries() if t.startswith("Requests/s"))

        def encode_traffic() -> bool:
            http("POST", f"{server.url}/encode", {"inputs": ["compose", "traffic"]})
            return any(
                r["metric"].get("endpoint") == "/encode" and float(r["value"][1]) > 0
                for r in prometheus_query(prom, requests_panel)
            )

        with timed("compose: dashboard shows the traffic"):
            wait_until("requests/s shows /encode", encode_traffic, 120)
        check(True, f"dashboard query answers: {requests_panel}")
        answered = {title: prometheus_query(prom, expr) for title, expr in dashboard_queries()}
        check(
            all(r is not None for r in answered.values()),
            f"all {len(answered)} dashboard queries evaluate",
        )
        [info] = answered["Provider in use"]
        check(
            info["metric"].get("provider") == "CPUExecutionProvider",
            f"Provider in use: {info['metric']}",
        )
    finally:
        with timed("compose down (containers and volumes)"):
            try:
                compose(project, "down", "--volumes", "--timeout", "45", timeout=180)
            except (CheckFailed, subprocess.TimeoutExpired) as exc:
                print(f"compose down: {exc}", file=sys.stderr)

"""Deploy checks: what images, compose and Kubernetes need from the repository, checked without a
Docker engine or a cluster (neither exists in CI), plus a real server scraped by a real Prometheus."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.server import free_port, launch, stop  # noqa: F401 - re-exported to the tests

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"


def tool(name: str) -> str:
    """A command-line tool from the [test] extra: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return found


def load_yaml(path: Path) -> dict:
    with path.open() as f:
        return yaml.safe_load(f)


def load_all_yaml(path: Path) -> list[dict]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def exposed_metric_names() -> set[str]:
    """Every sample name the service's /metrics can expose, from the app's own registry."""
    from service.metrics import Metrics

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes[family.type]
    }


def drain_timeout_default() -> float:
    from service.settings import Settings

    return float(Settings.model_fields["drain_timeout_s"].default)


@dataclass
class Server:
    url: str
    port: int
    log: Path


def isolated_env(**extra: str) -> dict[str, str]:
    """This environment without what would make another venv's Python import from elsewhere."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def start_server(
    command: list[str], bundle: Path, log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Server]:
    """`headwise serve` (from `command`) on a free loopback port, once /ready answers 200."""
    with log.open("wb") as out:
        try:
            proc, url = launch(bundle, None, out, 90, command=command, base_env=env, cwd=log.parent)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{log.read_text()}") from exc
    return proc, Server(url, int(url.rsplit(":", 1)[1]), log)


@pytest.fixture(scope="session")
def live_server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The checkout's service as a real process (`python -m service.cli serve`) on the tiny bundle."""
    log = tmp_path_factory.mktemp("live-server") / "server.log"
    proc, server = start_server([sys.executable, "-m", "service.cli"], tiny_bundle, log)
    try:
        yield server
    finally:
        stop(proc)

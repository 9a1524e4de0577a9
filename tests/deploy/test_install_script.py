"""docker/install.sh is every image's install step. CI cannot build images, so it runs the script
here: the CPU service mode for real in a fresh venv, the GPU and export modes as pip dry runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import DOCKER, ROOT, isolated_env, start_server, stop

SCRIPT = DOCKER / "install.sh"
# What the Dockerfile's `source` stage copies: the script must work from exactly this.
SOURCES = ["pyproject.toml", "README.md", "models", "export", "service", "docker/install.sh"]


def checkout_copy(dest: Path) -> Path:
    """The sources an image build sees, copied so that pip's in-tree build leaves the checkout alone."""
    for name in SOURCES:
        src, out = ROOT / name, dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, out)
    return dest / "docker" / "install.sh"


def run_script(script: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=isolated_env(PYTHON=sys.executable, **(env or {})),
        cwd=script.parent.parent.parent,  # outside the copy: nothing importable by accident
    )


def venv_python(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env=isolated_env(),
    )


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match.group(1)


def report_packages(report: Path) -> dict[str, str]:
    data = json.loads(report.read_text())
    return {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in data["install"]
    }


def test_script_is_valid_bash_and_refuses_unknown_modes(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK), "the Dockerfile runs it directly: it must be executable"
    bad = run_script(SCRIPT, "tpu", str(tmp_path / "venv"), timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)  # a cold pip cache downloads onnxruntime, numpy, tokenizers...
def test_cpu_mode_installs_a_serving_service_without_torch(tmp_path, tiny_bundle):
    script = checkout_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    done = run_script(script, "cpu", str(venv))
    assert done.returncode == 0, f"install.sh cpu failed:\n{done.stdout}\n{done.stderr}"
    assert "headwise cpu environment OK" in done.stdout

    # Imported from the venv's site-packages, not from a source folder.
    where = venv_python(venv, "import service.http.app, service; print(service.__file__)", tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv)
    no_torch = venv_python(venv, "import torch", tmp_path)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    ort = venv_python(venv, "import onnxruntime as o; print(o.get_available_providers())", tmp_path)
    assert "CPUExecutionProvider" in ort.stdout

    # The export side is absent and says so, instead of failing on an import.
    export = subprocess.run(
        [str(venv / "bin" / "headwise"), "export", "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=isolated_env(),
    )
    assert export.returncode == 2 and "[export] extra" in export.stderr

    # And what was installed serves: the console script, the package data, the whole app.
    proc, server = start_server(
        [str(venv / "bin" / "headwise")], tiny_bundle, tmp_path / "serve.log", env=isolated_env()
    )
    try:
        r = httpx.post(
            f"{server.url}/encode", json={"inputs": ["a deploy check", "and another"]}, timeout=30
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["embeddings"]) == 2
        assert httpx.get(f"{server.url}/attention/view", timeout=10).status_code == 200  # static/*
    finally:
        stop(proc)


@pytest.mark.slow
def test_gpu_mode_resolves_onnxruntime_gpu_and_no_torch(tmp_path):
    script = checkout_copy(tmp_path / "src")
    report = tmp_path / "gpu.json"
    done = run_script(script, "gpu", str(tmp_path / "venv"), "--dry-run", str(report))
    assert done.returncode == 0, f"install.sh gpu --dry-run failed:\n{done.stdout}\n{done.stderr}"
    packages = report_packages(report)
    # The image's CUDA base is chosen for this onnxruntime-gpu release: the two pins agree.
    assert packages.get("onnxruntime-gpu") == dockerfile_arg("ORT_GPU_VERSION")
    assert "headwise" in packages
    assert "onnxruntime" not in packages, "CPU onnxruntime would shadow onnxruntime-gpu's module"
    assert not {p for p in packages if p == "torch" or p.startswith("nvidia-")}, packages


@pytest.mark.slow
def test_export_mode_takes_torch_pin_from_pyproject(tmp_path):
    import tomllib

    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    torch_pin = next(r for r in pins["export"] if r.startswith("torch=="))
    script = checkout_copy(tmp_path / "src")
    report = tmp_path / "export.json"
    # PyPI here instead of PyTorch's CPU index: only the pin's plumbing is checked, nothing installed.
    done = run_script(
        script,
        "export",
        str(tmp_path / "venv"),
        "--dry-run",
        str(report),
        env={"TORCH_INDEX_URL": "https://pypi.org/simple"},
    )
    assert done.returncode == 0, (
        f"install.sh export --dry-run failed:\n{done.stdout}\n{done.stderr}"
    )
    version = report_packages(report)["torch"]
    assert version.split("+")[0] == torch_pin.removeprefix("torch==")


EXPORT_ENTRYPOINT = DOCKER / "export.sh"


def export_entrypoint(tmp_path: Path, env: dict[str, str], *args: str) -> list[str]:
    """The arguments docker/export.sh hands to `headwise` (a stand-in that prints them)."""
    fake = tmp_path / "bin" / "headwise"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["sh", str(EXPORT_ENTRYPOINT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{fake.parent}:/usr/bin:/bin", **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_export_entrypoint_without_model_exports_the_default_model(tmp_path):
    assert os.access(EXPORT_ENTRYPOINT, os.X_OK)
    out = ["--out", "/models/bundle", "--fp16"]
    assert export_entrypoint(tmp_path, {}, *out) == ["export", *out]
    assert export_entrypoint(tmp_path, {"MODEL": "", "REVISION": ""}, *out) == ["export", *out]


def test_export_entrypoint_takes_model_and_revision_from_the_environment(tmp_path):
    env = {"MODEL": "BAAI/bge-small-en-v1.5", "REVISION": "v1 with space"}
    assert export_entrypoint(tmp_path, env, "--out", "/o") == [
        "export",
        "--model",
        "BAAI/bge-small-en-v1.5",
        "--revision",
        "v1 with space",
        "--out",
        "/o",
    ]
    # An explicit flag comes later, so it wins (argparse keeps the last).
    args = export_entrypoint(tmp_path, {"MODEL": "/model"}, "--model", "/other", "--out", "/o")
    assert args == ["export", "--model", "/model", "--model", "/other", "--out", "/o"]

"""podman for the image checks (tests/deploy/images.py, compose_run.py): build on the stand-in
base with this machine's pip configuration, run a container that is removed whatever happens,
and the small helpers both need (timed steps, checks, bounded waits, HTTP)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "podman" / "containers.conf")}
BASE = "localhost/headwise-base:bookworm"
IMAGE = "localhost/headwise"  # :export, :cpu, :gpu

# pip's settings that the Dockerfile's install stages take as build arguments.
PIP_BUILD_ARGS = {
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_FIND_LINKS",
    "PIP_CERT",
    "PIP_CONSTRAINT",
}

TIMINGS: list[tuple[str, float]] = []


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)
    print(f"  ok  {what}", flush=True)


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    print(f"--- {step}", flush=True)
    start = time.monotonic()
    try:
        yield
    finally:
        TIMINGS.append((step, time.monotonic() - start))


def podman(*args: str, timeout: float = 120, check_rc: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout
    )
    if check_rc and done.returncode != 0:
        raise CheckFailed(
            f"podman {' '.join(args[:3])}... exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done


def wait_until(what: str, ready: Callable[[], bool], timeout_s: float, alive=lambda: True) -> None:
    """Poll `ready` until it holds; fail after `timeout_s`, or as soon as `alive` says no."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not alive():
            raise CheckFailed(f"{what}: the container is gone")
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.5)


# ---- building ---------------------------------------------------------------------------------


def pip_sources() -> tuple[list[str], list[str]]:
    """This machine's pip configuration for the builds: its config files and every local path they
    (or PIP_* variables) name, mounted read-only at the same place; PIP_* variables as build
    arguments. On a machine with a plain pip.conf this is just that file."""
    debug = subprocess.run(
        [sys.executable, "-m", "pip", "config", "debug"], capture_output=True, text=True, timeout=60
    ).stdout
    files = re.findall(r"^\s+(\S+), exists: True$", debug, re.M)
    values = re.findall(r"^\s+[\w.-]+[:=] ?'?([^'\n]*)'?$", debug, re.M)
    build_args = [f"{k}={v}" for k, v in os.environ.items() if k in PIP_BUILD_ARGS]
    paths = set(files)
    for value in values:
        for word in value.split():
            path = word.removeprefix("file://")
            if path.startswith("/") and Path(path).exists():
                # An index's folder, a find-links folder, a certificate or a constraints file.
                paths.add(str(Path(path).parent if path.endswith("/simple") else path))
    volumes = [f"--volume={p}:{p}:ro" for p in sorted(paths)]
    return volumes, [f"--build-arg={a}" for a in build_args]


def base_image() -> None:
    with timed("stand-in base image (debootstrap, kept when present)"):
        done = subprocess.run(
            [str(ROOT / "docker" / "podman" / "base.sh"), BASE],
            env=PODMAN_ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
        print(done.stdout.strip())
        if done.returncode != 0:
            raise CheckFailed(f"base image: {done.stderr[-3000:]}")


def build(target: str, *extra: str, timeout: float = 1800) -> str:
    tag = f"{IMAGE}:{target}"
    volumes, pip_args = pip_sources()
    args = [
        "build",
        "--format=docker",  # OCI, podman's default format, drops HEALTHCHECK
        f"--target={target}",
        f"--tag={tag}",
        f"--build-arg=PYTHON_IMAGE={BASE}",
        "--build-arg=TORCH_INDEX_URL=",  # PyTorch's index is out of reach: pip's configuration
        *pip_args,
        *volumes,
        *extra,
        str(ROOT),
    ]
    with timed(f"build --target {target}"):
        print("  $ podman " + " ".join(args), flush=True)
        podman(*args, timeout=timeout)
    return tag


def image_size_mb(tag: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout) / 1e6


# ---- running ----------------------------------------------------------------------------------


class Container:
    def __init__(self, name: str, port: int | None):
        self.name = name
        self.url = f"http://127.0.0.1:{port}" if port else ""

    def inspect(self, fmt: str) -> str:
        return podman("inspect", "--format", fmt, self.name).stdout.strip()

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name, check_rc=False)
        return state.stdout.strip() == "true"

    def logs(self) -> str:
        done = podman("logs", self.name, check_rc=False)
        return (done.stdout + done.stderr)[-4000:]


@contextlib.contextmanager
def run_container(image: str, *args: str, serve: bool = True) -> Iterator[Container]:
    """`podman run -d` as an operator would run the image: read-only, /tmp on a tmpfs, the port
    on loopback only. Removed on the way out whatever happened; its log is shown on a failure."""
    name = f"headwise-check-{uuid.uuid4().hex[:8]}"
    ports = ["-p", "127.0.0.1::8000"] if serve else []
    box = Container(name, None)
    try:
        podman("run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp", *ports, *args, image)
        if serve:
            port = podman("port", name, "8000").stdout.strip().rsplit(":", 1)[1]
            box = Container(name, int(port))
        yield box
    except BaseException:
        print(f"--- log of {name}:\n{box.logs()}", file=sys.stderr)
        raise
    finally:
        podman("rm", "--force", "--time", "0", name, check_rc=False, timeout=60)


def http(method: str, url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def wait_ready(box: Container, timeout_s: float = 180) -> None:
    with timed("container start to /ready 200"):
        wait_until(
            "/ready",
            lambda: http("GET", f"{box.url}/ready", timeout=5)[0] == 200,
            timeout_s,
            alive=box.running,
        )

"""Start `headwise serve` as a real process on a free loopback port (bench and tests share it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO


def stat_cpu_s(stat: str, ticks: int) -> float:
    """User + system CPU seconds from a /proc/PID/stat (or .../task/TID/stat) line: the 14th
    and 15th fields, counted after the command name (which may hold spaces and parentheses)."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU seconds so far of process `pid`, or of its thread `tid`."""
    path = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    return stat_cpu_s(path.read_text(), os.sysconf("SC_CLK_TCK"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bundle_flags(bundle: Path | list[str]) -> list[str]:
    bundles = bundle if isinstance(bundle, list) else [str(bundle)]
    return [flag for b in bundles for flag in ("--bundle", str(b))]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def launch(
    bundle: Path | list[str],
    env: dict[str, str] | None = None,
    output: IO | None = None,
    ready_s: float = 120,
    command: list[str] | None = None,
    base_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """The process and its URL once /ready answers 200; RuntimeError if it dies or stalls.

    `command` runs another installation's `headwise` (default: this interpreter's service.cli).
    `bundle` may be a list of `DIR` or `NAME=DIR`: one --bundle each, several models.
    """
    port = free_port()
    argv = [*(command or [sys.executable, "-m", "service.cli"]), "serve"]
    proc = subprocess.Popen(
        [*argv, *bundle_flags(bundle), "--port", str(port)],
        env={
            **(os.environ if base_env is None else base_env),
            "HEADWISE_LOG_LEVEL": "warning",
            "HEADWISE_HOST": "127.0.0.1",
            **(env or {}),
        },
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        cwd=cwd,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            get(f"{url}/ready")
            return proc, url
        except OSError:
            time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    raise RuntimeError(f"server exited ({proc.returncode}) or was not ready within {ready_s:g} s")


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM (the server drains and exits 0), then kill if it outlives the grace."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exported(bundle: Path) -> bool:
    """A bundle this headwise can serve is already there (its manifest's format is current)."""
    import json

    from service.manifest import FORMAT_VERSION

    manifest = bundle / "manifest.json"
    return manifest.exists() and json.loads(manifest.read_text()).get("format") == FORMAT_VERSION

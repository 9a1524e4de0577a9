"""A real `headwise serve` process on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Live:
    process: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(
    bundle: Path, tmp: Path, env: dict[str, str] | None = None, ready_s: float = 90
) -> Iterator[Live]:
    port = free_port()
    log = tmp / f"server-{port}.log"
    full_env = {**os.environ, "HEADWISE_LOG_LEVEL": "info", **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "serve",
                "--bundle",
                str(bundle),
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    live = Live(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{live.output()}")
            try:
                if httpx.get(f"{live.url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"server not ready in {ready_s}s:\n{live.output()}")
        yield live
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

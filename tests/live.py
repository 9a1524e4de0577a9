"""A real `headwise serve` process on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.server import launch, stop


@dataclass
class Live:
    process: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(
    bundle: Path | list[str], tmp: Path, env: dict[str, str] | None = None, ready_s: float = 90
) -> Iterator[Live]:
    log = tmp / f"server-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        try:
            proc, url = launch(bundle, {"HEADWISE_LOG_LEVEL": "info", **(env or {})}, out, ready_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{log.read_text(errors='replace')}") from exc
    live = Live(proc, url, log)
    try:
        yield live
    finally:
        stop(proc)

"""A command's wall time and peak resident memory, measured as a child of its own.

getrusage(RUSAGE_CHILDREN) reports the largest child a process ever waited for, so the command
runs under a fresh Python wrapper whose only child it is: its peak is the command's alone
(the export's, not that of whatever ran before it in the caller).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

_WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.monotonic()
done = subprocess.run(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
print(json.dumps({"rc": done.returncode, "seconds": time.monotonic() - t0, "peak_rss": peak}))
"""


@dataclass(frozen=True)
class Measured:
    returncode: int
    seconds: float
    peak_rss_bytes: int
    stderr: str


def run_measured(
    command: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> Measured:
    """Run `command`; its exit code, wall time, peak RSS and stderr (its stdout is dropped)."""
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return Measured(report["rc"], report["seconds"], report["peak_rss"], done.stderr)

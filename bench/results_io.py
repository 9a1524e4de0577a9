"""What every benchmark records about the machine, and how it saves what it measured."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any


def vector_flags() -> list[str]:
    """The vector and matrix extensions the CPU has (/proc/cpuinfo, as lscpu names them): figures
    differ between AVX2, AVX-512 and AMX machines."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = re.search(r"^flags\s*:\s*(.+)$", text, flags=re.M)
    return sorted(
        {
            f
            for f in (flags.group(1).split() if flags else [])
            if re.match(r"avx2$|avx512|amx|avx_vnni", f)
        }
    )


def cpu_flags() -> str:
    """vector_flags() as one string ("none" without any)."""
    return " ".join(vector_flags()) or "none"


def machine() -> dict[str, Any]:
    """The fields every result records about where and when it was measured."""
    from service.engine.cpu import cores

    available = cores()
    return {
        "cpus": available.usable,  # those this process may use (taskset, a cpuset, a quota)
        "machine_cpus": available.machine,
        "cpu_flags": cpu_flags(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }


def cpu_machine() -> dict[str, Any]:
    """machine() and the CPU as headwise's runtime choice reads it (model, flags it shows)."""
    from service.engine.cpu import detect

    cpu = detect()
    return {**machine(), "cpu_model": cpu.model, "cpu_shown": cpu.shown}


def where(m: dict[str, Any]) -> str:
    """A report's line on a cpu_machine(): cores, CPU, flags, when."""
    flags = ", ".join(m["cpu_shown"]) or "none"
    cores = m["cpus"]
    if m.get("machine_cpus", cores) != cores:
        cores = f"{cores} of {m['machine_cpus']}"
    return f"{cores} cores, {m['cpu_model']}, flags: {flags}; {m['when']}"


def save(out: Path, name: str, results: dict[str, Any], report: str) -> None:
    """out/name.json (the figures) and out/name.md (the report), and the report printed: the
    command's output."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{name}.md").write_text(report)
    print(report)  # noqa: T201 - the report is the command's output

"""What this CPU has: its model name and the instruction-set flags that decide a runtime.

Linux lists them in /proc/cpuinfo (what `lscpu` prints as Flags). The ones that matter here:
`amx_bf16`, `amx_int8`, `amx_tile` (Intel Sapphire Rapids and later: matrix units), `avx512_bf16`
(AMD Zen 4/5, Intel Cooper Lake and later: bf16 dot products), `avx512_vnni` / `avx_vnni`
(int8 dot products), `avx512f`, `avx2`. A machine without /proc/cpuinfo (macOS, a sandbox)
reads as having none of them: fp32 is served, as everywhere without bf16 units.

And how many of its CPUs this process may use (`cores`): those its affinity allows (taskset, a
container's cpuset), and no more than its container's CPU quota (cgroup `cpu.max`, what
Kubernetes' `limits.cpu` and `docker --cpus` set). ONNX Runtime sizes its default thread pool to
the machine's physical cores, blind to both: a 4-CPU pod on a node of 32 cores would run 32
threads throttled to 4 CPUs' time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The flags shown in /info and the log, in this order: those that choose a runtime first.
SHOWN = (
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "avx512f",
    "avx2",
)


@dataclass(frozen=True)
class Cpu:
    model: str
    flags: frozenset[str]

    @property
    def bf16(self) -> bool:
        """Units that compute bf16 natively (OpenVINO runs bf16 only on these)."""
        return bool({"amx_bf16", "avx512_bf16"} & self.flags)

    @property
    def shown(self) -> list[str]:
        """The flags that matter here that this CPU has (`lscpu` shows them all)."""
        return [f for f in SHOWN if f in self.flags]

    def describe(self) -> str:
        return ", ".join(self.shown) or "none of " + ", ".join(SHOWN[-2:])


def parse(text: str) -> Cpu:
    """/proc/cpuinfo's text -> its first processor's model name and flags."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return Cpu(model or "unknown", flags)


@functools.cache
def detect(path: Path = CPUINFO) -> Cpu:
    """Read once per process: /info asks on every call, and the flags do not change."""
    try:
        return parse(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return Cpu("unknown", frozenset())


# cgroup v2's cpu.max ("QUOTA PERIOD" or "max PERIOD"), then v1's quota (-1: none) by its period.
CGROUP_CPU = (
    Path("/sys/fs/cgroup/cpu.max"),
    Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    Path("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
)


def quota_cpus(paths: Sequence[Path]) -> tuple[int | None, str]:
    """Whole CPUs the container's quota allows (rounded down, at least 1), and what said so;
    None where there is no quota."""
    for path in paths:
        try:
            text = path.read_text().strip()
            if path.name == "cpu.max":
                quota, _, period = text.partition(" ")
            else:
                quota, period = text, (path.parent / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            continue
        if quota in ("max", "-1") or not quota.isdigit() or not period.isdigit():
            return None, f"no CPU quota ({path}: {text})"
        whole = max(1, int(quota) // max(1, int(period)))
        return whole, f"the container's CPU quota ({path}: {text})"
    return None, "no readable CPU quota"


@dataclass(frozen=True)
class Cores:
    usable: int  # the threads a runtime should run
    machine: int  # the CPUs the machine has (os.cpu_count)
    why: str

    @property
    def restricted(self) -> bool:
        """Fewer than the machine's: a runtime left to count for itself would count too many."""
        return self.usable < self.machine

    def describe(self) -> dict[str, object]:
        return {"usable": self.usable, "machine": self.machine, "why": self.why}


def allowed_cpus() -> list[int]:
    """The CPUs this process's affinity allows (taskset, a cpuset); every CPU off Linux."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cores(paths: Sequence[Path] | None = None) -> Cores:
    """The CPUs this process may use: its affinity's, capped by its container's CPU quota.
    Read on each call (cheap): sessions are built a few times a process."""
    machine = os.cpu_count() or 1
    allowed = len(allowed_cpus())
    quota, source = quota_cpus(CGROUP_CPU if paths is None else paths)
    if quota is not None and quota < allowed:
        return Cores(quota, machine, f"{source}: {quota} of {machine} CPUs")
    if allowed < machine:
        return Cores(
            allowed, machine, f"its CPU affinity (taskset, cpuset): {allowed} of {machine}"
        )
    return Cores(machine, machine, f"all {machine} CPUs ({source})")


def threads_for(threads: int) -> int:
    """A runtime's thread count for HEADWISE_THREADS-style `threads`: that many, or for 0 the
    runtime's own count (0) on a process free to use every CPU, else one per CPU it may use.
    ONNX Runtime counts the machine's cores, not the process's: pinned to 2 of a 16-core Xeon's
    CPUs (taskset), its fp32 graph ran at its 16-core rate (1,204 texts/s against 1,237
    unpinned, where OpenVINO's fell to 257), so its threads ran on CPUs it was not given."""
    if threads:
        return threads
    available = cores()
    return available.usable if available.restricted else 0


# OpenVINO streams (batches computed at once) for HEADWISE_OPENVINO_STREAMS=0, by usable CPUs.
# bench.streams, 32 clients sending one text a request against one client's short text: on 2
# CPUs (AMD EPYC, bf16) 2 streams gave 1.16x the texts/s at 1.28x one text's p50, so 1; on 16
# (a Xeon with AMX, bf16) 2 streams gave 1.26x (rounds 1.18-1.51x) at 1.05x, 8 gave 1.48x at
# 1.33x, so 2. On 2 cores of a Xeon with AMX, since a batch alone runs on a compile with every
# thread (engine/alone.py): 2 streams 1.09-1.11x the texts/s at 32 clients (one text or 32 a
# request), 1.24x for one client of 32 texts, at 0.99x one text's p50 (2026-12-05), so 2 there.
# Not measured: 3-15 CPUs without AMX (1), past 16 (2). Either way a second stream only where
# the memory limit has room for it (registry.stream_room; else HEADWISE_OPENVINO_STREAMS=1).
STREAMS_FROM = 16
AMX = "amx_bf16"


def auto_streams(usable: int, flags: frozenset[str] = frozenset()) -> int:
    return 2 if usable >= STREAMS_FROM or (usable >= 2 and AMX in flags) else 1


@dataclass(frozen=True)
class Share:
    """One worker's part of the CPUs (HEADWISE_WORKERS): the CPUs it is pinned to (None: not
    pinned, a container's quota being what limits the process) and the threads it runs."""

    cpus: list[int] | None
    threads: int


def share(index: int, count: int, allowed: Sequence[int] | None = None,
          quota: int | None = None) -> Share:  # fmt: skip
    """Worker `index` of `count`: where the process's affinity is what limits it, its own slice
    of the allowed CPUs (consecutive, sizes differing by at most one; past one worker a CPU,
    CPUs are shared round-robin) and one thread per CPU of it; where a CPU quota is tighter, no
    pinning (the quota is the container's, not a CPU's) and the quota's CPUs split as evenly.
    allowed / quota: the process's (os.sched_getaffinity, the cgroup's) unless given."""
    cpus = allowed_cpus() if allowed is None else list(allowed)
    if quota is None:
        quota, _ = quota_cpus(CGROUP_CPU)
    if quota is not None and quota < len(cpus):
        return Share(None, _part(quota, index, count))
    if count >= len(cpus):
        return Share([cpus[index % len(cpus)]], 1)
    size = _part(len(cpus), index, count)
    start = sum(_part(len(cpus), i, count) for i in range(index))
    return Share(cpus[start : start + size], size)


def _part(total: int, index: int, count: int) -> int:
    """`total` split in `count` parts differing by at most one (at least 1 each): part `index`."""
    return max(1, total // count + (1 if index < total % count else 0))

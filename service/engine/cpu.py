"""What this CPU has: its model name and the instruction-set flags that decide a runtime.

Linux lists them in /proc/cpuinfo (what `lscpu` prints as Flags). The ones that matter here:
`amx_bf16`, `amx_int8`, `amx_tile` (Intel Sapphire Rapids and later: matrix units), `avx512_bf16`
(AMD Zen 4/5, Intel Cooper Lake and later: bf16 dot products), `avx512_vnni` / `avx_vnni`
(int8 dot products), `avx512f`, `avx2`. A machine without /proc/cpuinfo (macOS, a sandbox)
reads as having none of them: fp32 is served, as everywhere without bf16 units.
"""

from __future__ import annotations

import functools
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

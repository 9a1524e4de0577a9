"""Process memory: what the kernel says we hold now, the most we ever held, the bound the
settings and models allow, and whether it fits the memory the server may use.

Read from /proc (Linux); elsewhere both read 0 rather than fail. A model's size is its graphs'
bytes on disk, external data included (a graph past 2 GiB keeps its weights beside it): ONNX
Runtime holds about that much once the graph is loaded. The serving graph counts for every
model, the attention graph for every model that serves /attention (a second copy of the
weights: for a large model, the larger part of what /attention costs).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def process_rss_bytes(pid: int) -> tuple[int, int]:
    """Another process's resident set size now and its high-water mark (/proc/PID/status's
    VmRSS, VmHWM); (0, 0) for a process gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key in ("VmRSS", "VmHWM") and len(parts) == 2 and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024  # kB
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def peak_rss_bytes() -> int:
    """The high-water mark of the resident set since the process started."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# Measured on all-MiniLM-L6-v2 (d 384, 12 heads) with bench/arena.py and the peak RSS of one
# run per shape: a padded batch of T tokens, N long, peaks at about T x (64 d + 4 h N) bytes
# over the loaded graph (64x256: 558 MB measured, 604 MB by the formula; 128x128: 474 / 503).
# An /attention call holds its graph output (about 8 bytes a number), the selected copy (4)
# and its JSON (about 13, twice while it is joined): 40 bytes a number is the bound used.
ATTENTION_BYTES_PER_NUMBER = 40


def encode_batch_bytes(max_batch_tokens: int, max_length: int, d_model: int, heads: int) -> int:
    """Peak working memory of the serving graph on the largest batch the batcher may form."""
    n = min(max_length, max_batch_tokens)
    return max_batch_tokens * (64 * d_model + 4 * heads * n)


def attention_bytes(budget_numbers: int) -> int:
    """Everything the /attention calls in flight together may hold (their shared budget)."""
    return budget_numbers * ATTENTION_BYTES_PER_NUMBER


def request_bytes(max_body_bytes: int) -> int:
    """Per concurrent request: its body, the parsed texts, and its answer (about 3 bodies)."""
    return 3 * max_body_bytes


# Requests whose bodies are near max_body_bytes, in flight at once, that the bound allows for.
LARGE_REQUESTS = 8


def memory_budget(
    warm_bytes: int,
    graphs: list[tuple[int, int, int, int]],
    max_batch_tokens: int,
    attention_budget_numbers: int,
    attention_models: int,
    max_body_bytes: int,
    concurrent_requests: int,
    outputs_bytes: int = 0,
    models_bytes: int = 0,
) -> dict[str, int]:
    """The documented peak: warm + every serving batcher's largest batch at once + the attention
    budgets + the requests in flight (+ what sparse and multi-vector outputs add: SPLADE's
    vocabulary-wide logits, the token vectors in flight). graphs: (batchers, max_length,
    d_model, heads) a model. models_bytes: the loaded graphs' bytes, reported (warm, measured
    once loaded, holds them)."""
    encode = sum(
        batchers * encode_batch_bytes(max_batch_tokens, n, d, h) for batchers, n, d, h in graphs
    )
    attention = attention_models * attention_bytes(attention_budget_numbers)
    requests = concurrent_requests * request_bytes(max_body_bytes)
    return {
        "warm_bytes": warm_bytes,
        "models_bytes": models_bytes,
        "encode_batches_bytes": encode,
        "attention_bytes": attention,
        "requests_bytes": requests,
        "concurrent_requests": concurrent_requests,
        "outputs_bytes": outputs_bytes,
        "bound_bytes": warm_bytes + encode + attention + requests + outputs_bytes,
    }


# cgroup v2, then v1; a value this large (v1's "no limit", 2^63 rounded to pages) is no limit.
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
UNLIMITED = 2**60


class MemoryBoundError(RuntimeError):
    """The models and settings need more memory than the server may use; names which model."""


@dataclass(frozen=True)
class ModelCost:
    """What one served model adds to the bound."""

    name: str
    graph_bytes: int  # the graphs it loads (serving, and attention when served), data included
    working_bytes: int  # its serving batchers' largest batches at once and its /attention budget


def memory_limit(setting: int | None, cgroup: Sequence[Path] = CGROUP_LIMITS) -> tuple[int, str]:
    """The memory the server may use, and where that figure comes from; (0, why) for none.
    setting: HEADWISE_MEMORY_LIMIT_BYTES (None: the container's cgroup limit; 0: no check)."""
    if setting is not None:
        if setting == 0:
            return 0, "HEADWISE_MEMORY_LIMIT_BYTES=0: not checked"
        return setting, "HEADWISE_MEMORY_LIMIT_BYTES"
    for path in cgroup:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED:
            return int(text), f"the container's cgroup limit ({path})"
        return 0, f"no cgroup limit ({path}: {text})"
    return 0, "no readable cgroup limit"


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fit(
    costs: Sequence[ModelCost], base_bytes: int, requests: int, limit: int, source: str
) -> None:
    """The bound (the process before its models, each model's graphs and working memory, the
    requests in flight) under `limit`, or MemoryBoundError naming the first model that passes
    it and by how much."""
    if limit <= 0:
        return
    total = base_bytes + requests
    before: list[str] = []
    for cost in costs:
        total += cost.graph_bytes + cost.working_bytes
        if total > limit:
            others = f"with {', '.join(before)}, " if before else ""
            raise MemoryBoundError(
                f"model {cost.name!r} does not fit in memory: its graphs take "
                f"{gib(cost.graph_bytes)} and its largest batches and /attention budget "
                f"{gib(cost.working_bytes)}; {others}the process ({gib(base_bytes)}) and the "
                f"requests in flight ({gib(requests)}) the bound is {gib(total)}, "
                f"{gib(total - limit)} over the limit of {gib(limit)} ({source}). Serve fewer "
                "models, or lower HEADWISE_MAX_BATCH_TOKENS, a bundle's max length (export "
                "--max-length) or /attention's cost (HEADWISE_ATTENTION_ENABLED=false)"
            )
        before.append(f"{cost.name!r} ({gib(cost.graph_bytes + cost.working_bytes)})")


def _libc(name: str) -> Callable[..., int] | None:
    try:
        import ctypes

        function: Callable[..., int] = getattr(ctypes.CDLL("libc.so.6"), name)
        return function
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc("malloc_trim")
_MALLOPT = _libc("mallopt")
M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = 2**20) -> bool:
    """Have glibc map every block of `threshold` bytes or more on its own, and unmap it when
    freed. By default the threshold grows to 32 MB as blocks are freed, and a run's freed
    activations then stay resident until a trim: one (4, 700)-token run of a 28-layer model
    held 2 GB past its weights, none of it live. For a process that runs a few large batches
    (export's checks), not for a server's steady load. False if not glibc."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_MMAP_THRESHOLD, threshold))


def trim() -> bool:
    """Hand freed heap memory back to the kernel (glibc keeps it in its arenas otherwise: freed
    blocks under its mmap threshold, which grows to 32 MB, stay resident). False if not glibc."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True

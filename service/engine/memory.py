"""Process memory: what the kernel says we hold now, and the most we ever held.

Read from /proc (Linux); elsewhere both read 0 rather than fail.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


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
) -> dict[str, int]:
    """The documented peak: warm + every serving batcher's largest batch at once + the attention
    budgets + the requests in flight (+ what sparse and multi-vector outputs add: SPLADE's
    vocabulary-wide logits, the token vectors in flight). graphs: (batchers, max_length,
    d_model, heads) a model."""
    encode = sum(
        batchers * encode_batch_bytes(max_batch_tokens, n, d, h) for batchers, n, d, h in graphs
    )
    attention = attention_models * attention_bytes(attention_budget_numbers)
    requests = concurrent_requests * request_bytes(max_body_bytes)
    return {
        "warm_bytes": warm_bytes,
        "encode_batches_bytes": encode,
        "attention_bytes": attention,
        "requests_bytes": requests,
        "concurrent_requests": concurrent_requests,
        "outputs_bytes": outputs_bytes,
        "bound_bytes": warm_bytes + encode + attention + requests + outputs_bytes,
    }


def _libc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _libc_trim()


def trim() -> bool:
    """Hand freed heap memory back to the kernel (glibc keeps it in its arenas otherwise: freed
    blocks under its mmap threshold, which grows to 32 MB, stay resident). False if not glibc."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True

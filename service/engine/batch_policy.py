"""What a batch is made of: the queued items, the policy's bounds, and the choice of the next
batch (the oldest text plus its nearest-length neighbours). Pure functions, no event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Item:
    ids: Sequence[int]
    future: asyncio.Future[Any]
    enqueued: float
    deadline: float
    types: Sequence[int] | None = None  # token type ids (text pairs), same length as ids
    mask: Sequence[int] | None = None  # its own attention mask (0 = left out); None: all ones
    started: float = 0.0  # when its batch began inference
    inference_s: float = 0.0

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def queue_s(self) -> float:
        return max(0.0, self.started - self.enqueued)


@dataclass
class BatchPolicy:
    max_batch_tokens: int = 16384
    # A batch holds at most this many seconds of work at the measured throughput (0: no bound),
    # so that the batch running never holds an answer long past its deadline.
    max_batch_s: float = 0.0
    max_batch_size: int = 64
    max_wait_s: float = 0.002
    max_padding_ratio: float = 0.1
    padding_slack: int = 8  # a few padding tokens are cheaper than a separate run
    max_queue: int = 4096
    window: int = 8  # look at this many batches' worth of the oldest texts when grouping
    assumed_tokens_per_s: float = 2000.0  # until batches are measured (admission)
    inline_max_tokens: int = 0  # padded tokens of a batch that may run on the loop when idle
    # Attention costs n² where everything else costs n: a token of an n-long sequence costs
    # (1 + n / quadratic_at) tokens of work, quadratic_at = 6 d_model (where the n x d score and
    # weighted-sum products equal the 24 d² of the projections and FFN). 0: linear.
    quadratic_at: int = 0

    def work(self, rows: int, n: int) -> float:
        """The work of `rows` sequences of (padded) length n, in tokens of a short text."""
        scale = 1.0 + n / self.quadratic_at if self.quadratic_at else 1.0
        return rows * n * scale


def select_batch(
    queue: Sequence[Item], policy: BatchPolicy, max_work: float | None = None
) -> list[Item]:
    """The oldest item plus its nearest-length neighbours, within the token budget, at most
    `max_work` of work (policy.work) and the padding bounds. The oldest item always goes,
    whatever its size."""

    def fits(count: int, longest: int) -> bool:
        if longest * count > policy.max_batch_tokens:
            return False
        return max_work is None or policy.work(count, longest) <= max_work

    window = list(queue[: policy.max_batch_size * policy.window])
    anchor = window[0]
    ordered = sorted(window, key=lambda it: it.length)
    i = ordered.index(anchor)
    lo = hi = i
    longest, real = anchor.length, anchor.length
    while hi - lo + 1 < policy.max_batch_size:
        count = hi - lo + 2
        padded_now = longest * (count - 1)
        options = []  # (padding ratio, extra padding tokens, side, new longest)
        for side, j in ((-1, lo - 1), (1, hi + 1)):
            if 0 <= j < len(ordered):
                length = ordered[j].length
                new_longest = max(longest, length)
                padded = new_longest * count
                extra = padded - padded_now - length
                options.append((1 - (real + length) / padded, extra, side, new_longest))
        options = [o for o in options if fits(count, o[3])]
        if not options:
            break
        padding, extra, side, new_longest = min(options, key=lambda o: (o[1], o[0]))
        if padding > policy.max_padding_ratio and extra > policy.padding_slack:
            break
        if side < 0:
            lo -= 1
            real += ordered[lo].length
        else:
            hi += 1
            real += ordered[hi].length
        longest = new_longest
    return ordered[lo : hi + 1]

"""What a batch is made of: the queued items, the policy's bounds, the choice of the next
batch (the oldest text plus its nearest-length neighbours), and the batches a set of lengths
makes (what admission prices). Pure functions, no event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Item:
    ids: Sequence[int]
    future: asyncio.Future[Any]
    enqueued: float
    deadline: float
    types: Sequence[int] | None = None  # token type ids (text pairs), same length as ids
    mask: Sequence[int] | None = None  # its own attention mask (0 = left out); None: all ones
    gates: Any = None  # its head gates, an (L, h) array (0 = head left out); None: all ones
    pixels: Any = None  # an image's pixel values (C, H, W) (a vision tower's item)
    started: float = 0.0  # when its batch began inference
    inference_s: float = 0.0
    batch_size: int = 0  # its batch's texts and padded tokens (traces)
    batch_tokens: int = 0

    length: int = field(init=False)  # len(ids), kept: read in every pass over the queue

    def __post_init__(self) -> None:
        self.length = len(self.ids)

    @property
    def queue_s(self) -> float:
        return max(0.0, self.started - self.enqueued)


@dataclass
class BatchPolicy:
    max_batch_tokens: int = 16384
    # A batch holds at most this many seconds of work at its measured cost (0: no bound), so
    # that the batch running never holds an answer long past its deadline.
    max_batch_s: float = 0.0
    max_batch_size: int = 64
    max_wait_s: float = 0.002
    max_padding_ratio: float = 0.1
    padding_slack: int = 8  # a few padding tokens are cheaper than a separate run
    max_queue: int = 4096
    window: int = 8  # look at this many batches' worth of the oldest texts when grouping
    inline_max_tokens: int = 0  # padded tokens of a batch that may run on the loop when idle


# The most rows a batch of this padded length may hold (its time bound; every smaller batch of
# that length within it too).
Within = Callable[[int], int]


def packed(
    lengths: Sequence[int], policy: BatchPolicy, within: Within | None = None
) -> Iterator[tuple[int, int]]:
    """The batches (rows, padded length) these sequences make when they are batched alone:
    longest first, each as full as the token budget, the size and `within` allow."""
    ordered = sorted(lengths, reverse=True)
    i = 0
    while i < len(ordered):
        longest = max(1, ordered[i])
        most = min(len(ordered) - i, policy.max_batch_size, policy.max_batch_tokens // longest)
        if within is not None:
            most = min(most, within(longest))
        rows = max(1, most)
        yield rows, longest
        i += rows


def select_batch(
    queue: Sequence[Item], policy: BatchPolicy, within: Within | None = None
) -> list[Item]:
    """The oldest item plus its nearest-length neighbours, within the token budget, the time
    bound (`within`) and the padding bounds. The oldest item always goes, whatever its size."""

    def fits(count: int, longest: int) -> bool:
        if longest * count > policy.max_batch_tokens:
            return False
        return within is None or count <= within(longest)

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

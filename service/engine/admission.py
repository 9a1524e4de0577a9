"""Admission sized to capacity: refuse at once what cannot finish by its deadline.

Each batcher measures the padded tokens a second it computes (a token-weighted moving average
of its recent batches; `capacity_tokens_per_s` until it has measured any). A request whose own
work would take longer than the whole request timeout is refused with 413, naming how many
inputs would fit; one that would fit alone but not behind the work ahead of it (queued and
running, on every serving batcher of the same model, which share its cores) gets 429 with
Retry-After. Either way before any of its batches is computed, so no work is thrown away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from service.errors import Overloaded, PayloadTooLarge


class Throughput:
    """Padded tokens a second, from the batches computed (recent ones weigh most)."""

    def __init__(self, assumed: float, decay: float = 0.9) -> None:
        self.assumed = assumed
        self.decay = decay
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, padded_tokens: float, seconds: float) -> None:
        self._tokens = self._tokens * self.decay + padded_tokens
        self._seconds = self._seconds * self.decay + seconds

    @property
    def measured(self) -> bool:
        return self._seconds > 0

    @property
    def tokens_per_s(self) -> float:
        return self._tokens / self._seconds if self._seconds > 0 else self.assumed


class Backlogged(Protocol):
    """What admission reads of a batcher."""

    throughput: Throughput

    def backlog_s(self) -> float: ...
    def cost(self, lengths: Sequence[int], padding_ratio: float = 0.0) -> float: ...
    def rejected(self, reason: str) -> None: ...


class Admission:
    """One for the serving batchers that share the device (the CPU's cores, or one GPU): every
    model's, since a batch of one model delays the others' as much as its own. Work admitted
    but not yet queued (being tokenised) is promised: it counts as ahead of later requests, so
    a burst that arrives at once is not all admitted against an empty queue."""

    def __init__(self, timeout_s: float, padding_ratio: float, headroom: float = 1.0) -> None:
        """headroom: the share of a deadline admission plans to fill (the rest absorbs what the
        measured rate does not see: the CPU that parsing and tokenising the requests around it
        take, two models' batches contending for the cores)."""
        self.timeout_s = timeout_s
        self.padding_ratio = padding_ratio
        self.headroom = headroom
        self.batchers: list[Backlogged] = []
        self.promised_s = 0.0

    def ahead_s(self) -> float:
        """Seconds of work promised, queued and running on the batchers."""
        return self.promised_s + sum(b.backlog_s() for b in self.batchers)

    def release(self, seconds: float) -> None:
        """A promise kept (the work was queued) or withdrawn (the request ended first)."""
        self.promised_s = max(0.0, self.promised_s - seconds)

    def admit(self, batcher: Backlogged, lengths: Sequence[int], remaining_s: float) -> float:
        """The seconds of work promised for these texts on `batcher` (release them once queued);
        PayloadTooLarge (413) or Overloaded (429) when they cannot meet their deadline
        (remaining_s from now)."""
        rate = batcher.throughput
        tokens_per_s = rate.tokens_per_s
        own = batcher.cost(lengths, self.padding_ratio) / tokens_per_s
        source = "measured" if rate.measured else "assumes (HEADWISE_CAPACITY_TOKENS_PER_S)"
        budget_s = self.timeout_s * self.headroom
        if own > budget_s:
            fit = max(1, math.floor(len(lengths) * budget_s / own * 0.8))
            batcher.rejected("over_capacity")
            raise PayloadTooLarge(
                f"{len(lengths)} inputs of {sum(lengths)} tokens need about {own:.0f} s at the "
                f"{tokens_per_s:.0f} tokens/s this server {source}, past "
                f"{100 * self.headroom:.0f} % of the request deadline of {self.timeout_s:g} s "
                "(HEADWISE_REQUEST_TIMEOUT_S, HEADWISE_ADMISSION_HEADROOM): send at most about "
                f"{fit} such inputs a request",
                param="inputs",
            )
        ahead = self.ahead_s() if batcher in self.batchers else batcher.backlog_s() + self.promised_s
        usable_s = remaining_s - self.timeout_s * (1 - self.headroom)  # the headroom kept free
        if ahead + own > usable_s:
            batcher.rejected("queue_too_long")
            raise Overloaded(
                f"the work queued and running ahead needs about {ahead:.1f} s at "
                f"{tokens_per_s:.0f} tokens/s: this request could not finish within its "
                f"deadline ({max(0.0, remaining_s):.1f} s left of {self.timeout_s:g} s); "
                "retry later or send fewer inputs",
                retry_after=max(1.0, ahead + own - usable_s),
            )
        self.promised_s += own
        return own

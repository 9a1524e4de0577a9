"""Admission sized to capacity: refuse at once what cannot finish by its deadline.

Each batcher predicts what a request's sequences will take, batched as its policy batches them,
from its session's measured cost (service/engine/cost.py: calibrated at warm-up, refined by the
batches served). A request whose own work would take longer than the share of the deadline
admission plans to fill is refused with 413, naming how many such inputs would fit; one that
would fit alone but not behind the work ahead of it (queued and running, on every serving
batcher of the device, which share its cores) gets 429 with Retry-After. Either way before any
of its batches is computed, so no work is thrown away.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.engine.cost import CostModel, Device
from service.errors import Overloaded, PayloadTooLarge


class Backlogged(Protocol):
    """What admission reads of a batcher."""

    cost: CostModel

    def backlog_s(self) -> float: ...
    def predict(self, lengths: Sequence[int]) -> float: ...
    def rejected(self, reason: str) -> None: ...


def fitting(batcher: Backlogged, lengths: Sequence[int], budget_s: float) -> int:
    """How many of these inputs (the first k, at least one) fit in budget_s."""
    lo, hi = 1, len(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batcher.predict(lengths[:mid]) <= budget_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Admission:
    """One for the serving batchers that share the device (the CPU's cores, or one GPU): every
    model's, since a batch of one model delays the others' as much as its own. Work admitted
    but not yet queued (being tokenised) is promised: it counts as ahead of later requests, so
    a burst that arrives at once is not all admitted against an empty queue."""

    def __init__(
        self, timeout_s: float, headroom: float = 1.0, device: Device | None = None
    ) -> None:
        """headroom: the share of a deadline admission plans to fill (the rest absorbs what the
        measured cost does not see: the CPU that parsing and tokenising the requests around it
        take, two models' batches contending for the cores). device: the batchers that share
        the cores (its batchers', and any others': /attention's)."""
        self.timeout_s = timeout_s
        self.headroom = headroom
        self.device = device if device is not None else Device()
        self.batchers: list[Backlogged] = []
        self.promised_s = 0.0

    def ahead_s(self) -> float:
        """Seconds of work promised, queued and running on the batchers."""
        return self.promised_s + sum(b.backlog_s() for b in self.batchers)

    def release(self, seconds: float) -> None:
        """A promise kept (the work was queued) or withdrawn (the request ended first)."""
        self.promised_s = max(0.0, self.promised_s - seconds)

    def admit(
        self,
        batcher: Backlogged,
        lengths: Sequence[int],
        remaining_s: float,
        unit: str = "inputs",
        deadline_s: float | None = None,
    ) -> float:
        """The seconds of work promised for these texts on `batcher` (release them once queued);
        PayloadTooLarge (413) or Overloaded (429) when they cannot meet their deadline
        (remaining_s from now). deadline_s: the request's own deadline, when shorter than the
        server's (a gRPC client's): the headroom kept free is that deadline's share."""
        own = batcher.predict(lengths)
        source = batcher.cost.source
        budget_s = self.timeout_s * self.headroom
        if own > budget_s:
            fit = fitting(batcher, lengths, budget_s)
            batcher.rejected("over_capacity")
            raise PayloadTooLarge(
                f"{len(lengths)} {unit} of {sum(lengths)} tokens need about {own:.1f} s on this "
                f"server (its cost per batch {source}), past "
                f"{100 * self.headroom:.0f} % of the request deadline of {self.timeout_s:g} s "
                "(HEADWISE_REQUEST_TIMEOUT_S, HEADWISE_ADMISSION_HEADROOM): send at most about "
                f"{fit} such {unit} a request",
                param="inputs",
            )
        ahead = self.ahead_s() if batcher in self.batchers else batcher.backlog_s() + self.promised_s
        span_s = self.timeout_s if deadline_s is None else min(self.timeout_s, deadline_s)
        usable_s = remaining_s - span_s * (1 - self.headroom)  # the headroom kept free
        if ahead + own > usable_s:
            batcher.rejected("queue_too_long")
            raise Overloaded(
                f"the work queued and running ahead needs about {ahead:.1f} s and this request "
                f"about {own:.1f} s (cost {source}): it could not finish within its "
                f"deadline ({max(0.0, remaining_s):.1f} s left of {span_s:g} s); "
                "retry later or send fewer inputs",
                retry_after=max(1.0, ahead + own - usable_s),
            )
        self.promised_s += own
        return own

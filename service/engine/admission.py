"""Admission sized to capacity: refuse at once what cannot finish by its deadline.

Each batcher predicts what a request's sequences will take, batched as its policy batches them,
from its session's measured cost (service/engine/cost.py: calibrated at warm-up, refined by the
batches served). A request whose own work would take longer than the share of the deadline
admission plans to fill is refused with 413, naming how many such inputs would fit; one that
would fit alone but not behind the work ahead of it (queued and running, on every serving
batcher of the device, which share its cores) gets 429 with Retry-After. Either way before any
of its batches is computed, so no work is thrown away.

A request's own work is its batches and, before they exist, its preparation (tokenising its
texts: service/engine/preparing.py), which takes the same cores: admitted before tokenising, a
request promises both; the preparation's share is released when its sequences exist, the
batches' once they are queued (the batchers count them then).

The predictions are of work run alone. Under load the runs overlap (several streams, several
models, tokenising beside them) and work them off slower: the seconds admission sums are divided
by the device's pace, measured from the runs served (engine/cost.py, `Device`); what is promised
stays as predicted. A stated rate (HEADWISE_CAPACITY_TOKENS_PER_S) is taken as it is.

Promises keep their order (a request's place in line). A request admitted before tokenising is
admitted again on its exact sequences, behind only what was promised before its place: work
admitted after it was admitted behind it, and must not turn it away once it has been tokenised
(under a flood every request was refused after tokenising, behind the promises of the hundreds
admitted after it, and none answered).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from service.engine.cost import CostModel, Device
from service.engine.preparing import PrepareCost
from service.errors import Overloaded, PayloadTooLarge


class Backlogged(Protocol):
    """What admission reads of a batcher."""

    cost: CostModel

    def backlog_s(self) -> float: ...
    def predict(self, lengths: Sequence[int]) -> float: ...
    def rejected(self, reason: str) -> None: ...


def fitting(
    batcher: Backlogged, lengths: Sequence[int], budget_s: float, each_s: float = 0.0
) -> int:
    """How many of these inputs (the first k, at least one) fit in budget_s (each_s: an input's
    share of the preparation, on top of its batches)."""
    lo, hi = 1, len(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batcher.predict(lengths[:mid]) + mid * each_s <= budget_s:
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
        self.promised_s = 0.0  # the promises' sum (their batches)
        self._promises: dict[int, float] = {}  # place -> seconds, in the order of the places
        # place -> the characters it has still to tokenise, at their model's rate: priced when
        # read, so that a rate measured under a flood reprices every promise made before it.
        self._tokenising: dict[int, tuple[PrepareCost, int]] = {}
        self._places = itertools.count(1)

    def place(self) -> int:
        """A new place in line, behind every promise made so far (nothing promised yet)."""
        place = next(self._places)
        self._promises[place] = 0.0
        return place

    def promised_until(self, place: int | None) -> float:
        """Seconds promised at places up to `place`, its own included (None: all)."""
        later = 0.0
        if place is not None:
            for p in reversed(self._promises):  # the latest first: usually few or none
                if p <= place:
                    break
                later += self._promises[p]
        tokenising = sum(
            cost.seconds(chars)
            for p, (cost, chars) in self._tokenising.items()
            if place is None or p <= place
        )
        return max(0.0, self.promised_s - later) + tokenising

    def promised_at(self, place: int) -> float:
        """Seconds of batches promised at this place (0 once released)."""
        return self._promises.get(place, 0.0)

    def ahead_s(self, place: int | None = None) -> float:
        """Seconds of work promised (up to `place`), queued and running on the batchers."""
        return self.promised_until(place) + sum(b.backlog_s() for b in self.batchers)

    def saturated(self) -> Overloaded | None:
        """The refusal every new request would get (the work ahead already fills the share of a
        deadline admission plans to fill), or None: a server in a flood answers it before
        reading a body, instead of reading and parsing each only to refuse it."""
        ahead = self.ahead_s() / self.device.pace
        over = ahead - self.timeout_s * self.headroom
        if over < 0:
            return None
        return Overloaded(
            f"the work queued and running ahead needs about {ahead:.1f} s, past "
            f"{100 * self.headroom:.0f} % of the request deadline of {self.timeout_s:g} s: "
            "nothing more is admitted until some of it has run; retry later",
            retry_after=max(1.0, over),
        )

    def release(self, place: int) -> None:
        """A promise kept (the work was queued) or withdrawn (the request ended first)."""
        self.promised_s -= self._promises.pop(place, 0.0)
        self._tokenising.pop(place, None)
        if not self._promises or self.promised_s < 0:
            self.promised_s = max(0.0, sum(self._promises.values()))

    def clear(self, place: int) -> None:
        """Nothing promised at `place` any more, the place kept (a request tokenised: admitted
        again on its exact sequences, at the place it had)."""
        if place in self._promises:
            self.promised_s -= self._promises[place]
            self._promises[place] = 0.0
        self._tokenising.pop(place, None)

    def admit(
        self,
        batcher: Backlogged,
        lengths: Sequence[int],
        remaining_s: float,
        unit: str = "inputs",
        deadline_s: float | None = None,
        tokenising: tuple[PrepareCost, int] | None = None,
        place: int | None = None,
    ) -> int:
        """The place where these texts' work on `batcher` is promised (release it once queued);
        PayloadTooLarge (413) or Overloaded (429) when they cannot meet their deadline
        (remaining_s from now). deadline_s: the request's own deadline, when shorter than the
        server's (a gRPC client's): the headroom kept free is that deadline's share. tokenising:
        the characters still to tokenise before these texts exist, at their model's rate
        (engine/preparing.py), promised with them.
        place: the request's place (its other lane's promise, or the one it was admitted at
        before tokenising): only what was promised up to it is ahead (default: a new place,
        behind everything, released here if refused)."""
        fresh = place is None or place not in self._promises
        if place is None or fresh:
            place = self.place()
        prepare_s = tokenising[0].seconds(tokenising[1]) if tokenising is not None else 0.0
        try:
            own = self._check(batcher, lengths, remaining_s, unit, deadline_s, prepare_s, place)
        except BaseException:
            if fresh:
                self.release(place)
            raise
        self._promises[place] = self._promises.get(place, 0.0) + own - prepare_s
        self.promised_s += own - prepare_s
        if tokenising is not None:
            self._tokenising[place] = tokenising
        return place

    def _check(
        self,
        batcher: Backlogged,
        lengths: Sequence[int],
        remaining_s: float,
        unit: str,
        deadline_s: float | None,
        prepare_s: float,
        place: int,
    ) -> float:
        """The seconds these texts need as predicted (what is promised), or the refusal. The
        predictions are of work run alone; the wall time it takes is theirs over the device's
        measured pace (engine/cost.py, Device: under load, runs overlap and work slower), except
        one sequence's with nothing ahead of it: one batch, run alone, as calibration timed it
        (a long document on an idle server is not refused for what a flood measured)."""
        promised = batcher.predict(lengths) + prepare_s
        pace = 1.0 if batcher.cost.fixed_tokens_per_s is not None else self.device.pace
        single = len(lengths) == 1
        own = promised if single else promised / pace  # at best: alone
        source = batcher.cost.source
        if pace < 0.995:
            source = f"{source}, worked off at {pace:.2f}x under load"
        budget_s = self.timeout_s * self.headroom
        if own > budget_s:
            fit = fitting(batcher, lengths, budget_s * pace, prepare_s / max(1, len(lengths)))
            batcher.rejected("over_capacity")
            raise PayloadTooLarge(
                f"{len(lengths)} {unit} of {sum(lengths)} tokens need about {own:.1f} s on this "
                f"server (its cost per batch {source}"
                f"{f', {prepare_s:.1f} s of it tokenising' if prepare_s >= 0.05 else ''}), past "
                f"{100 * self.headroom:.0f} % of the request deadline of {self.timeout_s:g} s "
                "(HEADWISE_REQUEST_TIMEOUT_S, HEADWISE_ADMISSION_HEADROOM): send at most about "
                f"{fit} such {unit} a request",
                param="inputs",
            )
        ahead = (
            self.ahead_s(place)
            if batcher in self.batchers
            else batcher.backlog_s() + self.promised_until(place)
        ) / pace
        if ahead > 0:  # beside other work: its own runs overlap theirs
            own = promised / pace
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
        return promised

"""What keeps /attention from starving serving: a budget across calls, and a CPU share.

Budget: the layers x heads x tokens² of every call in flight together stay under one number
(the per-call bound does not bound the sum); a call that does not fit is answered 429 with
Retry-After at once. Pacer: calls run one at a time, and after a call that took t seconds the
next starts no sooner than t x (1/share - 1) later, so /attention's graph, statistics and
serialisation take at most `share` of the time, whatever the number of clients.

A pacer may be given the serving traffic (`Others`): then it pauses only when others wanted the
cores during the last call, that is when their work was queued or running as it began, or they
queued more since. Its calls share the serving batcher (explanations), so a pause while nobody
else wants the cores would only slow them down; an /encode that arrives meanwhile waits for at
most the one call running, and the pause after it is taken in full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from service.engine.batch_policy import BatchPolicy
from service.errors import Overloaded, PayloadTooLarge


class Budget:
    """what: the calls it bounds; setting: the variable that sets it; advice: what to send."""

    def __init__(
        self,
        limit: int,
        report: Callable[[int], None] | None = None,
        what: str = "/attention call",
        setting: str = "HEADWISE_ATTENTION_BUDGET_NUMBERS",
        advice: str = "select fewer layers or heads",
    ) -> None:
        self.limit = limit
        self.used = 0
        self._report = report or (lambda used: None)
        self.what, self.setting, self.advice = what, setting, advice

    @asynccontextmanager
    async def hold(self, numbers: int, retry_after: float) -> AsyncIterator[None]:
        if numbers > self.limit:  # would never fit: waiting cannot help
            raise PayloadTooLarge(
                f"this {self.what} computes {numbers} numbers, more than the "
                f"{self.limit} all calls may hold together ({self.setting}): "
                "send a shorter input"
            )
        if self.used + numbers > self.limit:
            raise Overloaded(
                f"{self.what}s in flight hold {self.used} of {self.limit} numbers "
                f"({self.setting}); this one needs {numbers}: retry later, "
                f"or {self.advice}",
                retry_after=retry_after,
            )
        self.used += numbers
        self._report(self.used)
        try:
            yield
        finally:
            self.used -= numbers
            self._report(self.used)


class Others(Protocol):
    """The work other requests give the cores a pacer shares."""

    def queued(self) -> int: ...  # texts they ever queued
    def waiting(self) -> bool: ...  # some of it is queued or running now


class Pacer:
    def __init__(self, share: float, others: Others | None = None) -> None:
        self.share = share
        self._lock = asyncio.Lock()
        self._next = 0.0  # monotonic time the next call may start
        self.last_s = 0.0  # how long the last call took
        self._others = others  # None: always pause
        self._seen = 0  # what others had queued when the last call began
        self._contended = False  # and whether some of it was still waiting or running then
        self.paused_s = 0.0  # pauses taken, in all (tests, bench)

    def _others_wanted(self) -> bool:
        """Whether others wanted the cores during the last call (always, without `others`)."""
        o = self._others
        return o is None or self._contended or o.queued() != self._seen

    @property
    def wait_s(self) -> float:
        """Roughly how long a call arriving now waits for its turn."""
        return max(0.0, self._next - time.monotonic()) + (self.last_s if self._lock.locked() else 0)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._lock:
            delay = self._next - time.monotonic()
            if delay > 0 and self._others_wanted():
                await asyncio.sleep(delay)  # the pause that gives the cores back to serving
                self.paused_s += delay
            if self._others is not None:
                self._seen, self._contended = self._others.queued(), self._others.waiting()
            started = time.monotonic()
            try:
                yield
            finally:
                self.last_s = time.monotonic() - started
                self._next = time.monotonic() + self.last_s * (1 / self.share - 1)


def one_call_at_a_time(max_tokens: int, queue: int) -> BatchPolicy:
    """An /attention batcher's policy: one call at a time (the pacer), a batch of one, its
    memory that of one input."""
    return BatchPolicy(
        max_batch_tokens=max_tokens,
        max_batch_size=1,
        max_wait_s=0.0,
        max_padding_ratio=1.0,
        max_queue=queue,
    )

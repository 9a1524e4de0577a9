"""Admission sized to capacity: refuse at once what cannot finish within its deadline.

The batcher measures the padded tokens a second it computes (a token-weighted moving average
of its recent batches; `capacity_tokens_per_s` until it has measured any). A request whose own
work would take longer than its deadline at that rate is refused with 413, naming how many
inputs would fit; one that would fit alone but not behind the queue ahead of it gets 429 with
Retry-After. Either way before any of its batches is computed, so no work is thrown away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.errors import Overloaded, PayloadTooLarge


class Throughput:
    """Padded tokens a second, from the batches computed (recent ones weigh most)."""

    def __init__(self, assumed: float, decay: float = 0.9) -> None:
        self.assumed = assumed
        self.decay = decay
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, padded_tokens: int, seconds: float) -> None:
        self._tokens = self._tokens * self.decay + padded_tokens
        self._seconds = self._seconds * self.decay + seconds

    @property
    def measured(self) -> bool:
        return self._seconds > 0

    @property
    def tokens_per_s(self) -> float:
        return self._tokens / self._seconds if self._seconds > 0 else self.assumed


def padded(lengths: Sequence[int], padding_ratio: float) -> float:
    """The tokens these texts will cost in batches whose padding stays under the ratio."""
    return sum(lengths) / (1 - min(padding_ratio, 0.5))


def admit(
    lengths: Sequence[int],
    queued_tokens: int,
    rate: Throughput,
    timeout_s: float,
    padding_ratio: float,
) -> None:
    """Raise PayloadTooLarge (413) or Overloaded (429) when the work cannot meet its deadline."""
    tokens_per_s = rate.tokens_per_s
    own = padded(lengths, padding_ratio) / tokens_per_s
    source = "measured" if rate.measured else "assumes (HEADWISE_CAPACITY_TOKENS_PER_S)"
    if own > timeout_s:
        fit = max(1, math.floor(len(lengths) * timeout_s / own * 0.8))
        raise PayloadTooLarge(
            f"{len(lengths)} inputs of {sum(lengths)} tokens need about {own:.0f} s at the "
            f"{tokens_per_s:.0f} tokens/s this server {source}, past the request deadline of "
            f"{timeout_s:g} s (HEADWISE_REQUEST_TIMEOUT_S): send at most about {fit} such inputs "
            "a request",
            param="inputs",
        )
    ahead = padded([queued_tokens], 0.0) / tokens_per_s
    if ahead + own > timeout_s:
        raise Overloaded(
            f"the {queued_tokens} tokens queued ahead need about {ahead:.0f} s at "
            f"{tokens_per_s:.0f} tokens/s: this request could not finish within its deadline "
            f"of {timeout_s:g} s; retry later or send fewer inputs",
            retry_after=max(1.0, ahead + own - timeout_s),
        )

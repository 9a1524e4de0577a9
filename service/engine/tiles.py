"""The length OpenVINO runs a batch at: its longest text's, or that rounded up to the CPU's tile.

On AMX (2 cores of a Xeon, OpenVINO 2026.4, bf16) a batch whose length is a multiple of 16
tokens runs markedly faster than a shorter one: 8 texts of 32 tokens 5.4 ms, of 30 tokens 6.7 ms,
of 46 tokens 10.6 ms against 8.2 ms at 48 (bench/tiles.py). The matrix units take 16 rows at a
time and a length past a multiple of 16 leaves the kernels a tail to do apart. OpenVINO's fp32
runs follow the tokens instead (36.7 ms at 32, 36.4 at 30), and a text alone gains little.

So the length is measured, never assumed: at start the compiled model runs 8 texts and then one
text at each length past one tile (17 .. 31 tokens) and at two tiles (32), the best of two passes.
A remainder past a tile is worth padding away when its own length ran slower than the full tile
(by more than 2 %), and so did every longer remainder: the least such remainder is the threshold
(None: nothing is padded). About 1.5 s of start on 2 cores with AMX. The padding is
the masked kind every batch already has (a shorter text beside a longer one): no real token
attends to it and pooling skips it, so the answers do not change beyond the precision's own
rounding, and the token-level outputs are cut back to the batch's own length.

Up to one tile (16 tokens) nothing is padded: there the kernels' tail is a batch's whole length,
and padding measured slower (4 texts of 9 tokens 2.0 ms, of 16 tokens 2.4 ms).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TILE = 16
PROBE_ROWS = (8, 1)  # a batch under load, a text alone
# padded with 0s (masked); a set, as each run checks its feeds against it
TOKEN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
# A length counts as slower than the full tile past this share: what is left is the machine's
# noise, and a tie is not worth the padding.
MARGIN = 0.02


@dataclass(frozen=True)
class Padding:
    """The least remainder past a multiple of `tile` that a batch is padded up from, for a batch
    of several rows and for one row alone (None: never), and why (the probe's figures)."""

    tile: int = TILE
    rows: int | None = None
    row: int | None = None
    reason: str = "not measured"
    measured_ms: dict[int, dict[int, float]] = field(default_factory=dict)

    def length(self, rows: int, n: int, most: int | None = None) -> int:
        """The length a batch of `rows` rows, the longest `n` tokens, runs at; never past `most`
        (the graph's positions: a model's max_length)."""
        least = self.row if rows == 1 else self.rows
        extra = n % self.tile
        if least is None or n <= self.tile or extra == 0 or extra < least:
            return n
        padded = n - extra + self.tile
        return n if most is not None and padded > most else padded

    def describe(self) -> dict[str, Any]:
        return {
            "tile": self.tile,
            "least_remainder_padded": {"batches": self.rows, "one_text": self.row},
            "reason": self.reason,
            # by rows, then by length (JSON's keys are strings)
            "measured_ms": {
                str(r): {str(n): v for n, v in ms.items()} for r, ms in self.measured_ms.items()
            },
        }


def never(reason: str) -> Padding:
    return Padding(reason=reason)


def threshold(ms: dict[int, float], tile: int = TILE) -> int | None:
    """From one batch size's times by length (tile + 1 .. 2 * tile): the least remainder whose
    length, and every longer one's, ran slower than the full tile by more than MARGIN; None when
    the last did not."""
    full = ms[2 * tile] * (1 + MARGIN)
    least = None
    for extra in range(tile - 1, 0, -1):
        if ms[tile + extra] <= full:
            break
        least = extra
    return least


def measure(time_of: Callable[[int, int], float], tile: int = TILE, passes: int = 2) -> Padding:
    """time_of(rows, length): a run's seconds at that shape (the best of a few). The threshold
    for batches (8 rows) and for a text alone, and the figures they came from: each shape the
    best of `passes` passes over the lengths, so that a moment's noise on a shared machine
    falls on one pass, not on one length."""
    got: dict[int, dict[int, float]] = {}
    for rows in PROBE_ROWS:
        lengths = range(tile + 1, 2 * tile + 1)
        runs = [{n: time_of(rows, n) * 1e3 for n in lengths} for _ in range(passes)]
        got[rows] = {n: min(run[n] for run in runs) for n in lengths}
    several, alone = threshold(got[PROBE_ROWS[0]], tile), threshold(got[PROBE_ROWS[1]], tile)

    def said(least: int | None, what: str) -> str:
        if least is None:
            return f"{what} at their own length (no remainder ran slower than the full tile)"
        return f"{what} padded to the next multiple of {tile} from {least} tokens past one"

    reason = f"measured at start: {said(several, 'batches')}; {said(alone, 'a text alone')}"
    rounded = {r: {n: round(v, 3) for n, v in ms.items()} for r, ms in got.items()}
    return Padding(tile, several, alone, reason, rounded)

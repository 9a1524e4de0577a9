"""What a batch costs, in seconds, on this machine: measured, never assumed.

A batch of `rows` sequences padded to n tokens takes

    t(rows, n) = a + b·rows·n + c·rows·n²

a: the fixed cost of a run (the call, its allocations); b: a token's work through the
projections and FFN (linear in tokens); c: attention's scores and weighted sums (each token
against every other: n² per sequence). The three are fitted by non-negative least squares on
relative error, so short and long batches are predicted equally well. Real kernels are not that
smooth (on a 2-core EPYC, all-MiniLM-L6-v2's cost a token varies 2x between batch shapes of
similar size), so a prediction is the fit times a correction: the measured over the fitted time
of the nearest measured shapes (inverse-distance weighted in log rows and log length). Inside
the measured shapes it follows them; past them (longer inputs than the budget allowed) it is
the fit, scaled as its nearest measurements were. Both are made from:

- the calibration: warm-up times the session at a few shapes up to the longest it serves
  (service/engine/calibrate.py), before /ready says 200;
- the batches served since, the recent ones only, and only those that ran alone on the device
  (another batch computing beside it shares the cores and would make this one look slower).

One `CostModel` per serving session (a model's main lane, its long lane, its attention graph):
the batchers that run the same session share it. `fixed_tokens_per_s` (the operator's
HEADWISE_CAPACITY_TOKENS_PER_S) replaces the measurement with a stated rate.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Batches served that refine the calibration: the latest this many that ran alone.
RECENT = 64
REFIT = 8
# The fit is redone at most this often, however many batches are served. A refit is a few
# hundred µs of numpy: on every mispredicted batch (on a shared VM a short text's time moves
# by a quarter between minutes) it was a tenth of one short text's time over HTTP, and every
# REFIT batches it was 37 refits a second for one client, 1.8 % of the event loop's time
# (py-spy, bench.profile; 0.06 % once at most once a second).
MIN_REFIT_GAP_S = 1.0
NEAREST = 4  # measured shapes a correction is weighted from
# Predictions are kept until the next refit, a table of ROWS (or more) row counts per padded
# length, made in one numpy pass: admission packs the whole queue for every request, asking
# for a batch of every size at each length. One numpy correction per shape asked (the memo
# before it: 4,096 shapes, cleared whole when full and at every refit) was 30 % of the event
# loop's time under 32 clients of 32 texts (py-spy, 2 AMX cores).
ROWS = 64
LENGTHS = 1024  # lengths with a table, at most (all dropped when full)


@dataclass(frozen=True)
class Sample:
    rows: int
    n: int  # padded length
    seconds: float


@dataclass(frozen=True)
class Fit:
    """t(rows, n) = batch_s + token_s·rows·n + pair_s·rows·n² (all >= 0)."""

    batch_s: float
    token_s: float
    pair_s: float

    def seconds(self, rows: Any, n: int) -> Any:
        """rows: a count, or an array of them (the times come back alike)."""
        return self.batch_s + rows * n * (self.token_s + n * self.pair_s)


def _terms(samples: Sequence[Sample]) -> np.ndarray:
    rows = np.array([s.rows for s in samples], dtype=np.float64)
    n = np.array([s.n for s in samples], dtype=np.float64)
    return np.stack([np.ones_like(n), rows * n, rows * n * n], axis=1)


def fit(samples: Sequence[Sample]) -> Fit:
    """Non-negative least squares on relative error: each sample's row divided by its time.
    Three terms: every subset of them is solved, the best with no negative coefficient kept."""
    if not samples:
        raise ValueError("no sample to fit")
    t = np.array([max(s.seconds, 1e-9) for s in samples], dtype=np.float64)
    x = _terms(samples) / t[:, None]
    y = np.ones(len(samples))
    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)  # columns of very different magnitudes
    best: tuple[float, np.ndarray] | None = None
    for k in (1, 2, 3):
        for cols in itertools.combinations(range(3), k):
            sub = x[:, cols] / scale[list(cols)]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (coef < 0).any():
                continue
            residual = float(((sub @ coef - y) ** 2).sum())
            if best is None or residual < best[0] - 1e-12:
                full = np.zeros(3)
                full[list(cols)] = coef / scale[list(cols)]
                best = (residual, full)
    assert best is not None  # one column alone always has a non-negative solution
    a, b, c = (float(v) for v in best[1])
    return Fit(a, b, c)


class CostModel:
    def __init__(
        self, fixed_tokens_per_s: float | None = None, quadratic_at: int = 0, learns: bool = True
    ) -> None:
        """fixed_tokens_per_s: a stated rate instead of measurements (padded tokens a second,
        a token of an n-long sequence counting 1 + n / quadratic_at). learns: served batches
        refine it (False: their time is not the machine's, as a test's gated fake's)."""
        self.fixed_tokens_per_s = fixed_tokens_per_s
        self.learns = learns
        self.quadratic_at = quadratic_at
        self.calibration: list[Sample] = []
        self.recent: deque[Sample] = deque(maxlen=RECENT)
        self.calibration_s = 0.0  # how long the calibration took
        self.served = 0  # batches that refined it
        self._fit: Fit | None = None
        self._points = np.zeros((0, 2))  # measured shapes, (log rows, log n)
        self._ratios = np.zeros(0)  # their measured over fitted time
        self._tables: dict[int, np.ndarray] = {}  # padded length -> seconds of 1, 2, ... rows
        self._caps: dict[tuple[int, float, int], int] = {}  # rows_within's answers
        self.generation = 0  # counts refits: a prediction cached elsewhere is stale once it moves
        self._refitted_at = -MIN_REFIT_GAP_S  # when observe last asked for a refit
        self._pending = 0  # batches observed since then

    @property
    def source(self) -> str:
        """How its figures were obtained, for messages, /info and logs."""
        if self.fixed_tokens_per_s is not None:
            return "set (HEADWISE_CAPACITY_TOKENS_PER_S)"
        if self.calibration:
            return "measured"
        return "measured by batches served" if self._fit is not None else "not measured yet"

    @property
    def measured(self) -> bool:
        return self.fixed_tokens_per_s is not None or self._fit is not None

    @property
    def current(self) -> Fit | None:
        if self.fixed_tokens_per_s is not None:
            q = self.quadratic_at
            per_token = 1.0 / self.fixed_tokens_per_s
            return Fit(0.0, per_token, per_token / q if q else 0.0)
        return self._fit

    @property
    def longest_measured(self) -> int:
        return max((s.n for s in itertools.chain(self.calibration, self.recent)), default=0)

    def calibrate(self, samples: Iterable[Sample], seconds: float = 0.0) -> None:
        self.calibration = list(samples)
        self.calibration_s = seconds
        self._refit()

    def observe(self, rows: int, n: int, seconds: float, defer: bool = False) -> bool:
        """A batch that ran alone on the device: its time refines the fit. The fit is redone
        once REFIT batches were observed since the last refit, or sooner when this one was
        mispredicted by a quarter or more, but at most once every MIN_REFIT_GAP_S. True: a
        refit is due, and done unless `defer` (the batcher calls `refit` once the batch's
        answers are handed over: not on their path)."""
        if self.fixed_tokens_per_s is not None or not self.learns or seconds <= 0:
            return False
        predicted = self.seconds(rows, n)
        self.recent.append(Sample(rows, n, seconds))
        self.served += 1
        self._pending += 1
        off = predicted <= 0 or abs(seconds / predicted - 1) >= 0.25
        now = time.monotonic()
        if not (off or self._pending >= REFIT) or now - self._refitted_at < MIN_REFIT_GAP_S:
            return False
        self._refitted_at = now
        self._pending = 0
        if not defer:
            self.refit()
        return True

    def refit(self) -> None:
        """The fit redone over the calibration and the batches served since."""
        self._refit()

    def _refit(self) -> None:
        samples = [*self.calibration, *self.recent]
        self._tables, self._caps = {}, {}
        self.generation += 1
        self._fit = fit(samples) if samples else None
        if self._fit is None:
            return
        f = self._fit
        self._points = np.log([[s.rows, s.n] for s in samples])
        self._ratios = np.array([s.seconds / max(f.seconds(s.rows, s.n), 1e-12) for s in samples])

    def _corrections(self, rows: np.ndarray, n: int) -> np.ndarray:
        """The measured over the fitted time near each of these shapes at length n (1: nothing
        measured), in one pass (squared distances: the weights are their inverses; the nearest
        found by partition)."""
        if self.fixed_tokens_per_s is not None or not len(self._ratios):
            return np.ones(len(rows))
        points = self._points
        across = (np.log(rows)[:, None] - points[None, :, 0]) ** 2
        squared = across + (np.log(n) - points[:, 1]) ** 2
        k = min(NEAREST, squared.shape[1])
        nearest = np.argpartition(squared, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(squared, nearest, axis=1)
        exact = near.min(axis=1) < 1e-18
        out = np.empty(len(rows))
        for i in np.flatnonzero(exact):  # measured: exactly its shape (recent ones averaged)
            out[i] = self._ratios[squared[i] < 1e-18].mean()
        rest = ~exact
        weights = 1.0 / near[rest]
        out[rest] = (weights * self._ratios[nearest[rest]]).sum(axis=1) / weights.sum(axis=1)
        return out

    def _table(self, n: int, rows: int) -> np.ndarray:
        """Predicted seconds of 1, 2, ... (at least `rows`) rows of n tokens, until the refit."""
        table = self._tables.get(n)
        if table is None or len(table) < rows:
            f = self.current
            assert f is not None
            size = max(ROWS, rows, 2 * len(table) if table is not None else 0)
            r = np.arange(1, size + 1, dtype=np.float64)
            table = f.seconds(r, n) * self._corrections(r, n)
            if len(self._tables) >= LENGTHS:
                self._tables = {}
            self._tables[n] = table
        return table

    def seconds(self, rows: int, n: int) -> float:
        """A batch's predicted time; 0 until anything was measured (then nothing is refused)."""
        f = self.current
        if f is None:
            return 0.0
        if rows < 1 or n < 1:
            return float(f.seconds(rows, n))
        return float(self._table(n, rows)[rows - 1])

    def rows_within(self, n: int, limit_s: float, most: int) -> int:
        """The most rows of n tokens (at most `most`) a batch may hold with it and every smaller
        batch of that length predicted within limit_s: 0 when one row is past it."""
        if self.current is None or n < 1:
            return most
        key = (n, limit_s, most)
        cap = self._caps.get(key)
        if cap is None:
            over = self._table(n, most)[:most] > limit_s
            cap = int(np.argmax(over)) if over.any() else most
            if len(self._caps) >= LENGTHS:
                self._caps = {}
            self._caps[key] = cap
        return cap

    def describe(self) -> dict[str, object]:
        """The figures /info shows."""
        f = self.current
        return {
            "source": self.source,
            "batch_s": f.batch_s if f else None,
            "token_s": f.token_s if f else None,
            "token_length_s": f.pair_s if f else None,
            "calibration": [[s.rows, s.n, round(s.seconds, 6)] for s in self.calibration],
            "calibration_s": round(self.calibration_s, 3),
            "longest_measured": self.longest_measured,
            "batches_served": self.served,
        }


# The device's pace (predicted seconds of work completed a second while it computes) is
# weighted over about this many busy seconds, and starts as if PACE_PRIOR_S of them had gone
# at the predicted rate (1), a weight that fades as the others': a few short runs do not move it
# far, a flood's seconds do.
PACE_TAU_S = 5.0
PACE_PRIOR_S = 0.5
PACE_FLOOR = 0.05  # the slowest pace admission divides by


class Device:
    """The batchers that share the cores (or one GPU): whether a batch ran alone on them, and how
    fast they work off what their runs were predicted to take.

    A batch's prediction is what it takes run alone (calibration times it so, and only runs that
    were alone refine it). Under load the runs overlap: several streams of one model, two models'
    batches, tokenising beside them. Measured on 2 AMX cores (MiniLM bf16 on two OpenVINO streams,
    batches of ~45 texts of ~100 tokens): one model's flood worked off 0.8 predicted seconds a
    second, its cross-encoder's beside it 0.74 (each batch took 4-5x its prediction, four at a
    time), so admission that summed predictions promised a deadline the work ahead missed by a
    third. `pace` is that rate, measured: the predicted seconds of the runs that finished over
    the seconds some run was computing (the union of their intervals, not their sum).

    Called by the threads that compute the runs (and the loop, for its inline ones)."""

    def __init__(self) -> None:
        self._active: set[int] = set()
        self._shared: set[int] = set()  # runs that overlapped another
        self._starts = 0
        self._lock = threading.Lock()
        self._predicted: dict[int, float] = {}  # measured runs computing: ticket -> prediction
        self._mark = 0.0  # when the busy seconds were last counted up to
        # Seconds some measured run was computing, and the predicted seconds of the runs that
        # finished in them, each weighted by its recency: PACE_PRIOR_S of each at first.
        self._busy_s = PACE_PRIOR_S
        self._done_s = PACE_PRIOR_S

    def enter(self, predicted_s: float | None = None) -> int:
        """A run begins. predicted_s: its predicted time, to measure the pace by (None: a run
        whose time tells nothing of the machine's, as a fake backend's or a stated rate's)."""
        with self._lock:
            self._starts += 1
            ticket = self._starts
            if self._active:
                self._shared |= self._active | {ticket}
            self._active.add(ticket)
            if predicted_s is not None:
                if not self._predicted:
                    self._mark = time.monotonic()
                self._predicted[ticket] = predicted_s
            return ticket

    def leave(self, ticket: int) -> bool:
        """True when nothing else ran at any moment of the run that `ticket` began."""
        with self._lock:
            self._active.discard(ticket)
            if ticket in self._predicted:
                now = time.monotonic()
                busy = now - self._mark
                weight = math.exp(-busy / PACE_TAU_S)
                self._busy_s = self._busy_s * weight + busy
                self._done_s = self._done_s * weight + self._predicted.pop(ticket)
                self._mark = now
            if ticket in self._shared:
                self._shared.discard(ticket)
                return False
            return True

    def forget(self) -> None:
        """What was measured so far (and the prior) dropped: warm-up's probe replaces it."""
        with self._lock:
            self._busy_s = self._done_s = 0.0

    @property
    def pace(self) -> float:
        """Predicted seconds worked off a second of computing, recently (1 until measured; at
        most 1, so that admission never promises more than the predictions add up to)."""
        with self._lock:
            rate = self._done_s / self._busy_s if self._busy_s > 0 else 1.0
        return min(1.0, max(PACE_FLOOR, rate))

    def describe(self) -> dict[str, float]:
        """The figures /info shows."""
        with self._lock:
            busy, done = self._busy_s, self._done_s
        return {"pace": round(self.pace, 4), "busy_s": round(busy, 6), "done_s": round(done, 6)}

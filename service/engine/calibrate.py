"""Calibration: a serving session timed at a few batch shapes, up to the longest it serves.

Warm-up runs it for each session before the server says ready (service/registry.py), through
the very function its batcher calls, on the batcher's own thread (the long lane's runs at its
low priority, with its one thread). Shapes go from the cheapest up: one sequence at lengths
doubling from 8 to the longest, and a full batch of each length (bounded in tokens: the cost is
linear in rows past a few), and 4 and 16 of them between: the cost a token is not the same at
every batch size. A shape the samples so far predict past what is left of the budget is skipped,
so a model whose longest input takes longer than the budget is fitted below it and extrapolated
(its n² term measured on the lengths that fit); its served batches refine the fit later. A
shared machine has bursts in which every run is slower (2x was seen on a 2-core VM): a shape
whose time is off the fit of all of them by a fifth or more is timed once more, and its faster
time kept.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import numpy as np

from service.engine.cost import Sample, fit
from service.tensors import Batch

log = logging.getLogger(__name__)

# A calibration batch holds at most this many padded tokens (its time is linear in rows past a
# few: measuring the full 16,384 would add seconds to every start for no better fit).
BATCH_TOKENS = 4096
ROWS = (1, 4, 16)
# A shape is run until this many seconds of it are timed (at most REPEATS runs: a few ms runs
# jitter by a third on a shared machine, their median does not); the first run of a shape is
# left out when there are more (allocations the next runs do not pay).
SHAPE_S = 0.2
REPEATS = 8
OUTLIER = 0.2  # off the fit by this share: timed again
# Before anything is timed, the first shape runs untimed this long: the first runs after a
# quiet spell are slower (short shapes by a quarter: threads and caches cold).
SPIN_UP_S = 0.2
# A thread that serves, not times, needs only its first few runs behind it before ready.
THREAD_SPIN_UP_S = 0.05


def shapes(longest: int, max_rows: int, shortest: int = 8) -> list[tuple[int, int]]:
    """(rows, n) to time, cheapest first: one sequence, a few and a full batch at each length."""
    lengths: list[int] = []
    n = max(1, min(shortest, longest))
    while n < longest:
        lengths.append(n)
        n *= 2
    lengths.append(longest)
    out = set()
    for n in lengths:
        full = min(max_rows, max(1, BATCH_TOKENS // n))
        out |= {(rows, n) for rows in ROWS if rows <= full}
        out.add((full, n))
    return sorted(out, key=lambda s: (s[0] * s[1], s[1]))


def spin_up(
    run: Callable[[Batch], object],
    shape: tuple[int, int],
    token_id: int,
    clock: Callable[[], float] = time.perf_counter,
    seconds: float = SPIN_UP_S,
) -> float:
    """`shape` run untimed for about `seconds` on the calling thread; the seconds it took.

    ONNX Runtime's first runs on a thread new to a session took 3x the steady time (15 vs
    4.6 ms, three or four runs: the caller's own buffers), and OpenVINO makes an infer request
    per thread: every thread that will call a session runs it here first, before ready."""
    ids = np.full(shape, token_id, dtype=np.int64)
    batch = Batch(ids, np.ones_like(ids))
    spent = 0.0
    while spent < seconds:
        started = clock()
        run(batch)
        spent += clock() - started
    return spent


def measure(
    run: Callable[[Batch], object],
    plan: list[tuple[int, int]],
    token_id: int,
    budget_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Sample]:
    """Each shape of `plan` timed (synthetic ids), within about budget_s in all."""

    def timed(rows: int, n: int) -> tuple[float, float]:
        """The shape's time (median of its runs) and the seconds its runs took."""
        ids = np.full((rows, n), token_id, dtype=np.int64)
        batch = Batch(ids, np.ones_like(ids))
        times: list[float] = []
        while len(times) < REPEATS and sum(times) < SHAPE_S:
            started = clock()
            run(batch)
            times.append(clock() - started)
        return statistics.median(times[1:] if len(times) > 1 else times), sum(times)

    samples: list[Sample] = []
    spent = spin_up(run, plan[0], token_id, clock) if plan else 0.0
    for rows, n in plan:
        if len(samples) >= 2:
            ahead = fit(samples).seconds(rows, n)
            if spent + ahead > budget_s:
                log.info("calibration: (%d, %d) skipped (about %.1f s, past the budget)", rows, n, ahead)
                continue
        seconds, took = timed(rows, n)
        spent += took
        samples.append(Sample(rows, n, seconds))
    if len(samples) < 4:
        return samples
    f = fit(samples)
    for i, s in enumerate(samples):  # a burst of the machine's, or the shape's own cost?
        predicted = f.seconds(s.rows, s.n)
        if abs(s.seconds / predicted - 1) >= OUTLIER and spent + predicted <= budget_s * 1.25:
            again, took = timed(s.rows, s.n)
            spent += took
            samples[i] = Sample(s.rows, s.n, min(s.seconds, again))
    return samples

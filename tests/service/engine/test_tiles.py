"""The length OpenVINO runs a batch at (service/engine/tiles.py): the threshold read from the
start's timings, and the lengths it gives."""

from __future__ import annotations

import pytest

from service.engine.tiles import TILE, Padding, measure, threshold


def sawtooth(n: int, rows: int = 8) -> float:
    """AMX-like: a full tile costs its tokens; a tail past it costs three times as much each."""
    full, extra = divmod(n, TILE)
    return rows * (full * TILE + 3 * extra) * 1e-5


def linear(n: int, rows: int = 8) -> float:
    return rows * n * 1e-5


def test_a_sawtooth_pads_from_the_least_remainder_that_ran_slower_than_the_full_tile():
    ms = {n: sawtooth(n) for n in range(TILE + 1, 2 * TILE + 1)}
    # 16 + 3e: slower than 32 once 3e > 16, so from e = 6.
    assert threshold(ms) == 6


def test_times_that_follow_the_tokens_pad_nothing():
    assert threshold({n: linear(n) for n in range(TILE + 1, 2 * TILE + 1)}) is None


def test_within_the_margin_is_a_tie_and_pads_nothing():
    ms = {n: linear(n) for n in range(TILE + 1, 2 * TILE + 1)}
    ms[2 * TILE - 1] = ms[2 * TILE] * 1.01
    assert threshold(ms) is None
    ms[2 * TILE - 1] = ms[2 * TILE] * 1.05
    assert threshold(ms) == TILE - 1


def test_each_length_is_the_best_of_its_passes():
    """A moment's noise (the second pass's 31 tokens) is left out: the best pass counts."""
    calls: dict[tuple[int, int], int] = {}

    def time_of(rows: int, n: int) -> float:
        calls[rows, n] = calls.get((rows, n), 0) + 1
        noisy = n == 31 and calls[rows, n] == 2
        return linear(n, rows) * (3 if noisy else 1)

    padding = measure(time_of)
    assert (padding.rows, padding.row) == (None, None)
    assert padding.measured_ms[8][31] == pytest.approx(8 * 31 * 1e-2)


def test_a_remainder_that_ran_faster_stops_the_search_from_the_top():
    ms = {n: sawtooth(n) for n in range(TILE + 1, 2 * TILE + 1)}
    ms[TILE + 12] = ms[2 * TILE] * 0.9  # noise, or a kernel that likes 28: keep 28 and below
    assert threshold(ms) == 13
    ms[2 * TILE - 1] = ms[2 * TILE]  # the longest remainder no slower: nothing is padded
    assert threshold(ms) is None


def test_measure_times_each_length_past_a_tile_for_batches_and_for_a_text_alone():
    asked = []

    def time_of(rows: int, n: int) -> float:
        asked.append((rows, n))
        return sawtooth(n, rows) if rows > 1 else linear(n, rows)

    padding = measure(time_of)
    assert sorted(asked) == sorted((r, n) for r in (8, 1) for n in range(17, 33) for _ in (1, 2))
    assert (padding.rows, padding.row) == (6, None)
    assert "from 6 tokens past one" in padding.reason
    assert "a text alone at their own length" in padding.reason
    assert padding.describe()["measured_ms"]["8"]["32"] == pytest.approx(8 * 32 * 1e-2)


@pytest.mark.parametrize(
    ("rows", "n", "length"),
    [
        (8, 9, 9),  # within the first tile: never padded
        (8, 16, 16),
        (8, 21, 21),  # 5 past a tile: under the threshold
        (8, 22, 32),  # 6 past: up to the next multiple
        (8, 31, 32),
        (8, 32, 32),
        (8, 70, 80),
        (8, 66, 66),
        (1, 31, 31),  # one text alone: its own threshold (none here)
        (2, 31, 32),
    ],
)
def test_the_length_a_batch_runs_at(rows, n, length):
    assert Padding(rows=6, row=None).length(rows, n) == length


def test_never_pads():
    assert Padding().length(8, 31) == 31 and Padding().length(1, 31) == 31


def test_never_past_the_models_positions():
    assert Padding(rows=6).length(8, 508, most=512) == 512
    assert Padding(rows=6).length(8, 505, most=510) == 505  # 512 would run off its positions

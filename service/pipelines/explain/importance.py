"""Importance from what the graph gave for a text whole (row 0) and with each part left out (a
row each): the change in the output the request explains."""

from __future__ import annotations

import numpy as np

from service.tensors import cosines


def _whole(rows: np.ndarray, count: int) -> np.ndarray:
    return np.repeat(rows[:1], count, 0)


def of_embedding(rows: np.ndarray) -> np.ndarray:
    """1 - cos(e(text), e(text without the part)), per part."""
    return 1 - cosines(_whole(rows, len(rows) - 1), rows[1:])


def of_similarity(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """cos(a, b), and per part of each side the cosine lost without it."""
    whole = float(cosines(a[:1], b[:1])[0])
    without_a = cosines(a[1:], _whole(b, len(a) - 1))
    without_b = cosines(_whole(a, len(b) - 1), b[1:])
    return whole, whole - without_a, whole - without_b


def of_score(scores: np.ndarray) -> tuple[float, np.ndarray]:
    """The score of the whole text, and per part the score lost without it."""
    return float(scores[0]), scores[0] - scores[1:]

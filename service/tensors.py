"""Numeric helpers that export, service and bench share: padding a batch, cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token-id sequences -> input_ids, attention_mask, both (B, N) int64."""
    n = max(len(s) for s in sequences)
    ids = np.full((len(sequences), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), n), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def pad_types(sequences: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """Right-pad token-type-id sequences to `width` with 0 -> (B, N) int64."""
    out = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = seq
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays, in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)

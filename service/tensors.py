"""Numeric helpers that export, service and bench share: padding a batch, cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def pad_batch(
    sequences: Sequence[Sequence[int]],
    pad_id: int = 0,
    masks: Sequence[Sequence[int] | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token-id sequences -> input_ids, attention_mask, both (B, N) int64.

    masks: a sequence's own mask (same length as its ids; a 0 inside leaves that token out:
    it is neither attended to nor pooled), or None: all ones."""
    n = max(len(s) for s in sequences)
    ids = np.full((len(sequences), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), n), dtype=np.int64)
    own = masks if masks is not None else [None] * len(sequences)
    for row, (seq, m) in enumerate(zip(sequences, own, strict=True)):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1 if m is None else m
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
    out: np.ndarray = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)
    return out


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    out: np.ndarray = vectors / np.maximum(norms, 1e-12)
    return out


@dataclass(frozen=True)
class Batch:
    """A padded batch, named as the graphs name their inputs; token types only for pairs."""

    input_ids: np.ndarray  # (B, N) int64
    attention_mask: np.ndarray  # (B, N) int64, 1 = real token
    token_type_ids: np.ndarray | None = None  # (B, N) int64
    head_gates: np.ndarray | None = None  # (B, L, h) float32, the attention graph's; None: ones
    # An image batch's pixels (B, C, H, W) float32 (a vision tower's graphs); its ids are then
    # placeholders, one per token the tower runs (what its cost is counted in).
    pixel_values: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        sequences: Sequence[Sequence[int]],
        pad_id: int = 0,
        types: Sequence[Sequence[int] | None] | None = None,
        masks: Sequence[Sequence[int] | None] | None = None,
        gates: Sequence[np.ndarray | None] | None = None,
        pixels: Sequence[np.ndarray | None] | None = None,
    ) -> Batch:
        """gates: a sequence's head gates (L, h), None: ones (every head); pixels: an image's
        (C, H, W) pixel values, for a vision tower's batch."""
        ids, mask = pad_batch(sequences, pad_id, masks)
        type_ids = None
        if types is not None and any(t is not None for t in types):
            type_ids = pad_types([t or () for t in types], ids.shape[1])
        head_gates = None
        given = [g for g in gates or () if g is not None]
        if given:
            head_gates = np.ones((len(sequences), *given[0].shape), dtype=np.float32)
            for row, g in enumerate(gates or ()):
                if g is not None:
                    head_gates[row] = g
        pixel_values = None
        if pixels is not None and any(p is not None for p in pixels):
            if any(p is None for p in pixels):
                raise ValueError("an image batch needs every row's pixels")
            pixel_values = np.stack([p for p in pixels if p is not None])  # (B, C, H, W)
            pixel_values = pixel_values.astype(np.float32, copy=False)
        return cls(ids, mask, type_ids, head_gates, pixel_values)

    def feeds(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The arrays a graph with these input names takes (types default to zeros), and the
        head gates when there are any (the attention graph's input with a default)."""
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if "token_type_ids" in names:
            types = self.token_type_ids
            out["token_type_ids"] = types if types is not None else np.zeros_like(self.input_ids)
        if "pixel_values" in names:
            if self.pixel_values is None:
                raise ValueError("a vision graph's batch needs pixel_values")
            out["pixel_values"] = self.pixel_values
        feeds = {name: out[name] for name in names}
        if self.head_gates is not None:
            feeds["head_gates"] = self.head_gates
        return feeds

    def __len__(self) -> int:
        return len(self.input_ids)

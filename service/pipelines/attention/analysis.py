"""What the heads look at, from softmax probabilities: per-head statistics and token importance.

Maps here are one text's, unpadded: (L, h, n, n), rows summing to 1.
"""

from __future__ import annotations

import numpy as np


def head_stats(
    maps: np.ndarray, cls_index: int | None, sep_index: int | None
) -> dict[str, np.ndarray]:
    """Per (layer, head), averaged over query rows; maps (L, h, n, n) -> each stat (L, h).

    One layer at a time: float64 temporaries of a whole 256-token map set are hundreds of MB.
    """
    per_layer = [_layer_stats(layer, cls_index, sep_index) for layer in maps]
    return {k: np.stack([s[k] for s in per_layer]) for k in per_layer[0]}


def _layer_stats(
    maps: np.ndarray, cls_index: int | None, sep_index: int | None
) -> dict[str, np.ndarray]:
    """maps (h, n, n) -> each stat (h,)."""
    n = maps.shape[-1]
    p = maps.astype(np.float64)
    entropy = -(p * np.log(np.clip(p, 1e-12, None))).sum(-1).mean(-1)
    positions = np.arange(n)
    distance = np.abs(positions[:, None] - positions[None, :])  # (n, n), |q - k|
    zeros = np.zeros(p.shape[:1])
    return {
        "entropy": entropy,
        "max_weight": p.max(-1).mean(-1),
        "cls_mass": p[..., cls_index].mean(-1) if cls_index is not None else zeros,
        "sep_mass": p[..., sep_index].mean(-1) if sep_index is not None else zeros,
        "mean_distance": (p * distance).sum(-1).mean(-1),
        "diagonal_mass": np.diagonal(p, axis1=-2, axis2=-1).mean(-1),
    }


def cls_importance(maps: np.ndarray, cls_index: int = 0) -> np.ndarray:
    """Attention from [CLS] to each token, last layer, averaged over heads -> (n,)."""
    return np.asarray(maps[-1, :, cls_index, :].mean(0))


def rollout_matrix(maps: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): (0.5·mean_h A_l + 0.5·I), multiplied over
    layers, rows renormalised -> (n, n), row i: how token i's last vector mixes the inputs."""
    n = maps.shape[-1]
    joint = np.eye(n)
    for layer in maps.astype(np.float64):
        a = 0.5 * layer.mean(0) + 0.5 * np.eye(n)
        a = a / a.sum(-1, keepdims=True)
        joint = a @ joint
    return joint


def rollout(maps: np.ndarray, cls_index: int = 0) -> np.ndarray:
    """The rollout's [CLS] row -> (n,), summing to 1."""
    return np.asarray(rollout_matrix(maps)[cls_index])

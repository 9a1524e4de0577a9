"""Rotary position embedding (RoPE, Su et al. 2021): position enters q and k as a rotation.

Pairs of a head's channels (i, i + r/2) are rotated by the angle m·θ_i at position m, with
θ_i = theta^(-2i/r), i = 0 … r/2 - 1, so that q_m · k_n depends only on m - n:

    rope(x)_m = x_m ⊙ cos(m θ) + rotate_half(x_m) ⊙ sin(m θ),   rotate_half([a, b]) = [-b, a]

Partial rotary (NomicBERT's `rotary_emb_fraction`): only the first r = fraction · d_k channels
rotate; the rest pass through unchanged.

Dynamic NTK scaling (NomicBERT's `rotary_scaling_factor`, transformers' rope_type "dynamic"):
past the trained length L, an input of N tokens uses the larger base

    theta' = theta · max(1, factor · N / L - (factor - 1)) ^ (r / (r - 2))

which equals theta up to N = L. N is read from a tensor, not Python, so an exported graph
recomputes it for every input length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_dim(d_k: int, fraction: float) -> int:
    """How many of a head's channels rotate: an even number, at most d_k."""
    r = int(d_k * fraction)
    if r % 2 or not 0 < r <= d_k:
        raise ValueError(f"rotary dimension {r} (d_k {d_k} × {fraction}) must be even and > 0")
    return r


def inverse_frequencies(theta: Tensor | float, r: int) -> Tensor:
    """θ_i = theta^(-2i/r) for i = 0 … r/2 - 1  ->  (r/2,) (or (…, r/2) for a tensor theta)."""
    exponent = torch.arange(0, r, 2, dtype=torch.float32) / r  # (r/2,)
    if isinstance(theta, Tensor):
        return 1.0 / (theta[..., None] ** exponent)
    return 1.0 / (theta**exponent)


def rotary_tables(
    n: int,
    r: int,
    theta: float,
    device: torch.device,
    scaling_factor: float = 0.0,
    trained_length: int = 0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of m·θ for positions m = 0 … N-1: two (N, r) tables (halves repeated)."""
    position = torch.arange(n, device=device)  # (N,)
    if scaling_factor:
        length = (position[-1:] + 1).float()  # (1,): N, as a tensor
        stretch = (scaling_factor * length / trained_length - (scaling_factor - 1)).clamp(min=1.0)
        inv_freq = inverse_frequencies(theta * stretch ** (r / (r - 2)), r)[0]  # (r/2,)
    else:
        inv_freq = inverse_frequencies(theta, r)  # (r/2,)
    angles = position.float()[:, None] * inv_freq.to(device)[None, :]  # (N, r/2)
    angles = torch.cat((angles, angles), dim=-1)  # (N, r): channel i and i + r/2 share θ_i
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    """[a, b] -> [-b, a] on the last axis, halves a and b."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first r channels of every head: x (B, h, N, d_k), cos/sin (N, r)."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]  # (B, h, N, r), (B, h, N, d_k - r)
    rot = rot * cos + rotate_half(rot) * sin  # (B, h, N, r)
    return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot  # (B, h, N, d_k)

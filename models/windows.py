"""Local attention: query i sees only the keys within `window` positions on either side.

    allowed(i, j) = |i - j| <= window

`window` is the half-width. The checkpoints state a full width: ModernBERT's
`local_attention` (128 -> 64 on each side) and a bidirectional Gemma 3's `sliding_window`
(512 -> 256), both halved by integer division, as transformers does.

The band is additive, like the padding mask, and added to it: 0 inside, 2 · MASK_VALUE
outside. exp(MASK_VALUE + s) already underflows to exactly 0 in float32 for any realistic
score s, so a query puts exactly zero probability outside its window. Twice the padding's value
keeps that true even for a padding query whose window holds only padding keys: its weight stays
on those keys (MASK_VALUE) rather than leaking to real keys outside (2 · MASK_VALUE), and the
row stays finite. In float16 the sum with padding, -30000, is still representable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.attention import MASK_VALUE


def window_mask(n: int, window: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Additive (1, 1, N, N) band: 0 where |i - j| <= window, 2 · MASK_VALUE elsewhere."""
    position = torch.arange(n, device=device)  # (N,)
    distance = (position[None, :] - position[:, None]).abs()  # (N_q, N_k)
    return (distance > window).to(dtype)[None, None] * (2 * MASK_VALUE)  # (1, 1, N, N)

"""Normalisation of a token's vector: LayerNorm (BERT) and RMSNorm (Gemma, Llama-style).

    LayerNorm(x) = (x - mean(x)) / √(var(x) + ε) · w (+ b)
    RMSNorm(x)   = x / √(mean(x²) + ε) · w                  ("rms")
    Gemma's      = x / √(mean(x²) + ε) · (1 + w)            ("rms_offset": w is stored around 0)

RMSNorm is computed in float32 whatever the input's dtype, as both references do.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

NormKind = Literal["layer", "rms", "rms_offset"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset  # Gemma: scale by (1 + w), so a zero weight is the identity
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # (…, d), unit RMS
        scale = 1.0 + self.weight.float() if self.offset else self.weight.float()
        return (h * scale).type_as(x)


def make_norm(kind: NormKind, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """The norm a config asks for; `bias` only applies to LayerNorm (ModernBERT has none)."""
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind in ("rms", "rms_offset"):
        return RMSNorm(dim, eps=eps, offset=kind == "rms_offset")
    raise ValueError(f"unknown norm kind {kind!r}")

"""Position-wise feed-forward networks: the plain GELU FFN and the gated ones (GLU variants,
Shazeer 2020).

    gelu:        FFN(x) = W_2 · GELU(W_1 x)                       (BERT)
    gelu_tanh:   the same with GELU's tanh approximation          (SigLIP)
    quick_gelu:  the same with x · σ(1.702 x)                      (CLIP)
    geglu:       FFN(x) = W_down · (GELU(W_gate x) ⊙ W_up x)      (ModernBERT)
    geglu_tanh:  the same with GELU's tanh approximation          (Gemma: gelu_pytorch_tanh)
    swiglu:      FFN(x) = W_down · (SiLU(W_gate x) ⊙ W_up x)      (NomicBERT, Qwen3)

The gate is the branch that goes through the activation. Checkpoints that store gate and up as
one tensor (ModernBERT's Wi: [gate; up]) are split on load (models/families/).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FFNKind = Literal["gelu", "gelu_tanh", "quick_gelu", "geglu", "geglu_tanh", "swiglu"]


def quick_gelu(x: Tensor) -> Tensor:
    """CLIP's approximation of GELU: x · σ(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


# The plain FFN's activation, by kind; and the gated FFNs' (the gate's).
PLAIN: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "quick_gelu": quick_gelu,
}
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "geglu": F.gelu,
    "geglu_tanh": partial(F.gelu, approximate="tanh"),
    "swiglu": F.silu,
}


class FeedForward(nn.Module):
    """act(x W_1 + b_1) W_2 + b_2, act GELU unless told (CLIP's quick GELU, SigLIP's tanh)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = True, kind: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = PLAIN[kind]

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.act(self.fc1(x)))  # (B, N, d)
        return out


class GatedFeedForward(nn.Module):
    """act(x W_gate) ⊙ (x W_up), then W_down: (B, N, d) -> (B, N, d_ff) -> (B, N, d)."""

    def __init__(self, d_model: int, d_ff: int, kind: FFNKind, bias: bool = True) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[kind]

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(self.act(self.gate(x)) * self.up(x))  # (B, N, d)
        return out


def make_ffn(kind: FFNKind, d_model: int, d_ff: int, bias: bool = True) -> nn.Module:
    if kind in PLAIN:
        return FeedForward(d_model, d_ff, bias, kind)
    if kind in ACTIVATIONS:
        return GatedFeedForward(d_model, d_ff, kind, bias)
    raise ValueError(f"unknown FFN kind {kind!r}")

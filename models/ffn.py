"""Position-wise feed-forward networks: the plain GELU FFN and the gated ones (GLU variants,
Shazeer 2020).

    gelu:        FFN(x) = W_2 · GELU(W_1 x)                       (BERT)
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

import torch.nn.functional as F
from torch import Tensor, nn

FFNKind = Literal["gelu", "geglu", "geglu_tanh", "swiglu"]
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "geglu": F.gelu,
    "geglu_tanh": partial(F.gelu, approximate="tanh"),
    "swiglu": F.silu,
}


class FeedForward(nn.Module):
    """GELU(x W_1 + b_1) W_2 + b_2."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(F.gelu(self.fc1(x)))  # (B, N, d)
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
    if kind == "gelu":
        return FeedForward(d_model, d_ff, bias)
    if kind in ACTIVATIONS:
        return GatedFeedForward(d_model, d_ff, kind, bias)
    raise ValueError(f"unknown FFN kind {kind!r}")
